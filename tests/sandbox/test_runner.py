"""The runner on its own: its JSON-lines protocol, its bounded capture, and its own path checks.

These run the runner in-process or as a plain subprocess (no bubblewrap), so they also cover the
runner's defences on their own, without the kernel's.
"""

from __future__ import annotations

import glob
import io
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sandbox.runner as runner_module
from sandbox.runner import HeadTail, Prefix, Server, Tools, bash_timeout, truncate
from tests.sandbox.support import git, init_repo

RUNNER = runner_module.__file__
LINE_TEXT = st.lists(st.sampled_from([*"ab é\n\r\t\x0c\u2028", "\r\n"]), max_size=150).map("".join)


# --------------------------------------------------------------------------------- protocol


def replies(lines: list[bytes], root: Path) -> list[dict[str, object]]:
    out = io.BytesIO()
    Server(str(root)).serve(io.BytesIO(b"".join(lines)), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_malformed_lines_get_error_replies_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hi\n")
    got = replies(
        [
            b"not json\n",
            b"[1, 2]\n",
            b"\n",
            b'{"id": 1}\n',
            b'{"id": 2, "op": "dance"}\n',
            b'{"id": 3, "op": "tool"}\n',
            b'{"id": 4, "op": "tool", "name": "Read", "arguments": [1]}\n',
            b'{"id": 5, "op": "exec", "command": ""}\n',
            b'{"id": 6, "op": "patch"}\n',
            b"\xff\xfe\n",
            b'{"id": 7, "op": "tool", "name": "Read", "arguments": {"file_path": "a.txt"}}\n',
            b'{"id": 8, "op": "tool", "name": "Read", "arguments": "{\\"file_path\\": \\"a.txt\\"}"}\n',
            b'{"id": 9, "op": "ping"}\n',
        ],
        tmp_path,
    )
    assert [r["id"] for r in got] == [None, None, 1, 2, 3, 4, 5, 6, None, 7, 8, 9]
    assert [r["ok"] for r in got] == [False, False, False, False, False, True, False, False, False, True, True, True]
    assert str(got[0]["error"]).startswith("bad request: not JSON")
    assert got[3]["error"] == "ValueError: bad request: unknown op 'dance'"
    assert got[5]["output"] == "ValueError: arguments must be a JSON object"
    assert got[9]["output"] == got[10]["output"] == "a.txt\n1. hi"
    assert got[11]["pong"] is True


def test_runner_process_survives_garbage_and_shuts_down(tmp_path: Path) -> None:
    lines = b'garbage\n{"id": 1, "op": "ping"}\n{"id": 2, "op": "shutdown"}\n{"id": 3, "op": "ping"}\n'
    done = subprocess.run(
        [sys.executable, "-I", "-S", RUNNER, "--root", str(tmp_path)],
        input=lines,
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0
    got = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["ok"] for r in got] == [False, True, True]  # nothing answered after shutdown


def test_exec_merges_streams_and_bounds_the_log(tmp_path: Path) -> None:
    request = {"id": 1, "op": "exec", "command": "echo out; echo err >&2; seq 1 100000; exit 4", "log_limit": 900}
    (reply,) = replies([json.dumps(request).encode() + b"\n"], tmp_path)
    assert reply["exit_code"] == 4 and reply["timed_out"] is False
    log = str(reply["log"])
    assert log.startswith("out\nerr\n1\n2\n") and log.endswith("99999\n100000\n")
    assert "chars omitted ...]" in log and len(log) < 1000
    request = {"id": 2, "op": "exec", "command": "echo hi; sleep 10", "timeout": 0.3}
    (reply,) = replies([json.dumps(request).encode() + b"\n"], tmp_path)
    assert reply["timed_out"] is True and reply["log"] == "hi\n"


def test_patch_rejects_option_like_base(tmp_path: Path) -> None:
    (reply,) = replies([b'{"id": 1, "op": "patch", "base": "--output=/etc/x"}\n'], tmp_path)
    assert reply["ok"] is False and "bad base commit" in str(reply["error"])


def test_error_replies_carry_a_code(tmp_path: Path) -> None:
    """Callers act on `code`, never on the text; the text stays `<builtin kind>: <message>`."""
    init_repo(tmp_path, {"a.txt": "a\n"})
    base = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "big.txt").write_text("x" * 5000)
    got = replies(
        [
            b"not json\n",
            b'{"id": 1, "op": "dance"}\n',
            b'{"id": 2, "op": "exec", "command": "true", "timeout": "soon"}\n',
            b'{"id": 3, "op": "patch", "base": "--output=/etc/x"}\n',
            json.dumps({"id": 4, "op": "patch", "base": base, "max_bytes": 1000}).encode() + b"\n",
            b'{"id": 5, "op": "patch", "base": "0000000000000000000000000000000000000000"}\n',
            json.dumps({"id": 6, "op": "patch", "base": base}).encode() + b"\n",
        ],
        tmp_path,
    )
    assert [r.get("code") for r in got] == [
        "bad_request",
        "bad_request",
        "bad_request",
        "bad_request",
        "patch_too_large",
        "git_failed",
        None,
    ]
    assert got[2]["error"] == "ValueError: timeout must be a number, got 'soon'"
    assert got[4] == {
        "id": 4,
        "ok": False,
        "code": "patch_too_large",
        "error": "ValueError: the patch is larger than 1000 bytes",
    }
    assert str(got[5]["error"]).startswith("RuntimeError: git diff failed")
    assert got[6]["ok"] is True and got[6]["size"] > 5000


# ------------------------------------------------------------------- the runner's own checks


def test_write_and_edit_refuse_targets_outside_the_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "ws", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    secret = outside / "host.txt"
    secret.write_text("HOST-SECRET\n")
    (root / "link.txt").symlink_to(secret)
    (root / "linkdir").symlink_to(outside)
    tools = Tools(str(root))
    attempts = [
        ("Write", {"file_path": "link.txt", "content": "PWNED"}),
        ("Write", {"file_path": "linkdir/new.txt", "content": "PWNED"}),
        ("Write", {"file_path": "linkdir/../escape.txt", "content": "PWNED"}),
        ("Write", {"file_path": "../escape.txt", "content": "PWNED"}),
        ("Write", {"file_path": str(outside / "abs.txt"), "content": "PWNED"}),
        ("Edit", {"file_path": "link.txt", "old_string": "HOST", "new_string": "PWNED"}),
        ("Edit", {"file_path": "linkdir/host.txt", "old_string": "HOST", "new_string": "PWNED"}),
    ]
    for name, args in attempts:
        out = tools.call(name, args)
        assert out.startswith("PermissionError: ") and "is outside the workspace" in out, out
    assert tools.call("Write", {"file_path": "link.txt", "content": "x"}) == (
        f"PermissionError: link.txt is outside the workspace (it resolves to {secret}); only files in it can be written"
    )
    assert secret.read_text() == "HOST-SECRET\n"
    assert sorted(p.name for p in outside.iterdir()) == ["host.txt"]
    assert not (tmp_path / "escape.txt").exists()
    # A symlink that stays inside is fine.
    (root / "real.txt").write_text("a\n")
    (root / "alias.txt").symlink_to("real.txt")
    assert tools.call("Edit", {"file_path": "alias.txt", "old_string": "a", "new_string": "b"}) == (
        "Edited alias.txt (1 replacement)."
    )
    assert (root / "real.txt").read_text() == "b\n"


def test_special_files_are_refused_instead_of_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    tools = Tools(str(tmp_path))
    assert tools.call("Read", {"file_path": "fifo"}) == "OSError: [Errno 22] Not a regular file: 'fifo'"
    assert tools.call("Read", {"file_path": "/dev/zero"}) == "OSError: [Errno 22] Not a regular file: '/dev/zero'"
    assert tools.call("Write", {"file_path": "fifo", "content": "x"}) == (
        "OSError: [Errno 22] Not a regular file: 'fifo'"
    )


# ------------------------------------------------------------------- formats, as properties


@settings(max_examples=150, deadline=None)
@given(text=LINE_TEXT, offset=st.integers(-2, 12), limit=st.integers(-1, 12), cut=st.integers(10, 120))
def test_read_matches_leaf_for_any_text(
    tmp_path_factory: pytest.TempPathFactory, text: str, offset: int, limit: int, cut: int
) -> None:
    root = tmp_path_factory.mktemp("read")
    (root / "f.txt").write_bytes(text.encode())
    lines = text.splitlines()
    first = max(1, offset)
    end = len(lines) if limit <= 0 else min(len(lines), first - 1 + limit)
    full = "f.txt\n" + "\n".join(f"{n}. {line}" for n, line in enumerate(lines[first - 1 : end], start=first))
    out = Tools(str(root), read_limit=cut).call("Read", {"file_path": "f.txt", "offset": offset, "limit": limit})
    assert out == truncate(full, cut)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=400), keep=st.integers(0, 50), chunk=st.integers(1, 17))
def test_prefix_counts_exactly_whatever_the_chunking(data: bytes, keep: int, chunk: int) -> None:
    prefix = Prefix(2 * keep + 2)
    for start in range(0, len(data), chunk):
        prefix.feed(data[start : start + chunk])
    prefix.feed(b"", True)
    raw = data.decode("utf-8", "replace")
    translated = raw.replace("\r\n", "\n").replace("\r", "\n")
    for translate, whole in ((False, raw), (True, translated)):
        kept, total = prefix.result(translate)
        assert total == len(whole)
        assert whole.startswith(kept[:keep]) and len(kept) >= min(keep, len(whole))


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=600), limit=st.integers(64, 200), chunk=st.integers(1, 50))
def test_head_tail_keeps_both_ends(text: str, limit: int, chunk: int) -> None:
    log = HeadTail(limit)
    data = text.encode()
    for start in range(0, len(data), chunk):
        log.feed(data[start : start + chunk])
    log.feed(b"", True)
    whole = text.replace("\r\n", "\n").replace("\r", "\n")
    out = log.result()
    if len(whole) <= limit:
        assert out == whole
    else:
        head, rest = out.split("\n[... ", 1)
        omitted, tail = rest.split(" chars omitted ...]\n", 1)
        assert whole.startswith(head) and whole.endswith(tail)
        assert len(head) + int(omitted) + len(tail) == len(whole)


def test_bash_timeout_rules() -> None:
    assert bash_timeout({}) == 120.0
    assert bash_timeout({"timeout": 30}) == 30.0
    assert bash_timeout({"timeout": 1000}) == 1000.0
    assert bash_timeout({"timeout": 1500}) == 1.5
    assert bash_timeout({"timeout": "2.5"}) == 2.5
    assert bash_timeout({"timeout": 5, "timeout_ms": 250}) == 0.25
    assert bash_timeout({"timeout": -3}) == 0.1
    for non_finite in ("nan", "inf", "-Infinity", float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout must be a finite number"):
            bash_timeout({"timeout": non_finite})
    with pytest.raises(ValueError, match="timeout_ms must be a finite number"):
        bash_timeout({"timeout_ms": float("inf")})


def test_runner_imports_on_old_pythons(tmp_path: Path) -> None:
    """The runner runs under the target image's python3; keep it importable on 3.8+."""
    candidates = ["/usr/bin/python3"]
    for minor in (8, 9, 10):
        candidates += glob.glob(f"/usr/bin/python3.{minor}") + glob.glob(f"/usr/local/bin/python3.{minor}")
        candidates += glob.glob(f"{pwd.getpwuid(os.getuid()).pw_dir}/.pyenv/versions/3.{minor}.*/bin/python3")
    ran = 0
    for python in candidates:
        if not os.access(python, os.X_OK):
            continue
        done = subprocess.run(
            [python, "-I", "-S", RUNNER, "--root", str(tmp_path)],
            input=b'{"id": 1, "op": "tool", "name": "Bash", "arguments": {"command": "echo hi"}}\n',
            capture_output=True,
            timeout=30,
        )
        assert json.loads(done.stdout)["output"] == "Exit code: 0\nSTDOUT:\nhi\n\nSTDERR:\n", python
        ran += 1
    if not ran:
        pytest.skip("no other python3 here")
