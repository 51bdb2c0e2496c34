"""`manage.py fix REPO_DIR --issue FILE`: one job on a local checkout, without a forge.

Copy the committed checkout into a fresh workspace, run the Leaf loop in a sandbox, take the
patch, then run the test command in fresh sandboxes on the base commit and with the patch.
"""

from __future__ import annotations

import json
import secrets
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import git

from app.logs import SecretRedactor
from app.settings import Settings, get_settings
from sandbox.base import SandboxError
from worker.attempt import PatchTooLarge, TestRun, apply_patch, model_from, run_agent, run_tests, sampling_from
from worker.issue_text import sanitize_issue_text
from worker.leaf.loop import LeafResult, StepRecord
from worker.leaf.trajectory import TrajectoryWriter
from worker.repo_config import RepoConfig, RepoConfigError, load_repo_config, refusal_reasons, review_flags


class FixError(Exception):
    """The job cannot even start (bad repository or issue file); the message says why."""


@dataclass
class FixOutcome:
    job_id: str
    status: str  # fixed, no_fix, failed
    exit_reason: str
    steps: int
    patch: str
    test_command: str | None
    before: TestRun | None
    after: TestRun | None
    trajectory: str
    error: str | None = None
    flags: list[str] = field(default_factory=list)
    final_answer: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "exit_reason": self.exit_reason,
            "steps": self.steps,
            "patch": self.patch,
            "tests": {
                "command": self.test_command,
                "before": self.before.to_dict() if self.before else None,
                "after": self.after.to_dict() if self.after else None,
            },
            "trajectory": self.trajectory,
            "job_id": self.job_id,
            "error": self.error,
            "flags": self.flags,
            "summary": self.final_answer,
        }


def read_issue_file(path: Path) -> tuple[str, str]:
    """First non-empty line is the title (a leading `#` is dropped), the rest is the body."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FixError(f"cannot read the issue file {path}: {exc}") from exc
    lines = text.strip().splitlines()
    if not lines:
        raise FixError(f"the issue file {path} is empty; its first line is the title")
    return lines[0].lstrip("# ").strip(), "\n".join(lines[1:]).strip()


def clone_workspace(repo_dir: Path, dest: Path, base_commit: str) -> None:
    """A private copy at the base commit, with no remote: nothing in it points anywhere else."""
    git.Repo.clone_from(str(repo_dir), str(dest), no_hardlinks=True, no_checkout=True)
    repo = git.Repo(dest)
    repo.git.checkout("--detach", "--quiet", base_commit)
    repo.delete_remote(repo.remote("origin"))
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "FrogFix")
        cfg.set_value("user", "email", "frogfix@localhost")


class LocalFix:
    """One local job. Construct, then `run()`; progress lines go to `progress`."""

    def __init__(
        self,
        repo_dir: Path,
        title: str,
        body: str,
        *,
        settings: Settings | None = None,
        progress: TextIO | None = None,
        model: Any = None,
        job_id: str | None = None,
    ) -> None:
        self.settings = settings or get_settings()
        self.repo_dir = repo_dir.resolve()
        self.title, self.body = title, body
        self.progress = progress
        self.job_id = job_id or datetime.now(UTC).strftime("local-%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        self.root = self.settings.resolved_workspace_dir() / self.job_id
        self.trajectory_path = self.settings.data_dir / "trajectories" / f"{self.job_id}.json"
        self.redactor = SecretRedactor(self.settings.secret_values())
        self._model = model

    def say(self, message: str) -> None:
        if self.progress is not None:
            print(f"[frogfix {self.job_id}] {self.redactor.redact(message)}", file=self.progress, flush=True)

    def model(self) -> Any:
        if self._model is None:
            self._model = model_from(self.settings)
        return self._model

    def run(self) -> FixOutcome:
        try:
            repo = git.Repo(self.repo_dir)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
            raise FixError(f"{self.repo_dir} is not a git checkout") from exc
        try:
            base = repo.head.commit.hexsha
        except ValueError as exc:
            raise FixError(f"{self.repo_dir} has no commits yet") from exc
        if repo.is_dirty(untracked_files=True):
            self.say("note: uncommitted changes in the checkout are not part of the job (it starts from HEAD)")
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            return self._run(base)
        except git.GitCommandError as exc:  # e.g. an unusual checkout that cannot be cloned
            return self._failed(base, "git_error", f"git failed: {str(exc.stderr or exc).strip()[:500]}")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, base: str) -> FixOutcome:
        agent_ws = self.root / "agent"
        clone_workspace(self.repo_dir, agent_ws, base)
        self.say(f"workspace ready at base commit {base[:12]}")
        try:
            config = load_repo_config(agent_ws)
        except RepoConfigError as exc:
            return self._failed(base, "config_error", str(exc))
        self.say(f"test command: {config.test_command or '(none found)'} ({config.test_command_source})")

        writer = TrajectoryWriter(
            self.trajectory_path,
            job_id=self.job_id,
            model=self.settings.model_name,
            sampling=sampling_from(self.settings).body_fields(),
            base_commit=base,
            redact=self.redactor.redact,
            fields={"issue": {"title": self.title}, "repository": str(self.repo_dir)},
        )

        def on_step(record: StepRecord) -> None:
            names = ", ".join(c.name for c in record.calls) or "final answer"
            self.say(f"step {record.step + 1}: {names} (context {record.context_tokens} tokens)")

        if self._model is None:
            self.say(f"running the agent with {self.settings.model_name} at {self.settings.model_base_url}")
        else:
            self.say(f"running the agent with {type(self._model).__name__} (no model server)")
        try:
            result, patch = run_agent(
                agent_ws,
                base,
                settings=self.settings,
                model=self.model(),
                title=self.title,
                body=sanitize_issue_text(self.body),
                project=self.repo_dir.name,
                issue_number="",
                writer=writer,
                on_step=on_step,
            )
        except PatchTooLarge as exc:  # the model's changes are refused, as the pipeline refuses them
            self.say(f"no fix: {exc}")
            return FixOutcome(
                job_id=self.job_id,
                status="no_fix",
                exit_reason=exc.result.exit_reason,
                steps=exc.result.steps,
                patch="",
                test_command=config.test_command,
                before=None,
                after=None,
                trajectory=str(self.trajectory_path),
                error=str(exc),
                final_answer=exc.result.final_answer,
            )
        except SandboxError as exc:
            return self._failed(base, "tool_error", f"sandbox failure: {exc}", writer=writer)
        self.say(
            f"agent finished: {result.exit_reason} after {result.steps} steps; patch {len(patch.splitlines())} lines"
        )

        refused = refusal_reasons(patch, config, allow_binary=self.settings.allow_binary_patches)
        for reason in refused:
            self.say(f"refused: {reason}")
        before = after = None
        if config.test_command:
            before = self._tests(base, config, None, "before")
            if patch and not refused:
                after = self._tests(base, config, patch, "after")
        status = "no_fix" if refused else self._status(result, patch, after)
        outcome = FixOutcome(
            job_id=self.job_id,
            status=status,
            exit_reason=result.exit_reason,
            steps=result.steps,
            patch=patch,
            test_command=config.test_command,
            before=before,
            after=after,
            trajectory=str(self.trajectory_path),
            error="; ".join(refused) or result.error,
            flags=refused + [f for f in review_flags(patch, config) if f not in refused],
            final_answer=result.final_answer,
        )
        writer.finish(
            result,
            patch=patch,
            fields={"fix": {k: v for k, v in outcome.to_dict().items() if k not in ("patch", "trajectory")}},
        )
        return outcome

    @staticmethod
    def _status(result: LeafResult, patch: str, after: TestRun | None) -> str:
        if not patch:
            return "failed" if result.exit_reason in ("llm_query_error", "tool_error") else "no_fix"
        if after is None:  # no test command: a patch we could not verify is not a fix
            return "no_fix"
        return "fixed" if after.exit_code == 0 else "no_fix"

    def _tests(self, base: str, config: RepoConfig, patch: str | None, label: str) -> TestRun:
        ws = self.root / f"tests-{label}"
        clone_workspace(self.repo_dir, ws, base)
        if patch:
            problem = apply_patch(ws, patch, self.root)
            if problem:
                shutil.rmtree(ws, ignore_errors=True)
                return TestRun(None, problem)
        self.say(f"running the tests {label} the patch: {config.test_command}")
        run = run_tests(ws, config, self.settings, self.redactor.redact)
        self.say(f"tests {label}: exit code {run.exit_code}{' (timed out)' if run.timed_out else ''}")
        return run

    def _failed(
        self,
        base: str,
        reason: str,
        error: str,
        *,
        writer: TrajectoryWriter | None = None,
        result: LeafResult | None = None,
    ) -> FixOutcome:
        self.say(f"failed: {error}")
        return FixOutcome(
            job_id=self.job_id,
            status="failed",
            exit_reason=reason,
            steps=result.steps if result else 0,
            patch="",
            test_command=None,
            before=None,
            after=None,
            trajectory=str(self.trajectory_path) if writer else "",
            error=error,
        )


EXIT_CODES = {"fixed": 0, "no_fix": 1, "failed": 2}


def run_fix_command(repo_dir: Path, issue_file: Path, as_json: bool) -> int:
    """The CLI entry: progress on stderr; the JSON object (or a summary) on stdout."""
    try:
        title, body = read_issue_file(issue_file)
    except FixError as exc:
        print(f"frogfix fix: {exc}", file=sys.stderr)
        return 2
    return run_and_report(repo_dir, title, body, as_json)


def run_demo_command(as_json: bool) -> int:
    """A whole job on a generated repository with a replayed model (see worker/demo.py)."""
    import tempfile

    from worker.demo import ISSUE_BODY, ISSUE_TITLE, demo_model, make_sample_repo

    with tempfile.TemporaryDirectory(prefix="frogfix-demo-") as tmp:
        repo = make_sample_repo(Path(tmp))
        print(f"demo: a repository with a bug in add(), at {repo}; the model is a replay", file=sys.stderr)
        return run_and_report(repo, ISSUE_TITLE, ISSUE_BODY, as_json, model=demo_model())


def run_and_report(repo_dir: Path, title: str, body: str, as_json: bool, model: Any = None) -> int:
    from app.logs import configure_logging

    settings = get_settings()
    configure_logging("WARNING", settings.secret_values())
    started = time.monotonic()
    try:
        outcome = LocalFix(repo_dir, title, body, settings=settings, progress=sys.stderr, model=model).run()
    except FixError as exc:
        print(f"frogfix fix: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(outcome.to_dict(), ensure_ascii=False))
    else:
        print(
            f"status: {outcome.status} ({outcome.exit_reason}, {outcome.steps} steps, "
            f"{time.monotonic() - started:.1f}s)"
        )
        if outcome.test_command:
            b = outcome.before.exit_code if outcome.before else None
            a = outcome.after.exit_code if outcome.after else None
            print(f"tests: {outcome.test_command}: before exit {b}, after exit {a}")
        for flag in outcome.flags:
            print(f"flag: {flag}")
        print(f"trajectory: {outcome.trajectory}")
        if outcome.patch:
            print(outcome.patch, end="" if outcome.patch.endswith("\n") else "\n")
    return EXIT_CODES.get(outcome.status, 2)
