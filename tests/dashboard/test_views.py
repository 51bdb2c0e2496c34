"""The dashboard's pure helpers: the diff, trajectories (native and text tool calls), the chart, durations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.web import views


def test_parse_diff_numbers_lines_and_counts_per_file() -> None:
    patch = "\n".join(
        [
            "diff --git a/src/a.py b/src/a.py",
            "index 1..2 100644",
            "--- a/src/a.py",
            "+++ b/src/a.py",
            "@@ -10,3 +10,4 @@ def f():",
            " keep",
            "-old",
            "+new",
            "+added",
            " tail",
            "\\ No newline at end of file",
            "diff --git a/new.txt b/new.txt",
            "new file mode 100644",
            "--- /dev/null",
            "+++ b/new.txt",
            "@@ -0,0 +1 @@",
            "+hello",
        ]
    )
    first, second = views.parse_diff(patch)
    assert (first.path, first.added, first.removed, first.status) == ("src/a.py", 2, 1, "modified")
    kinds = [(line.kind, line.old, line.new, line.text) for line in first.lines]
    assert kinds[:6] == [
        ("hunk", None, None, "@@ -10,3 +10,4 @@ def f():"),
        ("ctx", 10, 10, "keep"),
        ("del", 11, None, "old"),
        ("add", None, 11, "new"),
        ("add", None, 12, "added"),
        ("ctx", 12, 13, "tail"),
    ]
    assert (second.path, second.status, second.added) == ("new.txt", "added", 1)
    assert views.parse_diff("") == [] and views.parse_diff(None) == []


def test_parse_diff_reads_quoted_names_binary_mode_and_rename_sections_and_plain_diffs() -> None:
    patch = "\n".join(
        [
            'diff --git "a/t\\303\\251st file.bin" "b/t\\303\\251st file.bin"',
            "new file mode 100644",
            "index 0000000..e69de29",
            "GIT binary patch",
            "literal 3",
            "KcmZQz00000",
            "",
            "diff --git a/run.sh b/run.sh",
            "old mode 100644",
            "new mode 100755",
            "diff --git a/old name.py b/new name.py",
            "similarity index 100%",
            "rename from old name.py",
            "rename to new name.py",
            'diff --git a/gone.py "b/gone.py"',
            "deleted file mode 100644",
            "--- a/gone.py",
            "+++ /dev/null",
            "@@ -1 +0,0 @@",
            "-x",
        ]
    )
    binary, mode, renamed, gone = views.parse_diff(patch)
    assert (binary.path, binary.status, binary.added, binary.removed) == ("tést file.bin", "added", 0, 0)
    assert [line.kind for line in binary.lines] == ["meta"] * 5 and binary.lines[1].text == "GIT binary patch"
    assert (mode.path, mode.status, [line.text for line in mode.lines]) == (
        "run.sh", "modified", ["old mode 100644", "new mode 100755"],
    )
    assert (renamed.path, renamed.status) == ("new name.py", "renamed")
    assert (gone.path, gone.status, gone.removed) == ("gone.py", "deleted", 1)
    assert [(line.kind, line.old, line.text) for line in gone.lines] == [
        ("meta", None, "deleted file mode 100644"), ("hunk", None, "@@ -1 +0,0 @@"), ("del", 1, "x"),
    ]
    plain = views.parse_diff("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b")
    assert [(f.path, f.added, f.removed) for f in plain] == [("x.py", 1, 1)]


def test_a_trajectory_with_text_tool_calls_and_unanswered_calls() -> None:
    document = {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": "<tool_call>\n<function=Edit>\n<parameter=file_path>\ncalc.py\n"
             "</parameter>\n<parameter=old_string>\na - b\n</parameter>\n</function>\n</tool_call>"},
            {"role": "tool", "tool_call_id": "call_text_1_0", "content": "Edited calc.py"},
            {"role": "assistant", "content": None, "reasoning_content": "think",
             "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "Bash", "arguments": "not json"}}]},
        ],
        "steps": [
            {"step": 0, "tool_calls": [{"id": "call_text_1_0", "name": "Edit", "source": "text", "seconds": 0.5}]},
            {"step": 1, "tool_calls": [{"id": "c2", "name": "Bash", "rejected": True}]},
        ],
        "exit_reason": None,
        "partial": True,
    }
    view = views.build_trajectory(document)
    assert view.system_prompt == "sys" and view.task == "task" and view.partial
    edit = view.steps[0].calls[0]
    assert (edit.name, edit.source, edit.output, edit.seconds) == ("Edit", "text", "Edited calc.py", 0.5)
    assert edit.arguments == [("file_path", "calc.py"), ("old_string", "a - b")] and edit.headline == "calc.py"
    bash = view.steps[1].calls[0]
    assert bash.raw_arguments == "not json" and bash.rejected and bash.output is None
    assert views.current_step(view) == {"number": 2, "calls": [{"name": "Bash", "headline": ""}]}


def test_trajectory_files_must_be_inside_the_data_folder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "trajectories").mkdir(parents=True)
    good = data / "trajectories" / "t.json"
    good.write_text(json.dumps({"messages": [], "steps": []}))
    assert views.load_trajectory(str(good), data).steps == []
    (tmp_path / "secret.json").write_text("{}")
    link = data / "trajectories" / "link.json"
    link.symlink_to(tmp_path / "secret.json")
    for path in (str(tmp_path / "secret.json"), str(link), str(data / "../secret.json"), None, str(data / "none")):
        with pytest.raises(views.TrajectoryUnavailable):
            views.load_trajectory(path, data)
    broken = data / "trajectories" / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(views.TrajectoryUnavailable, match="could not be read"):
        views.load_trajectory(str(broken), data)


def test_the_chart_is_plain_svg_with_one_segment_per_outcome() -> None:
    svg = str(views.jobs_per_day_svg([("2026-11-28", {"done": 3, "failed": 1}), ("2026-11-29", {"running": 2})]))
    assert svg.startswith("<svg") and svg.endswith("</svg>") and "<script" not in svg
    assert svg.count('class="bar s-done"') == 1 and svg.count('class="bar s-active"') == 1
    assert "2026-11-28: 3 done" in svg and "11-29" in svg
    assert "<rect" not in str(views.jobs_per_day_svg([("2026-11-29", {})]))


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "—"), (0.04, "0.0 s"), (4.26, "4.3 s"), (42, "42 s"), (185, "3 min 05 s"), (7620, "2 h 07 min"),
     (3 * 86400 + 4 * 3600, "3 d 4 h")],
)
def test_durations_read_short(seconds: float | None, text: str) -> None:
    assert views.fmt_duration(seconds) == text


def test_only_http_links_are_linked() -> None:
    assert views.http_url("https://git.example/a") == "https://git.example/a"
    assert views.http_url("javascript:alert(1)") is None and views.http_url(None) is None
