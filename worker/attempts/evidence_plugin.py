"""FrogFix's pytest plugin, run inside the sandbox by every verification run (never imported by FrogFix).

Why it exists: the code under review runs inside the test process and can rewrite what pytest
reports (a report file, the summary line, the exit code). This plugin sends each result out of
the process as the test ends, on the results channel the sandbox runner reads (sandbox/runner.py,
FROGFIX_RESULTS_FD), and runs FrogFix's sentinels: test items no patch can predict, one that must
pass and one that must fail, at the start and at the end of the run, run without being logged so
they count nowhere a user looks (not in the summary, the exit code or -x's stop). The host
(worker/attempts/run_checks.py) believes only what arrived here while the command ran, and compares it with
the summary line and the exit code.

It is written into the sandbox's hook folder with SENTINELS filled in, imported by the runner guard
(worker/attempts/evidence.py) before the working tree is on sys.path, and named to pytest with `-p`. It runs
under any pytest from 6 on, so it uses only hooks and attributes every one of them has. The marker
PYTEST_DONT_REWRITE keeps pytest from warning that it was imported before it could rewrite its asserts.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

SENTINELS: dict[str, str] = {}  # name -> "pass" or "fail"; filled in per run by worker/attempts/run_checks.py
_state: dict[str, Any] = {}


def _take_channel() -> int | None:
    """The channel's descriptor, taken at import (before any project code ran) and out of the environment."""
    value = os.environ.pop("FROGFIX_RESULTS_FD", "")
    try:
        fd = int(value)
        os.fstat(fd)
    except (ValueError, OSError):
        return None
    os.set_inheritable(fd, False)  # the tests' own subprocesses never get it
    return fd


_CHANNEL = _take_channel()


def _send(kind: str, **fields: Any) -> None:
    fd = _CHANNEL if _state.get("config") is not None else None
    if fd is None:
        return
    _state["n"] = _state.get("n", 0) + 1
    data = (json.dumps({"k": kind, "n": _state["n"], **fields}, separators=(",", ":")) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        _state["config"] = None  # the channel is gone; the host sees the stream end early


def _mine(config: Any) -> bool:
    return _state.get("config") is config


class FrogFixSentinel(pytest.Item):
    """A check FrogFix adds: it must pass or must fail, whatever the code under test is."""

    def runtest(self) -> None:
        if SENTINELS.get(self.name) == "fail":
            raise AssertionError("FrogFix sentinel: this check fails on purpose")

    def reportinfo(self) -> Any:
        return getattr(self, "path", None) or self.fspath, None, self.name


@pytest.hookimpl(trylast=True)
def pytest_configure(config: Any) -> None:
    if _CHANNEL is None or "config" in _state or hasattr(config, "workerinput"):
        return  # one session per process (an inner pytester run is not ours), never an xdist worker
    _state["config"] = config
    _send("start", pytest=getattr(pytest, "__version__", "?"), pid=os.getpid())


def pytest_sessionstart(session: Any) -> None:
    if _mine(session.config):
        _state["session"] = session


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: Any) -> None:
    """The sentinels go in after every plugin chose and ordered the items (-k, --lf, random order)."""
    config = session.config
    if not _mine(config) or not SENTINELS:
        return
    why = ""
    if config.pluginmanager.hasplugin("dsession"):
        why = "the tests run in pytest-xdist workers"
    elif getattr(config.option, "collectonly", False):
        why = "the run only collects"
    elif not session.items:
        why = "no test was collected"
    if why:
        _send("planted", names=[], why=why)
        return
    made = {name: FrogFixSentinel.from_parent(session, name=name) for name in SENTINELS}
    names = list(made)
    half = len(names) // 2
    # A new list: the collected count pytest prints and exits 5 on stays the project's own.
    session.items = [*(made[n] for n in names[:half]), *session.items, *(made[n] for n in names[half:])]
    _send("planted", names=names)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    if not isinstance(item, FrogFixSentinel):
        return None
    from _pytest.runner import runtestprotocol

    reports = runtestprotocol(item, log=False, nextitem=nextitem)
    outcome = "passed"
    for report in reports:
        if report.failed:
            outcome = "failed"
        elif report.skipped and outcome == "passed":
            outcome = "skipped"
    _send("sentinel", name=item.name, outcome=outcome)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: Any) -> None:
    config = _state.get("config")
    if config is None:
        return
    status = config.hook.pytest_report_teststatus(report=report, config=config)
    category = status[0] if isinstance(status, (tuple, list)) and status else ""
    _send(
        "test", id=report.nodeid, when=report.when, outcome=report.outcome, xfail=hasattr(report, "wasxfail"),
        cat=category if isinstance(category, str) else "", counted=bool(getattr(report, "count_towards_summary", True)),
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collectreport(report: Any) -> None:
    if _state.get("config") is not None and (report.failed or report.skipped):
        _send("collect", id=report.nodeid, outcome=report.outcome)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: Any) -> None:
    """The session's exit status as pytest will return it: after every sessionfinish hook."""
    if not _mine(config):
        return
    session = _state.get("session")
    status = getattr(session, "exitstatus", None)
    stopped = bool(getattr(session, "shouldstop", False) or getattr(session, "shouldfail", False))
    _send("end", exitstatus=None if status is None else int(status), stopped=stopped)
    _state["config"] = None
