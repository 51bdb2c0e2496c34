"""The results channel (sandbox/runner.py) and its checks (worker/attempts/run_checks.py), on real pytest.

The plugin (worker/attempts/evidence_plugin.py) runs under the checkout's pytest and under Debian's (an older
one, which the local sandbox's system python3 has), through a real pipe the runner reads; the checks
are pure functions of what arrived, the log and the exit code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sandbox import runner
from worker.attempts.evidence import RUNNER_GUARD
from worker.attempts.run_checks import (
    PLUGIN_MODULE,
    check_run,
    direct_runner,
    new_sentinels,
    plugin_source,
    summary_counts,
)

TESTS = '''import pytest


class TestGroup:
    class TestInner:
        def test_nested(self):
            pass

    def test_fails(self):
        assert 1 == 2


@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n == 1


@pytest.mark.skip(reason="later")
def test_skipped():
    pass


@pytest.mark.xfail(reason="known")
def test_known():
    assert False


@pytest.fixture
def broken():
    raise RuntimeError("setup")


def test_setup_error(broken):
    pass
'''
PREFIX = "pkg/tests/test_cases.py::"
EXPECTED = {
    PREFIX + "TestGroup::TestInner::test_nested": "passed",
    PREFIX + "TestGroup::test_fails": "failed",
    PREFIX + "test_param[1]": "passed",
    PREFIX + "test_param[2]": "failed",
    PREFIX + "test_skipped": "skipped",
    PREFIX + "test_known": "skipped",
    PREFIX + "test_setup_error": "error",
}
PYTHONS = [sys.executable] + (["/usr/bin/python3"] if Path("/usr/bin/python3").exists() else [])


def pytest_of(python: str) -> bool:
    import subprocess

    return subprocess.run([python, "-c", "import pytest"], capture_output=True, check=False).returncode == 0


def run_with_channel(
    tmp_path: Path, python: str, args: str, monkeypatch: pytest.MonkeyPatch,
    sentinels: dict[str, str] | None = None, plugin: bool = True,
) -> tuple[dict, dict[str, str]]:
    """`python -m pytest ARGS` in tmp_path with FrogFix's guard and plugin, as a verification run starts it."""
    sentinels = new_sentinels() if sentinels is None else sentinels
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(RUNNER_GUARD)
    (hook / f"{PLUGIN_MODULE}.py").write_text(plugin_source(sentinels))
    monkeypatch.setenv("PYTHONPATH", str(hook))
    monkeypatch.setenv("PYTHONSAFEPATH", "1")
    monkeypatch.setenv("PYTEST_ADDOPTS", f"-p {PLUGIN_MODULE} -p no:cacheprovider" if plugin else "-p no:cacheprovider")
    reply = runner.run_command(runner._Spawner(), str(tmp_path), f"{python} -m pytest {args}", 300, 1 << 20, 1 << 20)
    return reply, sentinels


def project(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "tests").mkdir(parents=True)
    (tmp_path / "pkg" / "tests" / "test_cases.py").write_text(TESTS)


@pytest.mark.parametrize("python", PYTHONS)
def test_each_result_arrives_with_pytest_s_own_node_id_and_the_sentinels_count_nowhere(
    tmp_path: Path, python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not pytest_of(python):
        pytest.fail(f"{python} has no pytest: install.sh installs python3-pytest for the local sandbox")
    project(tmp_path)
    reply, sentinels = run_with_channel(tmp_path, python, "-q pkg", monkeypatch)
    command = f"{python} -m pytest -q pkg"
    check = check_run(reply["results"], reply["log"], reply["exit_code"], False, command, sentinels)
    assert check.tests == EXPECTED and not check.tampered and not check.unavailable, (check, reply["log"][-2000:])
    records = [json.loads(line) for line in reply["results"].splitlines()]
    ran = {r["name"]: r["outcome"] for r in records if r["k"] == "sentinel"}
    assert ran == {n: "passed" if e == "pass" else "failed" for n, e in sentinels.items()}
    # Nothing of the sentinels shows to a user: not in the log, the counts, or the exit code.
    assert not any(name in reply["log"] for name in sentinels), reply["log"][-2000:]
    assert summary_counts(reply["log"]) == {"failed": 2, "passed": 2, "skipped": 1, "xfailed": 1, "error": 1}
    assert reply["exit_code"] == 1
    plain, _ = run_with_channel(tmp_path, python, "-q pkg", monkeypatch, plugin=False)
    assert summary_counts(plain["log"]) == summary_counts(reply["log"]) and plain["exit_code"] == 1


@pytest.mark.parametrize("python", PYTHONS)
def test_x_k_and_a_no_test_run_are_unavailable_checks_never_forgery(
    tmp_path: Path, python: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    project(tmp_path)
    reply, sentinels = run_with_channel(tmp_path, python, "-q -x pkg", monkeypatch)
    check = check_run(reply["results"], reply["log"], reply["exit_code"], False, f"{python} -m pytest -q -x pkg",
                      sentinels)
    assert reply["exit_code"] == 1 and not check.tampered, check
    assert check.unavailable == ["sentinels: the run stopped before they all ran"]
    first = {PREFIX + "TestGroup::TestInner::test_nested": "passed", PREFIX + "TestGroup::test_fails": "failed"}
    assert check.tests == first
    reply, sentinels = run_with_channel(tmp_path, python, "-q -k nested pkg", monkeypatch)
    check = check_run(reply["results"], reply["log"], reply["exit_code"], False, "pytest -q -k nested pkg", sentinels)
    assert reply["exit_code"] == 0 and not check.tampered and not check.unavailable, check
    reply, sentinels = run_with_channel(tmp_path, python, "-q -k nothing_matches pkg", monkeypatch)
    check = check_run(reply["results"], reply["log"], reply["exit_code"], False, "pytest -q -k x pkg", sentinels)
    assert reply["exit_code"] == 5 and not check.tampered, check  # exit 5 stays the project's own
    assert check.unavailable == ["sentinels: no test was collected"]


def test_what_a_leftover_writes_after_the_command_is_never_read(tmp_path: Path) -> None:
    """The channel is read while the command runs and once more when it ended; a background child
    that keeps it open and writes later is not waited for, and its words are not in the reply."""
    command = "printf 'one\\n' >&$FROGFIX_RESULTS_FD; "
    command += "(sleep 3; printf 'late\\n' >&$FROGFIX_RESULTS_FD) >/dev/null 2>&1 & exit 0"
    reply = runner.run_command(runner._Spawner(), str(tmp_path), command, 60, 10_000, 10_000)
    assert reply["results"] == "one\n" and reply["exit_code"] == 0 and not reply["timed_out"]
    over = runner.run_command(runner._Spawner(), str(tmp_path), "head -c 5000 /dev/zero >&$FROGFIX_RESULTS_FD", 60,
                              10_000, 100)
    assert over["results_overflow"] and over["results"] == ""
    plain = runner.run_command(runner._Spawner(), str(tmp_path), "echo ${FROGFIX_RESULTS_FD:-none}", 60, 10_000)
    assert plain["log"] == "none\n" and "results" not in plain


def line(kind: str, n: int, **fields: object) -> str:
    return json.dumps({"k": kind, "n": n, **fields})


def honest(sentinels: dict[str, str], exitstatus: int = 1) -> list[str]:
    names = list(sentinels)
    return [
        line("start", 1), line("planted", 2, names=names),
        line("sentinel", 3, name=names[0], outcome="passed"), line("sentinel", 4, name=names[1], outcome="failed"),
        line("test", 5, id="t.py::a", when="call", outcome="passed", cat="passed", counted=True),
        line("test", 6, id="t.py::b", when="call", outcome="failed", cat="failed", counted=True),
        line("sentinel", 7, name=names[2], outcome="passed"), line("sentinel", 8, name=names[3], outcome="failed"),
        line("end", 9, exitstatus=exitstatus, stopped=False),
    ]


LOG = "..F\n1 failed, 1 passed in 0.03s\n"


def renumber(lines: list[str]) -> list[str]:
    """The lines in the plugin's own numbering, as a forger that knows it would write them."""
    return [json.dumps({**json.loads(x), "n": i}) for i, x in enumerate(lines, 1)]


def checked(lines: list[str], log: str = LOG, code: int | None = 1, command: str = "pytest -q",
            sentinels: dict[str, str] | None = None, timed_out: bool = False) -> tuple[str, list[str]]:
    check = check_run("\n".join(lines) + "\n", log, code, timed_out, command, sentinels or SENTINELS)
    return check.tampered, check.unavailable


SENTINELS = {"test_aa": "pass", "test_bb": "fail", "test_cc": "pass", "test_dd": "fail"}


def test_an_honest_stream_agrees_with_itself() -> None:
    check = check_run("\n".join(honest(SENTINELS)) + "\n", LOG, 1, False, "pytest -q", SENTINELS)
    assert check.tests == {"t.py::a": "passed", "t.py::b": "failed"} and not check.tampered and not check.unavailable


@pytest.mark.parametrize(("change", "found"), [
    (lambda s: [*s[:2], line("sentinel", 3, name="test_aa", outcome="passed"),
                line("sentinel", 4, name="test_bb", outcome="passed"), *s[4:]], "must fail was reported passed"),
    (lambda s: [*s[:2], line("sentinel", 3, name="test_aa", outcome="failed"), *s[3:]],
     "must pass was reported failed"),
    (lambda s: renumber([*s[:6], *s[8:]]), "taken out of a run"),
    (lambda s: [*s, line("test", 10, id="t.py::b", when="call", outcome="passed", cat="passed", counted=True)],
     "after the pytest session had ended"),
    (lambda s: [*s[:5], "1 passed", *s[5:]], "did not write"),
    (lambda s: [s[0], s[2], s[1], *s[3:]], "out of order"),
    (lambda s: [*s[:1], line("planted", 2, names=["test_zz"]), *s[2:]], "not the ones FrogFix named"),
    (lambda s: renumber([*s[:4], line("sentinel", 0, name="test_aa", outcome="passed"), *s[4:]]), "did not ask for"),
])
def test_each_disagreement_in_the_stream_is_forgery(change, found: str) -> None:  # type: ignore[no-untyped-def]
    tampered, _ = checked(change(honest(SENTINELS)))
    assert found in tampered, tampered


def test_the_summary_line_and_the_exit_code_must_agree_with_the_results() -> None:
    assert "summary line says 2 passed" in checked(honest(SENTINELS), log="..F\n2 passed in 0.03s\n")[0]
    # a forged line printed early, then pytest's own: the last one counts, and it agrees
    assert checked(honest(SENTINELS), log="3 passed in 0.01s\n..F\n= 1 failed, 1 passed in 0.03s =\n")[0] == ""
    assert checked(honest(SENTINELS), log="\x1b[31m1 failed\x1b[0m, \x1b[32m1 passed\x1b[0m in 0.03s\n")[0] == ""
    assert checked(honest(SENTINELS), log="no summary\n") == ("", ["summary line: none printed"])
    assert "exited 0 but its pytest session ended with 1" in checked(honest(SENTINELS), code=0)[0]
    assert checked(honest(SENTINELS), code=0, command="make test") == ("", [])  # a wrapper's exit code is its own
    never_ended = honest(SENTINELS)[:-1]
    assert "never finished" in checked(never_ended, code=0)[0]
    tampered, unavailable = checked(never_ended, code=-11)  # a crash is a failure, not a forgery
    assert tampered == "" and any("never finished" in note for note in unavailable)
    assert check_run("\n".join(never_ended) + "\n", LOG, -11, False, "pytest", SENTINELS).tests is None
    assert checked(never_ended, code=None, timed_out=True)[0] == ""


def test_no_session_means_no_per_test_results_and_an_overflow_is_forgery() -> None:
    check = check_run("", "ok\n", 0, False, "npm test", SENTINELS)
    assert check.tests is None and not check.tampered and check.unavailable
    assert "more than" in check_run(None, "", 0, False, "pytest", SENTINELS).tampered


def test_only_pytest_itself_is_a_direct_runner() -> None:
    for command in ("pytest", "pytest -q tests", "python3 -m pytest -q", "/usr/bin/python3.11 -m pytest",
                    "PYTHONHASHSEED=0 pytest -x", "py.test"):
        assert direct_runner(command), command
    for command in ("make test", "pytest || true", "cd src && pytest", "python3 runtests.py", "tox -e py",
                    "python3 -m unittest", "pytest; echo done", "pytest $(cat args)", ""):
        assert not direct_runner(command), command

