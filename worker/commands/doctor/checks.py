"""The doctor's runner: each group of checks runs in a thread with a deadline (results.py: what a line is)."""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.redaction import SecretRedactor
from app.settings import Settings
from worker.commands.doctor import attestation, forges, mirror, model, npm_mirror, sandboxes, system
from worker.commands.doctor.results import CheckResult, DoctorOptions, failed

GroupFn = Callable[[Settings, DoctorOptions], list[CheckResult]]


@dataclass(frozen=True)
class Group:
    """Checks that run one after another (later ones depend on earlier), under one deadline."""

    name: str  # the line reported when the whole group runs out of time or crashes
    timeout_s: float
    run: GroupFn
    fix: str  # what to look at when the group hangs


def default_groups(settings: Settings) -> list[Group]:
    """Every group, in report order; the sandbox group follows FROGFIX_SANDBOX."""

    sandbox_group = (
        Group("sandbox.kubernetes", 90, sandboxes.check_kubernetes, "check that the Kubernetes API answers")
        if settings.sandbox == "kubernetes"
        else Group("sandbox.local", 90, sandboxes.check_local, "check that bwrap can start (try `bwrap --version`)")
    )
    return [
        Group("database", 20, system.check_database, "check that the database server answers"),
        Group("broker", 15, system.check_broker, "check that the broker (Redis) answers"),
        Group("gitlab", 60, forges.check_gitlab, "check that FROGFIX_GITLAB_URL answers"),
        Group("gitea", 60, forges.check_gitea, "check that FROGFIX_GITEA_URL answers"),
        Group("model", 120, model.check_model, "check that FROGFIX_MODEL_BASE_URL answers"),
        sandbox_group,
        Group("mirror", 30, mirror.check_mirror, "check that FROGFIX_PIP_INDEX_URL answers"),
        Group("npm mirror", 40, npm_mirror.check_npm_mirror, "check that FROGFIX_NPM_REGISTRY_URL answers"),
        Group("disk", 15, system.check_disk, "check that the data and workspace folders' file systems answer"),
        Group("metrics", 5, system.check_metrics_token, "check FROGFIX_METRICS_TOKEN"),
        Group("evidence", 15, system.check_evidence_bound, "check that `prlimit --version` answers"),
        Group("git", 10, system.check_git, "check that `git --version` answers"),
        Group("attestation", 10, attestation.check_attestation, "check FROGFIX_ATTESTATION_KEY's file"),
    ]


def _run_group(group: Group, settings: Settings, options: DoctorOptions, out: queue.Queue[list[CheckResult]]) -> None:
    try:
        out.put(group.run(settings, options))
    except Exception as exc:  # a check's own bug or an unforeseen error: a failed line, never a traceback
        detail = f"the check itself failed: {type(exc).__name__}: {exc}"
        out.put([failed(group.name, detail, group.fix)])


def run_doctor(
    settings: Settings, options: DoctorOptions | None = None, groups: Sequence[Group] | None = None
) -> list[CheckResult]:
    """Run every group at once (each in a daemon thread) and collect their lines in report order.

    A group that has not answered by its deadline is reported as failed and left behind: its
    thread is a daemon, so it cannot keep doctor from exiting.
    """
    opts = options or DoctorOptions()
    chosen = list(groups) if groups is not None else default_groups(settings)
    boxes: list[queue.Queue[list[CheckResult]]] = []
    for group in chosen:
        box: queue.Queue[list[CheckResult]] = queue.Queue(maxsize=1)
        threading.Thread(
            target=_run_group, args=(group, settings, opts, box), name=f"doctor-{group.name}", daemon=True
        ).start()
        boxes.append(box)
    results: list[CheckResult] = []
    started = time.monotonic()
    for group, box in zip(chosen, boxes, strict=True):
        left = max(0.0, group.timeout_s - (time.monotonic() - started))
        try:
            results.extend(box.get(timeout=left))
        except queue.Empty:
            detail = f"no answer within {group.timeout_s:g} s"
            results.append(failed(group.name, detail, group.fix))
    return _scrubbed(results, settings.secret_values())


# `scheme://user:password@` in any URL: the password is never shown, whichever setting held it.
URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^/\s@]*@")


def _scrubbed(results: list[CheckResult], secrets: list[str]) -> list[CheckResult]:
    """No configured secret reaches the report, whatever a server echoed back."""
    redactor = SecretRedactor(secrets)

    def scrub(text: str) -> str:
        text = URL_PASSWORD.sub(r"\1***@", redactor.redact(text))  # a password written into any URL setting
        return " ".join(text.split())

    return [
        CheckResult(r.name, r.outcome, scrub(r.detail), scrub(r.fix), r.severity) for r in results
    ]


def exit_code(results: Sequence[CheckResult]) -> int:
    """1 exactly when a check failed (a `fail` of severity warning included); `warn` and `skip` lines do not count."""
    return 1 if any(r.outcome == "fail" for r in results) else 0


LABELS = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP", "warn": "WARN"}


def render_text(results: Sequence[CheckResult]) -> str:
    """One line a check (`FAIL name: detail; fix: ...`), then a one-line summary (warned only when any)."""
    lines = []
    for r in results:
        level = " (warning)" if r.outcome == "fail" and r.severity == "warning" else ""
        line = f"{LABELS[r.outcome]} {r.name}{level}: {r.detail}"
        if r.outcome in ("fail", "warn") and r.fix:
            line += f"; fix: {r.fix}"
        lines.append(line)
    counts = {o: sum(1 for r in results if r.outcome == o) for o in ("pass", "fail", "skip", "warn")}
    warned_count = f", {counts['warn']} warned" if counts["warn"] else ""
    lines.append(f"{counts['pass']} passed, {counts['fail']} failed{warned_count}, {counts['skip']} skipped")
    return "\n".join(lines)
