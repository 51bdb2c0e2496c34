"""Settings to seams: the one place that turns `FROGFIX_*` settings into a model client, a sandbox or a forge client.

The pipeline, `manage.py fix`, replay and the benches all build their seams here, so a new setting
reaches every caller at once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from app.forge.api import Forge, ForgeError
from app.retrying import RetryPolicy
from app.settings import Settings
from sandbox.base import (
    DEFAULT_PATH,
    ENV_DIR,
    PROJECT_BIN,
    Sandbox,
    SandboxLimits,
    SandboxOptions,
    SandboxSpec,
    SetupMounts,
    SetupSandbox,
)
from sandbox.factory import open_sandbox
from sandbox.quantity import parse_cpus, parse_quantity
from worker.environment import generated
from worker.environment.layout import read_layout
from worker.leaf.loop import LeafLimits
from worker.leaf.model import ModelClient, OpenAIChatModel, SamplingParams

if TYPE_CHECKING:  # imported where the backend is chosen: kubernetes* only when it is asked for
    from sandbox.kubernetes_manifests import KubernetesOptions
    from sandbox.local import LocalOptions

# Bytecode caches would otherwise land in `git add -A` and so in the patch.
SANDBOX_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}
# A sandbox with a built environment (worker/environment) has it active, as `source bin/activate` would; the
# project's own console scripts come last, so nothing its install wrote stands in for a system command.
ENVIRONMENT_ENV = {
    "VIRTUAL_ENV": ENV_DIR,
    "PATH": f"{ENV_DIR}/bin:{DEFAULT_PATH}:{PROJECT_BIN}",
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
    """The job's limits; `max_seconds` caps the loop below the job's limit (what is left of the job's time)."""
    seconds = settings.job_timeout_seconds if max_seconds is None else min(max_seconds, settings.job_timeout_seconds)
    return LeafLimits(
        max_steps=settings.leaf_max_steps,
        max_context_tokens=settings.leaf_max_context_tokens,
        max_completion_tokens=settings.leaf_max_completion_tokens,
        max_seconds=max(1.0, seconds),
    )


def sandbox_limits(settings: Settings) -> SandboxLimits:
    """The job sandbox's resource bounds; the evidence's git reads its per-file limit, and its memory capped at 1 GiB.

    FROGFIX_SANDBOX_MEMORY is per process (RLIMIT_AS) and a local sandbox's whole total (its cgroup)."""
    return SandboxLimits(wall_seconds=settings.job_timeout_seconds, memory_bytes=settings.sandbox_memory_bytes())


def sandbox_spec(
    workspace: Path,
    settings: Settings,
    image: str | None = None,
    labels: dict[str, str] | None = None,
    environment: Path | None = None,
    env: dict[str, str] | None = None,
    project: Path | None = None,
) -> SandboxSpec:
    layout = read_layout(environment) if environment is not None else None
    active = {} if environment is None else ENVIRONMENT_ENV if layout is None else layout.variables()
    variables = {**SANDBOX_ENV, **active, **(env or {})}
    if active.get("NODE_OPTIONS") and env and env.get("NODE_OPTIONS"):  # both hold: the environment's, then the run's
        variables["NODE_OPTIONS"] = f"{active['NODE_OPTIONS']} {env['NODE_OPTIONS']}"
    return SandboxSpec(
        workspace=str(workspace),
        env=variables,
        limits=sandbox_limits(settings),
        image=image,
        labels=labels or {},
        environment=str(environment) if environment is not None else None,
        project=str(project) if project is not None else None,
        checkout_binds=tuple(layout.binds(environment)) if layout is not None and environment is not None else (),
        checkout_scratch=layout.scratch(environment) if layout is not None and environment is not None else (),
    )


def sandbox_options(settings: Settings) -> SandboxOptions:
    """What both backends take from settings: the sizes and CPUs (which mean the same for both), the start's
    bound and the patch's (the runner stops reading an oversized diff inside the sandbox)."""
    return SandboxOptions(
        cpus=parse_cpus(settings.sandbox_cpu),
        workspace_size_bytes=parse_quantity(settings.sandbox_workspace_size),
        tmp_size_bytes=parse_quantity(settings.sandbox_tmp_size),
        # Locally the checkout is copied into the sandbox's tmpfs before the runner answers: a big one takes seconds.
        start_timeout_s=settings.sandbox_start_timeout_seconds,
        max_patch_bytes=settings.max_patch_bytes,
    )


def backend_options(settings: Settings) -> LocalOptions | KubernetesOptions:
    """The chosen backend's own options from settings: the local backend's defaults, or the cluster's."""
    if settings.sandbox != "kubernetes":
        from sandbox.local import LocalOptions

        return LocalOptions()
    from sandbox.kubernetes_manifests import KubernetesOptions

    s = settings
    return KubernetesOptions(
        namespace=s.sandbox_namespace,
        default_image=s.sandbox_image,
        memory=s.sandbox_memory or None,
        ephemeral_storage=s.sandbox_ephemeral_storage,
        environment_size=s.environment_size,
        runtime_class=s.sandbox_runtime_class or None,
        kubeconfig=s.kubeconfig or None,
        context=s.kube_context or None,
    )


def open_configured_sandbox(spec: SandboxSpec, settings: Settings) -> Sandbox:
    """`spec` in the backend FROGFIX_SANDBOX names, with the options built from `settings`."""
    return open_sandbox(spec, settings.sandbox, sandbox_options(settings), backend_options(settings))


def open_job_sandbox(
    workspace: Path,
    settings: Settings,
    image: str | None = None,
    labels: dict[str, str] | None = None,
    environment: Path | None = None,
    env: dict[str, str] | None = None,
    project: Path | None = None,
) -> Sandbox:
    """A job's sandbox over `workspace`, with the job's limits and the options from settings.

    `environment` is the job's built test environment (worker/environment), mounted read-only and active,
    `project` the job's project layer over it (its generated files laid into `workspace` first, where
    nothing is: worker/environment/generated.py); `env` adds variables (the verification's test-report options)."""
    if project is not None:
        generated.lay(workspace, generated.in_layer(project))
    spec = sandbox_spec(workspace, settings, image, labels, environment, env, project)
    exclude_from_git(workspace, [relative for _, relative in spec.checkout_binds])
    return open_configured_sandbox(spec, settings)


def exclude_from_git(workspace: Path, relatives: list[str]) -> None:
    """The environment's folders laid over the checkout are never the patch's: `git add -A` skips them
    (.git/info/exclude, the checkout's own, which no commit carries)."""
    info = workspace / ".git" / "info"
    if not relatives or not (workspace / ".git").is_dir() or (workspace / ".git").is_symlink():
        return
    info.mkdir(exist_ok=True)
    exclude = info / "exclude"
    if exclude.is_symlink():
        return
    have = exclude.read_text(encoding="utf-8", errors="replace") if exclude.is_file() else ""
    lines = [f"/{relative}/" for relative in relatives if f"/{relative}/" not in have.splitlines()]
    if lines:
        with exclude.open("a", encoding="utf-8") as out:
            out.write(("" if not have or have.endswith("\n") else "\n") + "\n".join(lines) + "\n")


def open_setup_sandbox(
    workspace: Path,
    settings: Settings,
    mounts: SetupMounts,
    env: dict[str, str],
    image: str | None = None,
    labels: dict[str, str] | None = None,
    environment: Path | None = None,
) -> SetupSandbox:
    """A setup phase's sandbox (worker/environment/builder.py): the job's bounds, plus room for what it
    builds (in RAM locally, so its memory total grows by that size), the relay where it has one, and
    the environment it installs the project over."""
    limits = sandbox_limits(settings)
    limits = SandboxLimits(
        wall_seconds=settings.environment_timeout_seconds + 600,
        memory_bytes=limits.memory_bytes + mounts.env_size_bytes,
    )
    spec = SandboxSpec(
        workspace=str(workspace),
        env={**SANDBOX_ENV, **env},
        limits=limits,
        image=image,
        labels=labels or {},
        setup=mounts,
        environment=str(environment) if environment is not None else None,
    )
    return cast(SetupSandbox, open_configured_sandbox(spec, settings))


def make_forge(kind: str, settings: Settings, redact: Callable[[str], str]) -> Forge:
    options: dict[str, Any] = {
        "redact": redact,
        "timeout": settings.forge_timeout_seconds,
        "retry": RetryPolicy(budget_s=settings.forge_retry_budget_seconds),
    }
    if kind == "gitlab":
        from app.forge.gitlab_api import GitLabForge

        return GitLabForge(settings.gitlab_url, settings.gitlab_token.get_secret_value(), **options)
    if kind == "gitea":
        from app.forge.gitea_api import GiteaForge

        return GiteaForge(settings.gitea_url, settings.gitea_token.get_secret_value(), **options)
    raise ForgeError(f"unknown forge {kind!r}")


SetupOpener = Callable[[Path, SetupMounts, dict[str, str], str | None, Path | None], SetupSandbox]


def setup_opener(settings: Settings) -> SetupOpener:
    """`open_setup_sandbox` with `settings` bound: what worker/environment's Environments opens each step with."""
    return lambda ws, mounts, env, image, environment: open_setup_sandbox(
        ws, settings, mounts, env, image, environment=environment
    )
