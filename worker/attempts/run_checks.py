"""What a test run's own process reported, and whether its reports agree: the results channel, read.

The code under review runs inside the test process, so anything that process writes afterwards (a
report file, an exit handler's exit code, a summary line) is its word, not the runner's. FrogFix's
plugin (worker/attempts/evidence_plugin.py) sends each result out on the results channel as the test ends;
the sandbox runner keeps only what arrived while the command ran. Here the host reads those lines
and checks them against each other and against what the process showed:

- the sentinels: FrogFix's own test items, named at random per run, one pass and one fail at the
  start and at the end; one reported wrongly, or taken out of a run that was not stopped, is forgery;
- the summary line pytest printed last must match a session's own results;
- a test command that is pytest itself must exit with the status its session ended with, and a
  session that never ended cannot exit 0;
- nothing may follow a session's end, every line is the plugin's, in its own order.

Any disagreement is `tampered` (worker/attempts/evidence.py ranks it above every other level). A check that
cannot be made (another runner, pytest-xdist, -x stopped the run first, no summary printed) is
named in `unavailable`, never called forgery.

JavaScript runners (jest, vitest, mocha, `node --test`) send their sessions through FrogFix's preload
(worker/attempts/js_reporters/hook.cjs) on the same channel, in the same order: `case` lines per test,
sentinels only from mocha, no summary line compared; a direct runner may not exit 0 unless its
session ended with 0.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.runner import MAX_RESULTS_BYTES
from worker.attempts.js_runners import RUNNERS as JS_RUNNERS
from worker.attempts.js_runners import runner_of, through_node

PLUGIN_MODULE = "frogfix_results"
PLUGIN_SOURCE = Path(__file__).with_name("evidence_plugin.py").read_text(encoding="utf-8")
RESULTS_LIMIT = MAX_RESULTS_BYTES  # ask for all the runner keeps
MAX_TESTS = 200_000
# A JavaScript runner that ended failed with no failing test reported: one failure of its own stands for it.
OUTSIDE_TESTS = "::<the run failed outside its tests>"
# A test case's outcome, worst last: a case reported twice (a pass, then a teardown error) keeps the worst.
OUTCOME_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
# The summary line's counts that a session's own results must match (pytest's categories).
COMPARED = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
_SUMMARY = re.compile(
    r"^=*\s*(?P<parts>\d+ [a-z]+(?:, \d+ [a-z]+)*)(?: in [0-9.]+s(?: \([0-9:.]+\))?)?\s*=*\s*$"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RUNNERS = ("pytest", "py.test")
_SHELL = re.compile(r"[;&|`<>()$\n]")


def new_sentinels() -> dict[str, str]:
    """Four names no patch can predict: a pass and a fail for the start of the run, then for its end."""
    return {f"test_{secrets.token_hex(6)}": expect for expect in ("pass", "fail", "pass", "fail")}


def plugin_source(sentinels: Mapping[str, str]) -> str:
    """The plugin as written into the sandbox for one run, its sentinels filled in."""
    line = "SENTINELS: dict[str, str] = {}"
    assert line in PLUGIN_SOURCE
    return PLUGIN_SOURCE.replace(line, f"SENTINELS: dict[str, str] = {dict(sentinels)!r}", 1)


@dataclass
class RunCheck:
    """One run as its own reports show it: per-test outcomes, forgery found, checks that could not be made."""

    tests: dict[str, str] | None = None  # node id -> passed, skipped, failed or error
    tampered: str = ""  # how forgery was found; "" when none was
    unavailable: list[str] = field(default_factory=list)


@dataclass
class _Session:
    tests: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    planted: list[str] | None = None
    planted_why: str = ""
    sentinels: dict[str, str] = field(default_factory=dict)
    ended: bool = False
    exitstatus: int | None = None
    stopped: bool = False
    runner: str = "pytest"  # or one of the JavaScript runners (worker/attempts/js_reporters/hook.cjs)


class _Forged(Exception):
    """The channel's lines themselves are not the plugin's."""


def check_run(
    results: str | None,
    log: str,
    exit_code: int | None,
    timed_out: bool,
    command: str,
    sentinels: Mapping[str, str],
) -> RunCheck:
    """The run's per-test outcomes and the verdict of every check on it (see the module's docstring).

    `results`: the channel's text (None: it carried more than RESULTS_LIMIT); `command`: the test
    command as configured (its exit code is compared only when it is pytest itself)."""
    if results is None:
        return RunCheck(tampered=f"the results channel carried more than {RESULTS_LIMIT} bytes")
    try:
        sessions = _sessions(results, sentinels, cut_ok=timed_out)
    except _Forged as exc:
        return RunCheck(tampered=str(exc))
    if not sessions:
        return RunCheck(unavailable=[_no_session(command)])
    for session in sessions:
        failed = "failed" in session.tests.values()
        if session.runner != "pytest" and session.exitstatus not in (0, None) and not failed:
            session.tests[OUTSIDE_TESTS] = "failed"  # a crashed worker, an unhandled error: never an all-pass
    check = RunCheck(tests=_merged(sessions))
    if not timed_out and not all(s.ended for s in sessions):
        # A session that never ended sent only part of its results: nothing per test is believed from it.
        check.tests = None
        name = next(s.runner for s in sessions if not s.ended)
        check.unavailable.append(f"a {name} session never finished (exit {exit_code}): judged by exit codes")
    if check.tests is not None and len(check.tests) > MAX_TESTS:
        check.tests = None
        check.unavailable.append(f"more than {MAX_TESTS} tests: judged by exit codes")
    pytest = [s for s in sessions if s.runner == "pytest"]
    for verdict in (_sentinels(sessions, sentinels, timed_out), _summary(pytest, log)):
        check.tampered = check.tampered or verdict[0]
        check.unavailable += verdict[1]
    if not timed_out and not check.tampered:
        if any(s.runner != "pytest" for s in sessions):
            check.tampered, note = _js_exit_code(sessions, exit_code, command)
            check.unavailable += [note] if note else []
        else:
            check.tampered = _exit_code(sessions, exit_code, command)
    return check


def _no_session(command: str) -> str:
    """Why the channel carried no session: a runner started through node never gets it, another runner sends none."""
    direct = runner_of(command)
    if direct is not None:
        return f"no {direct} session on the results channel (a version FrogFix cannot read): judged by exit codes"
    runner = through_node(command)
    if runner is None:
        return "no pytest session reported on the results channel (another runner)"
    return (
        f"no test runner session on the results channel: the test command starts {runner} through node"
        " (npx, npm, a package manager or a script), which never passes the channel on: judged by exit codes"
    )


def _sessions(results: str, sentinels: Mapping[str, str], cut_ok: bool) -> list[_Session]:
    sessions: list[_Session] = []
    current: _Session | None = None
    expected = 0
    lines = results.split("\n")
    complete = lines[:-1]
    if lines[-1] and not cut_ok:
        raise _Forged("the results channel ended in the middle of a line")
    for line in complete:
        try:
            record = json.loads(line)
        except ValueError:
            raise _Forged("a line on the results channel that FrogFix's plugin did not write") from None
        if not isinstance(record, dict) or not isinstance(record.get("n"), int):
            raise _Forged("a line on the results channel that FrogFix's plugin did not write")
        kind = record.get("k")
        if kind == "start":
            current, expected = _Session(), 1
            sessions.append(current)
            if "runner" in record:
                if record["runner"] not in JS_RUNNERS:
                    raise _Forged("a line on the results channel that FrogFix's plugin did not write")
                current.runner = str(record["runner"])
        if current is None or record["n"] != expected:
            raise _Forged("the results channel's lines are out of order (another writer)")
        if current.ended:
            raise _Forged("a result arrived after the pytest session had ended")
        expected += 1
        _take(current, kind, record, sentinels)
    return sessions


def _take(session: _Session, kind: Any, record: dict[str, Any], sentinels: Mapping[str, str]) -> None:
    node = record.get("id")
    if kind == "test" and isinstance(node, str):
        outcome = _test_outcome(record)
        category, counted = record.get("cat"), record.get("counted") is True
        if isinstance(category, str) and category and counted:
            session.counts[category] = session.counts.get(category, 0) + 1
        if outcome is not None:
            _worst(session.tests, node, outcome)
    elif kind == "collect" and isinstance(node, str):
        outcome = "error" if record.get("outcome") == "failed" else "skipped"
        session.counts[outcome] = session.counts.get(outcome, 0) + 1
        _worst(session.tests, node, outcome)
    elif kind == "planted":
        names = record.get("names")
        if not isinstance(names, list) or (names and set(names) != set(sentinels)):
            raise _Forged("the sentinels in the run are not the ones FrogFix named")
        session.planted, session.planted_why = names, str(record.get("why") or "")
    elif kind == "sentinel":
        name, outcome = str(record.get("name")), record.get("outcome")
        if name not in sentinels or name in session.sentinels or not isinstance(outcome, str):
            raise _Forged("a sentinel result FrogFix did not ask for")
        session.sentinels[name] = outcome
    elif kind == "case" and session.runner != "pytest" and isinstance(node, str):
        outcome = record.get("outcome")
        if outcome not in ("passed", "failed", "skipped"):
            raise _Forged("a line on the results channel that FrogFix's preload did not write")
        _worst(session.tests, node, outcome)
    elif kind == "end":
        status = record.get("exitstatus")
        session.ended, session.stopped = True, bool(record.get("stopped"))
        session.exitstatus = status if isinstance(status, int) else None
    elif kind != "start":
        raise _Forged("a line on the results channel that FrogFix's plugin did not write")


def _test_outcome(record: Mapping[str, Any]) -> str | None:
    """A report's outcome as a test case's (JUnit's reading: an xfail is a skip, a setup failure an error)."""
    outcome, when = record.get("outcome"), record.get("when")
    if outcome == "skipped":
        return "skipped"
    if outcome == "failed":
        return "failed" if when == "call" else "error"
    if outcome == "passed" and when == "call":
        return "passed"
    return None  # a passed setup or teardown, a rerun (pytest-rerunfailures): the call's report decides


def _worst(tests: dict[str, str], node: str, outcome: str) -> None:
    if node not in tests or OUTCOME_RANK[outcome] > OUTCOME_RANK[tests[node]]:
        tests[node] = outcome


def _merged(sessions: list[_Session]) -> dict[str, str]:
    tests: dict[str, str] = {}
    for session in sessions:
        for node, outcome in session.tests.items():
            _worst(tests, node, outcome)
    return tests


def _sentinels(sessions: list[_Session], sentinels: Mapping[str, str], timed_out: bool) -> tuple[str, list[str]]:
    unavailable: list[str] = []
    for session in sessions:
        for name, outcome in session.sentinels.items():
            want = "passed" if sentinels[name] == "pass" else "failed"
            if outcome != want:
                return f"FrogFix's sentinel test that must {sentinels[name]} was reported {outcome}", []
        if session.planted is None:
            never = "pytest never finished collecting" if session.runner == "pytest" else f"{session.runner} never ran"
            unavailable.append(f"sentinels: {never}")
        elif not session.planted:
            unavailable.append(f"sentinels: {session.planted_why or 'not added'}")
        elif len(session.sentinels) < len(session.planted):
            status_ok = session.runner != "pytest" or session.exitstatus in (0, 1)  # pytest's 2: interrupted
            interrupted = not session.ended or session.stopped or not status_ok
            if not interrupted and not timed_out:
                return "FrogFix's sentinel tests were taken out of a run that was not stopped", []
            unavailable.append("sentinels: the run stopped before they all ran")
    return "", unavailable


def summary_counts(log: str) -> dict[str, int] | None:
    """The counts of the last summary line in `log` ("1 failed, 3 passed in 0.12s"), None when there is none."""
    for line in reversed(_ANSI.sub("", log).splitlines()):
        found = _SUMMARY.match(line.strip())
        if found and (" in " in line or line.strip().startswith("=")):
            counts: dict[str, int] = {}
            for part in found["parts"].split(", "):
                number, word = part.split(" ", 1)
                word = {"errors": "error", "warnings": "warning"}.get(word, word)
                counts[word] = counts.get(word, 0) + int(number)
            return counts
    return None


def _summary(sessions: list[_Session], log: str) -> tuple[str, list[str]]:
    ended = [s for s in sessions if s.ended]
    shown = summary_counts(log)
    if not ended or shown is None:
        return "", ["summary line: none printed"] if ended else []
    said = {key: shown.get(key, 0) for key in COMPARED}
    if any(said == {key: s.counts.get(key, 0) for key in COMPARED} for s in ended):
        return "", []
    own = {key: n for key, n in ended[-1].counts.items() if key in COMPARED and n}
    words = ", ".join(f"{n} {key}" for key, n in own.items()) or "no test"
    printed = ", ".join(f"{n} {key}" for key, n in said.items() if n) or "no test"
    return f"pytest's summary line says {printed}, but its results as they happened were {words}", []


def direct_runner(command: str) -> bool:
    """Whether the test command is pytest itself (`pytest …`, `python3 -m pytest …`) or a JavaScript runner FrogFix
    reads (jest, vitest, mocha, `node --test`), so its exit code is the runner's."""
    if not command or _SHELL.search(command):
        return False
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]
    if not words:
        return False
    program = words[0].rsplit("/", 1)[-1]
    if program in _RUNNERS or runner_of(command) is not None:
        return True
    return bool(re.fullmatch(r"python[0-9.]*", program)) and words[1:3] == ["-m", "pytest"]


def _exit_code(sessions: list[_Session], exit_code: int | None, command: str) -> str:
    if exit_code is None or not direct_runner(command) or len(sessions) != 1:
        return ""
    session = sessions[0]
    if not session.ended:  # pytest's own exit codes (0-5) come only from a session that finished
        own = 0 <= exit_code <= 5
        return f"the test command exited {exit_code} but its pytest session never finished" if own else ""
    if session.exitstatus is not None and session.exitstatus != exit_code:
        return f"the test command exited {exit_code} but its pytest session ended with {session.exitstatus}"
    return ""


def _js_exit_code(sessions: list[_Session], exit_code: int | None, command: str) -> tuple[str, str]:
    """(forgery, note): a JavaScript runner's command may not exit 0 unless its session ended with 0. A
    non-zero exit after a passing session is the project's own (coverage thresholds, open handles): noted."""
    runner = runner_of(command)
    if exit_code is None or runner is None or len(sessions) != 1 or sessions[0].runner != runner:
        return "", ""
    session = sessions[0]
    if not session.ended:
        never = f"the test command exited 0 but its {runner} session never finished"
        return (never, "") if exit_code == 0 else ("", "")
    if session.exitstatus is None or session.exitstatus == exit_code:
        return "", ""
    if exit_code == 0:
        return f"the test command exited 0 but its {runner} session ended with {session.exitstatus}", ""
    said = f"exit code: the test command exited {exit_code} after its {runner} session ended with {session.exitstatus}"
    return "", said
