"""All configuration, read from `FROGFIX_*` environment variables (or `.env` files: `env_files`).

The names are a contract (DESIGN.md): other parts, deploy/ and operators rely on them.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

# The one import from sandbox/ (README, Architecture): its stdlib-only size syntax and rule, so a bad size is
# refused when settings load instead of failing the first job.
from sandbox.quantity import DEFAULT_MEMORY_BYTES, check_local_memory, parse_cpus, parse_quantity

DEFAULT_DATA_DIR = Path.home() / ".frogfix"
POSTGRES_SCHEME = "postgresql+psycopg"


class ProjectLimits(BaseModel):
    """One project's budget; a field left out takes the default for all projects. 0 means no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_running: int | None = Field(default=None, ge=0)  # jobs of the project running at once
    tokens_per_day: int | None = Field(default=None, ge=0)  # prompt + completion tokens per UTC day


# An .env written for the old defaults (workspace 4Gi, tmp 1Gi) no longer loads: say what changed and what to set.
LOCAL_MEMORY_UPGRADE = (
    "The defaults of FROGFIX_SANDBOX_WORKSPACE_SIZE and FROGFIX_SANDBOX_TMP_SIZE went from 4Gi and 1Gi to 2Gi "
    "and 512Mi, because the local sandbox's workspace and /tmp are RAM inside FROGFIX_SANDBOX_MEMORY; raise "
    "FROGFIX_SANDBOX_MEMORY or lower the sizes (docs/OPERATING.md, Upgrade). This rule applies only to the "
    "local backend: Kubernetes installs that want the old sizes set them explicitly"
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FROGFIX_", env_file=".env", extra="ignore")

    data_dir: Path = DEFAULT_DATA_DIR
    # Job workspaces; every folder above them must be searchable by the sandbox's unprivileged uid,
    # which a home folder (0700) is not. Empty: <system temp>/frogfix-<uid>/workspaces.
    workspace_dir: Path | None = None
    database_url: str = ""  # empty: SQLite file in data_dir
    broker_url: str = ""  # empty: embedded filesystem broker in data_dir (no server)

    model_base_url: str = "http://127.0.0.1:30000/v1"
    model_name: str = "FrogNano-4B-2609"
    model_api_key: SecretStr = SecretStr("EMPTY")
    # The key `manage.py eval` sends to a candidate server other than the production one (model_base_url):
    # the production key never goes to another server.
    eval_api_key: SecretStr = SecretStr("EMPTY")
    model_temperature: float = 0.6
    model_top_p: float = 0.95
    model_top_k: int = 20
    model_min_p: float = 0.0
    model_repetition_penalty: float = 1.0
    model_timeout_seconds: float = 600.0
    model_max_retries: int = 4
    forge_timeout_seconds: float = Field(default=30.0, gt=0)  # one forge API call; retries come on top
    forge_retry_budget_seconds: float = Field(default=90.0, gt=0)  # all retries of one forge call together

    # How many agents the model server runs at once; `manage.py eval` shares them with production jobs
    # and takes one only when no production job is queued (see worker/commands/evaluate.py).
    model_slots: int = Field(default=1, ge=1)

    leaf_max_steps: int = 150
    leaf_max_context_tokens: int = 131_072
    leaf_max_completion_tokens: int = 8_192
    job_timeout_seconds: float = 10_800.0
    prompts_dir: Path | None = None  # replaceable system prompt and task template

    gitlab_url: str = ""
    gitlab_token: SecretStr = SecretStr("")
    gitlab_webhook_secret: SecretStr = SecretStr("")
    gitlab_signing_token: SecretStr = SecretStr("")  # Standard Webhooks `whsec_...`, optional
    gitlab_allow_confidential: bool = False
    gitea_url: str = ""
    gitea_token: SecretStr = SecretStr("")
    gitea_webhook_secret: SecretStr = SecretStr("")

    admin_token: SecretStr = SecretStr("")
    # Bearer token Prometheus sends for GET /metrics (it names every project and its token use);
    # empty: /metrics stays open, for setups that reach it only from inside (compose, the Service).
    metrics_token: SecretStr = SecretStr("")
    # Dashboard sign-in. The key signs session cookies and CSRF tokens; empty: one is generated
    # once and kept in data_dir/secret_key (mode 0600). Set it when several replicas serve the dashboard.
    secret_key: SecretStr = SecretStr("")
    # A username header set by the company's reverse proxy (e.g. "X-Forwarded-User"); empty: off.
    # Only safe when the proxy is the sole way in and strips the header from clients' requests.
    trust_proxy_user_header: str = ""
    session_max_age_seconds: int = Field(default=12 * 3600, ge=60)
    sandbox: Literal["local", "kubernetes"] = "local"
    # Kubernetes sandbox (FROGFIX_SANDBOX=kubernetes): one pod per attempt in this namespace.
    sandbox_namespace: str = "frogfix-sandboxes"
    sandbox_image: str = "frogfix-sandbox:latest"  # a repository's .frogfix.yml `image` wins
    sandbox_cpu: str = "2"  # both backends: CPUs for all of a sandbox's processes together (local: its cgroup)
    # Both backends: the sandbox's memory (empty: the job's memory limit, 4 GiB). Local: the one total of its
    # processes and its in-RAM workspace, /tmp and /dev/shm together (its cgroup); a pod: its memory limit.
    sandbox_memory: str = ""
    sandbox_ephemeral_storage: str = "6Gi"
    # Both backends: the workspace's and /tmp's size. Local: tmpfs inside FROGFIX_SANDBOX_MEMORY, refused at
    # load unless both + 64Mi /dev/shm + 512Mi for processes fit in it.
    sandbox_workspace_size: str = "2Gi"
    sandbox_tmp_size: str = "512Mi"
    sandbox_runtime_class: str = ""  # e.g. gvisor or kata, where the cluster offers one
    sandbox_start_timeout_seconds: float = 300.0  # both backends (local: copying the checkout in included)
    kubeconfig: str = ""  # empty: in-cluster service account, else ~/.kube/config
    kube_context: str = ""
    trigger_label: str = "frognano-fix"
    # The company's package mirror: a PEP 503 simple index URL (devpi `.../+simple/`, Nexus, Artifactory),
    # `user:password@` allowed. Set, a Python repository's test environment is built from what it declares,
    # in a setup sandbox that reaches this index (through FrogFix's relay, which adds the credentials) and
    # nothing else. Empty: no environment is built; the tests run with the sandbox image's Python.
    pip_index_url: SecretStr = SecretStr("")
    # The company's npm registry mirror (Verdaccio, Nexus, Artifactory, a forge's package registry),
    # `user:password@` allowed. Set, a JavaScript or TypeScript repository's test environment is installed
    # from its lockfile, in a setup sandbox that reaches this registry's own paths (through FrogFix's relay,
    # which adds the credentials) and nothing else. Empty: no JavaScript environment is built.
    npm_registry_url: SecretStr = SecretStr("")
    # Built environments, cached by what determines them. Empty: `.environments` beside the job workspaces
    # (every folder above must be searchable by the sandbox's unprivileged uid, as for workspaces).
    environment_dir: Path | None = None
    environment_size: str = "2Gi"  # the largest environment a setup phase may build (RAM while it builds)
    environment_timeout_seconds: float = Field(default=1200.0, gt=0)  # one setup phase, setup_command included
    environment_cache_entries: int = Field(default=50, ge=1)  # the least recently used beyond this are removed

    # Independent attempts per job, all run (unless cancelled); the evidence ranks them (app/selection.py).
    attempts: int = Field(default=1, ge=1, le=10)
    # More attempts, up to this many in all, while the model is idle (no runnable production job queued);
    # 0 (the default) means no extra attempts: FROGFIX_ATTEMPTS is the whole job.
    max_attempts: int = Field(default=0, ge=0, le=32)
    verify_runs: int = Field(default=2, ge=1, le=10)  # patched test runs; differing results are flaky
    refuse_protected_changes: bool = False  # refuse (not just flag) patches touching tests, CI or protected paths
    require_reproduction: bool = False  # publish only patches whose evidence proves the fix (no "not reproduced" MRs)
    # A larger patch refuses the attempt (the sandbox stops reading the diff there): this bot makes small fixes.
    max_patch_bytes: int = Field(default=1024 * 1024, ge=1024, le=256 * 1024**2)
    allow_binary_patches: bool = False  # binary files cannot be reviewed in an MR's diff, so they are refused
    # A patch changing CI configuration (.gitlab-ci.yml and the files it includes locally, .github/, .gitea/,
    # .forgejo/ workflows, ...) is refused: pushed, it would run with the project's CI variables before any
    # review. True turns the refusal into a review flag.
    allow_ci_changes: bool = False
    # Let the forge's CI run on the bot's branch as soon as it is pushed. Off: the push asks GitLab
    # (`ci.skip`, `[skip ci]`) and Gitea/Forgejo (`[skip ci]`) not to, since the patch may have
    # written the CI configuration; a maintainer runs CI after review (docs/REVIEW_ROUNDS.md).
    allow_forge_ci: bool = False
    # Review rounds on an MR FrogFix opened (issue 14): rounds a member's comments may start, and
    # rounds failed CI may start (review rounds do not count towards it), per MR; log lines a CI round shows.
    max_review_rounds: int = Field(default=5, ge=0, le=100)
    max_ci_rounds: int = Field(default=2, ge=0, le=100)
    # Update rounds (issue 25): the MR's target branch merged into it, asked for with `/frogfix rebase`,
    # or started by FrogFix itself when the forge reports a conflict and auto_update is on; capped apart.
    max_update_rounds: int = Field(default=3, ge=0, le=100)
    auto_update: bool = False
    auto_update_check_seconds: float = Field(default=600.0, ge=10.0)  # how often the sweep asks an open MR
    ci_log_tail_lines: int = Field(default=80, ge=5, le=2000)
    allowed_projects: str = ""  # comma-separated glob patterns (e.g. "acme/*,tools/bot"); empty allows all
    public_url: str = ""  # where operators reach this service, for links in comments and MRs
    stale_job_seconds: float = 600.0  # an active job without a heartbeat this long lost its worker
    max_job_runs: int = 3  # a job whose worker died this many times is failed, not re-run
    max_webhook_bytes: int = Field(default=1024 * 1024)
    requeue_after_seconds: float = 300.0  # a job queued longer than this is sent again by the sweep
    # Budgets per project (app/jobs/scheduler.py); 0: no limit. A job over budget waits, queued, with the reason.
    project_max_running: int = Field(default=0, ge=0)
    project_tokens_per_day: int = Field(default=0, ge=0)
    # Overrides, JSON: {"group/proj": {"max_running": 1, "tokens_per_day": 5000000}, "acme/*": {...}}.
    # An exact path wins over a glob pattern; patterns are tried in the order written.
    project_limits: Annotated[dict[str, ProjectLimits], NoDecode] = Field(default_factory=dict)
    sweep_interval_seconds: float = 30.0
    log_level: str = "INFO"
    # Attestations (app/attestations/): the Ed25519 private key that signs every change FrogFix publishes, a PEM
    # file (`manage.py attest keygen` writes one, mode 0600); empty: changes are published "unsigned".
    attestation_key: Path | None = None
    # The public keys `verify` trusts, one `<key id>.pub` each, and `revoked.json` (key id: revocation time).
    # Empty: `attestation-keys` in the data folder.
    attestation_trusted_keys: Path | None = None
    require_attestation: bool = False  # refuse to publish (a typed ending) when no key can sign

    @field_validator("project_limits", mode="before")
    @classmethod
    def _limits_json(cls, value: Any) -> Any:
        """The JSON text an environment variable holds, read here so a mistake is named, not a traceback."""
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg} at character {exc.pos})") from None

    @field_validator("database_url")
    @classmethod
    def _database_driver(cls, value: str) -> str:
        """PostgreSQL's common spellings mean the driver FrogFix ships (psycopg 3); any other driver is named."""
        scheme, sep, rest = value.partition("://")
        if not value or not sep:
            if value:
                raise ValueError("not a database URL (it has no scheme://)")
            return value
        if scheme in ("postgres", "postgresql"):
            return f"{POSTGRES_SCHEME}://{rest}"
        if scheme.startswith(("postgres", "postgresql+")) and scheme != POSTGRES_SCHEME:
            raise ValueError(f"FrogFix talks to PostgreSQL with psycopg 3: use the scheme {POSTGRES_SCHEME}://, "
                             f"not {scheme}://")
        if scheme != POSTGRES_SCHEME and not scheme.startswith("sqlite"):
            raise ValueError(f"FrogFix uses PostgreSQL ({POSTGRES_SCHEME}://) or SQLite (sqlite:///PATH), "
                             f"not {scheme}://")
        return value

    @field_validator("sandbox_workspace_size", "sandbox_tmp_size", "sandbox_ephemeral_storage", "environment_size")
    @classmethod
    def _byte_quantity(cls, value: str) -> str:
        """Refused at load, with the syntax to use, instead of failing the first job."""
        parse_quantity(value)
        return value

    @field_validator("sandbox_memory")
    @classmethod
    def _memory_quantity(cls, value: str) -> str:
        if value:
            parse_quantity(value)
        return value

    @model_validator(mode="after")
    def _local_files_fit_in_memory(self) -> Settings:
        """A local sandbox's tmpfs live in its memory: over-sized, a full disk would OOM-kill it, not ENOSPC."""
        if self.sandbox != "local":
            return self
        try:
            check_local_memory(
                self.sandbox_memory_bytes(),
                parse_quantity(self.sandbox_workspace_size),
                parse_quantity(self.sandbox_tmp_size),
                ("FROGFIX_SANDBOX_MEMORY", "FROGFIX_SANDBOX_WORKSPACE_SIZE", "FROGFIX_SANDBOX_TMP_SIZE"),
            )
        except ValueError as exc:  # named by the variable to raise (the sizes add up into it)
            raise PydanticCustomError("local_memory", f"{exc}. {LOCAL_MEMORY_UPGRADE}",
                                      {"variable": "FROGFIX_SANDBOX_MEMORY"}) from exc
        return self

    def sandbox_memory_bytes(self) -> int:
        """FROGFIX_SANDBOX_MEMORY in bytes; empty is the job's default memory limit."""
        return parse_quantity(self.sandbox_memory) if self.sandbox_memory else DEFAULT_MEMORY_BYTES

    @field_validator("sandbox_cpu")
    @classmethod
    def _cpu_quantity(cls, value: str) -> str:
        parse_cpus(value)
        return value

    def limits_for(self, project: str) -> ProjectLimits:
        """The project's budget: its override (exact path, else the first matching pattern) over the defaults."""
        import fnmatch

        override = self.project_limits.get(project)
        if override is None:
            matches = (v for k, v in self.project_limits.items() if fnmatch.fnmatchcase(project, k))
            override = next(matches, ProjectLimits())
        return ProjectLimits(
            max_running=self.project_max_running if override.max_running is None else override.max_running,
            tokens_per_day=self.project_tokens_per_day if override.tokens_per_day is None else override.tokens_per_day,
        )

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'frogfix.db'}"

    def resolved_workspace_dir(self) -> Path:
        """The workspaces folder, created with mode 0711 so the sandbox can reach, not list, it."""
        import os
        import tempfile

        folder = self.workspace_dir or Path(tempfile.gettempdir()) / f"frogfix-{os.getuid()}" / "workspaces"
        folder.mkdir(parents=True, exist_ok=True)
        for path in (folder, folder.parent) if self.workspace_dir is None else (folder,):
            path.chmod(0o711)
        return folder

    def resolved_environment_dir(self) -> Path:
        """The environment cache, created with mode 0711 like the workspaces (reachable, not listable)."""
        folder = self.environment_dir or self.resolved_workspace_dir() / ".environments"
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o711)
        return folder

    def index_secrets(self) -> list[str]:
        """The mirrors' URLs and their passwords, for the redactor (the URL alone is redacted with `secret_values`)."""
        from urllib.parse import unquote, urlsplit

        found: list[str] = []
        for setting in (self.pip_index_url, self.npm_registry_url):
            url = setting.get_secret_value()
            try:
                password = unquote(urlsplit(url).password or "") if url else ""
            except ValueError:
                password = ""
            if password:
                found += [value for value in (url, password) if len(value) >= 4]
        return found

    def resolved_trusted_keys(self) -> Path:
        """The folder of trusted public keys (rotation keeps the old ones; `revoked.json` beside them)."""
        return self.attestation_trusted_keys or self.data_dir / "attestation-keys"

    def resolved_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def embedded_broker(self) -> bool:
        return not self.broker_url or self.broker_url.startswith("filesystem")

    @property
    def attempt_ceiling(self) -> int:
        """The most attempts one job may run: FROGFIX_ATTEMPTS, or FROGFIX_MAX_ATTEMPTS when larger."""
        return max(self.attempts, self.max_attempts)

    def secret_values(self) -> list[str]:
        """Every configured secret, so logs and forge posts can redact them."""
        values = [
            self.model_api_key,
            self.eval_api_key,
            self.gitlab_token,
            self.gitlab_webhook_secret,
            self.gitlab_signing_token,
            self.gitea_token,
            self.gitea_webhook_secret,
            self.admin_token,
            self.metrics_token,
            self.secret_key,
            self.npm_registry_url,
        ]
        found = [
            v.get_secret_value() for v in values if len(v.get_secret_value()) >= 6 and v.get_secret_value() != "EMPTY"
        ]
        return found + self.index_secrets()


# A good value, for the settings whose default is no example (empty, a secret, or a value that does not show the form).
EXAMPLES: dict[str, str] = {
    "database_url": f"{POSTGRES_SCHEME}://frogfix:PASSWORD@db.internal:5432/frogfix",
    "broker_url": "redis://redis.internal:6379/0",
    "project_limits": '{"group/project": {"max_running": 1, "tokens_per_day": 5000000}}',
    "sandbox_memory": "4Gi",
    "model_base_url": "http://gpu-1.internal:30000/v1",
    "gitlab_url": "https://gitlab.example.com",
    "gitea_url": "https://gitea.example.com",
    "public_url": "https://frogfix.example.com",
    "allowed_projects": "acme/*,tools/bot",
    "trust_proxy_user_header": "X-Forwarded-User",
    "pip_index_url": "https://devpi.internal/root/pypi/+simple/",
    "npm_registry_url": "https://npm.internal/",
    "workspace_dir": "/var/lib/frogfix/workspaces",
    "environment_dir": "/var/lib/frogfix/environments",
    "prompts_dir": "/etc/frogfix/prompts",
}


class BadSettings(Exception):
    """Settings that do not load, said in one line (`settings_problem`): each variable, its problem and a good
    value, never the value given (it may be a secret)."""


def example_of(field: str) -> str:
    """A good value of the setting `field`: its listed example, else its default when that shows the form."""
    if field in EXAMPLES:
        return EXAMPLES[field]
    info = Settings.model_fields.get(field)
    if info is None:
        return ""
    choices = get_args(info.annotation)
    if choices and all(isinstance(c, str) for c in choices):
        return str(choices[0])
    if info.annotation is bool:
        return "true"
    default = info.default
    if isinstance(default, SecretStr) or default in (None, "") or not isinstance(default, int | float | str | Path):
        return ""
    return str(default)


def settings_problem(exc: ValidationError | SettingsError) -> str:
    """One line for settings that do not load: `FROGFIX_X: the problem (e.g. FROGFIX_X=good)`, each variable once."""
    if isinstance(exc, SettingsError):  # a value the environment source could not decode: it names the field
        found = re.search(r'field "([a-z_]+)"', str(exc))
        errors: list[dict[str, Any]] = [{"loc": (found.group(1) if found else "?",), "msg": "cannot be read"}]
    else:
        errors = [dict(error) for error in exc.errors()]
    said: dict[str, str] = {}
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        field = loc[0] if loc else ""
        variable = (error.get("ctx") or {}).get("variable") or (f"FROGFIX_{field.upper()}" if field else "FROGFIX_?")
        field = field or variable.removeprefix("FROGFIX_").lower()
        problem = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        where = ".".join(loc[1:])
        example = example_of(field)
        text = f"{where}: {problem}" if where else problem
        said.setdefault(variable, f"{variable}: {text}" + (f" (e.g. {variable}={example})" if example else ""))
    return " ".join(" ".join(said.values()).split())


def checked_settings() -> Settings:
    """The settings, or BadSettings saying in one line what is wrong (never a traceback)."""
    try:
        return get_settings()
    except (ValidationError, SettingsError) as exc:
        raise BadSettings(settings_problem(exc)) from None


CHECKOUT = Path(__file__).resolve().parents[1]


def env_files() -> tuple[Path, ...]:
    """The `.env` files settings are read from, the later winning: the checkout's (FrogFix's own folder), the data
    folder's (FROGFIX_DATA_DIR as the environment gives it, else ~/.frogfix), then the current folder's; the
    environment itself wins over all. So `./manage.py` finds its `.env` from whatever folder it is run in."""
    import os

    data_dir = Path(os.environ.get("FROGFIX_DATA_DIR") or DEFAULT_DATA_DIR).expanduser()
    try:
        here = [Path.cwd() / ".env"]
    except OSError:  # the current folder was removed
        here = []
    found: list[Path] = []
    for candidate in (CHECKOUT / ".env", data_dir / ".env", *here):
        resolved = candidate.resolve()
        if resolved.is_file() and resolved not in found:
            found.append(resolved)
    return tuple(found)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings(_env_file=env_files() or None)  # type: ignore[call-arg]


def reset_settings_cache() -> None:
    """Tests and `manage.py` change the environment; this makes the next read see it."""
    get_settings.cache_clear()
