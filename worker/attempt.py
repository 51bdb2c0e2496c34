"""One attempt's sandboxed work, shared by `manage.py fix` and the pipeline: run Leaf, run the tests."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git

from app.settings import Settings
from sandbox.base import Sandbox, SandboxError, SandboxLimits, SandboxSpec
from sandbox.factory import open_sandbox
from worker.leaf.loop import LeafLimits, LeafResult, StepRecord, run_leaf
from worker.leaf.model import ModelClient, OpenAIChatModel, SamplingParams
from worker.leaf.prompts import render_task, system_prompt
from worker.leaf.trajectory import TrajectoryWriter
from worker.repo_config import RepoConfig

LOG_LIMIT = 60_000
# Bytecode caches would otherwise land in `git add -A` and so in the patch.
SANDBOX_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}
# How both backends report that the runner (sandbox/runner.py `_git`) stopped reading a diff at its byte limit.
RUNNER_PATCH_LIMIT = re.compile(r"sandbox runner: ValueError: the patch is larger than \d+ bytes")


class PatchTooLarge(SandboxError):
    """The agent's changes make a patch over FROGFIX_MAX_PATCH_BYTES: the attempt is refused, the sandbox is fine.

    A SandboxError, so callers that do not know it still stop cleanly; the pipeline catches it first.
    """

    def __init__(self, limit: int, result: LeafResult) -> None:
        super().__init__(f"the patch is larger than {limit} bytes (FROGFIX_MAX_PATCH_BYTES)")
        self.limit, self.result = limit, result


@dataclass
class TestRun:
    exit_code: int | None
    log: str
    timed_out: bool = False
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "log": self.log,
            "timed_out": self.timed_out,
            "seconds": round(self.seconds, 3),
        }


def sampling_from(settings: Settings) -> SamplingParams:
    s = settings
    return SamplingParams(
        temperature=s.model_temperature,
        top_p=s.model_top_p,
        top_k=s.model_top_k,
        min_p=s.model_min_p,
        repetition_penalty=s.model_repetition_penalty,
        max_completion_tokens=s.leaf_max_completion_tokens,
    )


def model_from(settings: Settings) -> ModelClient:
    return OpenAIChatModel(
        base_url=settings.model_base_url,
        model=settings.model_name,
        api_key=settings.model_api_key.get_secret_value(),
        sampling=sampling_from(settings),
        timeout=settings.model_timeout_seconds,
        max_retries=settings.model_max_retries,
    )


def leaf_limits_from(settings: Settings, max_seconds: float | None = None) -> LeafLimits:
    seconds = settings.job_timeout_seconds if max_seconds is None else min(max_seconds, settings.job_timeout_seconds)
    return LeafLimits(
        max_steps=settings.leaf_max_steps,
        max_context_tokens=settings.leaf_max_context_tokens,
        max_completion_tokens=settings.leaf_max_completion_tokens,
        max_seconds=max(1.0, seconds),
    )


def sandbox_spec(
    workspace: Path, settings: Settings, image: str | None = None, labels: dict[str, str] | None = None
) -> SandboxSpec:
    return SandboxSpec(
        workspace=str(workspace),
        env=dict(SANDBOX_ENV),
        limits=SandboxLimits(wall_seconds=settings.job_timeout_seconds),
        image=image,
        labels=labels or {},
    )


def sandbox_options(settings: Settings) -> dict[str, Any]:
    """The backend's own options from settings (the local backend needs none)."""
    if settings.sandbox != "kubernetes":
        return {}
    s = settings
    options: dict[str, Any] = {
        "namespace": s.sandbox_namespace,
        "default_image": s.sandbox_image,
        "cpu": s.sandbox_cpu,
        "ephemeral_storage": s.sandbox_ephemeral_storage,
        "workspace_size": s.sandbox_workspace_size,
        "tmp_size": s.sandbox_tmp_size,
        "start_timeout_s": s.sandbox_start_timeout_seconds,
    }
    optional = {
        "memory": s.sandbox_memory,
        "runtime_class": s.sandbox_runtime_class,
        "kubeconfig": s.kubeconfig,
        "context": s.kube_context,
    }
    options.update({k: v for k, v in optional.items() if v})
    return options


def open_job_sandbox(
    workspace: Path, settings: Settings, image: str | None = None, labels: dict[str, str] | None = None
) -> Sandbox:
    """Both backends take `max_patch_bytes`, so the runner stops reading an oversized diff inside the sandbox."""
    options = {"max_patch_bytes": settings.max_patch_bytes, **sandbox_options(settings)}
    return open_sandbox(sandbox_spec(workspace, settings, image, labels), settings.sandbox, **options)


def bounded_log(text: str, limit: int = LOG_LIMIT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} chars cut ...]\n{text[-half:]}"


def run_agent(
    workspace: Path,
    base_commit: str,
    *,
    settings: Settings,
    model: ModelClient,
    title: str,
    body: str,
    project: str,
    issue_number: int | str,
    writer: TrajectoryWriter,
    on_step: Callable[[StepRecord], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    image: str | None = None,
    labels: dict[str, str] | None = None,
    max_seconds: float | None = None,
) -> tuple[LeafResult, str]:
    """Leaf in a fresh sandbox over `workspace`; returns the result and the patch against the base.

    `max_seconds` caps the loop below the job's limit (what is left of the job's time).
    Raises SandboxError when the sandbox itself fails (an infrastructure failure), and its
    subclass PatchTooLarge when the changes exceed FROGFIX_MAX_PATCH_BYTES.
    """

    def step(record: StepRecord) -> None:
        writer.on_step(record)
        if on_step is not None:
            on_step(record)

    task = render_task(title, body, prompts_dir=settings.prompts_dir, project=project, issue_number=issue_number)
    with closing(open_job_sandbox(workspace, settings, image, labels)) as box:
        result = run_leaf(
            model,
            box,
            task,
            system_prompt=system_prompt(settings.prompts_dir),
            limits=leaf_limits_from(settings, max_seconds),
            on_step=step,
            cancel=cancel,
        )
        try:
            patch = box.patch(base_commit)
        except SandboxError as exc:
            if not RUNNER_PATCH_LIMIT.fullmatch(str(exc)):
                raise
            writer.finish(result, patch="")
            raise PatchTooLarge(settings.max_patch_bytes, result) from None
    writer.finish(result, patch=patch)
    return result, patch


def apply_patch(workspace: Path, patch: str, scratch: Path) -> str | None:
    """Apply a patch to a checkout; returns git's complaint when it does not apply."""
    patch_file = scratch / "candidate.patch"
    patch_file.write_bytes(patch.encode("utf-8", "surrogateescape"))  # the sandbox keeps odd bytes as surrogates
    try:
        git.Repo(workspace).git.apply("--binary", "--whitespace=nowarn", str(patch_file))
    except git.GitCommandError as exc:
        return f"the patch does not apply to the base commit: {str(exc.stderr).strip()}"
    finally:
        patch_file.unlink(missing_ok=True)
    return None


def run_tests(
    workspace: Path, config: RepoConfig, settings: Settings, redact: Callable[[str], str], image: str | None = None
) -> TestRun:
    """The repository's test command in a fresh sandbox over `workspace` (which is then removed)."""
    command = config.test_command or ""
    if config.setup_command:
        command = f"{config.setup_command} && {command}"
    try:
        with closing(open_job_sandbox(workspace, settings, image)) as box:
            res = box.run_command(command, timeout=config.test_timeout)
    except SandboxError as exc:
        return TestRun(None, f"sandbox failure while running the tests: {exc}")
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return TestRun(res.exit_code, bounded_log(redact(res.log)), res.timed_out, res.duration_s)
