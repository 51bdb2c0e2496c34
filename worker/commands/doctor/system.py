"""Doctor's checks of the host side: the database and its schema, the broker, free disk, whether /metrics
needs a token, prlimit (the patch evidence's memory bound) and git new enough for update rounds."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from app.settings import Settings
from worker.commands.doctor.results import CheckResult, DoctorOptions, failed, passed, warned

CONNECT_TIMEOUT_S = 5


def shown_url(url: str) -> str:
    """A URL without its password, for a report line."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    user = f"{parts.username}:***@" if parts.username else ":***@"
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, f"{user}{host}{port}", parts.path, parts.query, parts.fragment))


def check_database(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    """Reachable, and at Alembic's head revision (the one migrations/ ends with)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine

    from app.migrate import alembic_config

    url = settings.resolved_database_url()
    where = shown_url(url)
    if url.startswith("sqlite") and "///" in url:
        path = url.split("///", 1)[1]
        if path and path != ":memory:" and not Path(path).is_file():
            return [failed("database", f"no database file at {path}", "run ./manage.py migrate")]
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    connect_args = {"connect_timeout": CONNECT_TIMEOUT_S} if url.startswith("postgresql") else {}
    try:
        engine = create_engine(url, connect_args=connect_args)
        try:
            with engine.connect() as conn:
                current = MigrationContext.configure(conn).get_current_revision()
        finally:
            engine.dispose()
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return [
            failed(
                "database",
                f"cannot connect to {where}: {type(exc).__name__}: {reason}"[:400],
                "start the database server, or correct FROGFIX_DATABASE_URL (host, port, user, password, name)",
            )
        ]
    if current == head:
        return [passed("database", f"{where} reachable, schema at head ({head})")]
    shown = current or "empty (no schema)"
    return [
        failed("database", f"{where} reachable, but schema at {shown}, head is {head}", "run ./manage.py migrate")
    ]


def check_broker(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    """The embedded broker's folder is writable; a broker server answers."""
    if settings.embedded_broker:
        from app.queue import broker_folder

        folder = broker_folder(settings) / "queue"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".doctor-"):
                pass
        except OSError as exc:
            return [
                failed(
                    "broker",
                    f"embedded broker folder {folder} is not writable: {exc.strerror or exc}",
                    f"make {folder} writable for the user running FrogFix, or set FROGFIX_DATA_DIR",
                )
            ]
        return [passed("broker", f"embedded broker (no server), folder {folder} writable")]
    from kombu import Connection

    url = settings.resolved_broker_url()
    options_ = {"socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": CONNECT_TIMEOUT_S, "max_retries": 1}
    try:
        with Connection(url, connect_timeout=CONNECT_TIMEOUT_S, transport_options=options_) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=CONNECT_TIMEOUT_S)
    except Exception as exc:
        return [
            failed(
                "broker",
                f"cannot reach the broker at {shown_url(url)}: {type(exc).__name__}: {exc}"[:400],
                "start Redis (redis-server), or correct FROGFIX_BROKER_URL; leave it empty for the embedded broker",
            )
        ]
    return [passed("broker", f"{shown_url(url)} answers")]


def _free_line(name: str, label: str, folder: Path, min_free: int) -> CheckResult:
    probe = folder
    while not probe.exists() and probe != probe.parent:  # not made yet: its file system is the parent's
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    gib = free / 1024**3
    need = min_free / 1024**3
    if free >= min_free:
        return passed(name, f"{gib:.1f} GiB free in the {label} folder {folder}")
    return failed(
        name,
        f"only {gib:.1f} GiB free in the {label} folder {folder} (want {need:g} GiB)",
        f"free space on that file system, or move the {label} folder "
        + ("(FROGFIX_DATA_DIR)" if label == "data" else "(FROGFIX_WORKSPACE_DIR)"),
    )


def check_disk(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    """Free space where jobs write: the data folder (trajectories, mirrors) and the workspaces."""
    try:
        workspace = settings.resolved_workspace_dir()
    except OSError as exc:
        workspace_line = failed(
            "disk.workspace",
            f"cannot create the workspace folder: {exc}",
            "set FROGFIX_WORKSPACE_DIR to a folder FrogFix may create and write",
        )
        return [_free_line("disk.data", "data", settings.data_dir, options.min_free_bytes), workspace_line]
    return [
        _free_line("disk.data", "data", settings.data_dir, options.min_free_bytes),
        _free_line("disk.workspace", "workspace", workspace, options.min_free_bytes),
    ]


METRICS_TOKEN_FIX = (
    "set FROGFIX_METRICS_TOKEN to a random value (e.g. the output of `openssl rand -hex 32`) in .env or the "
    "Secret, and give Prometheus the same bearer (docs/OPERATING.md, Day to day)"
)


def check_metrics_token(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    """A warning, not a failure: an empty token is fine where only Prometheus reaches the api (the example
    Ingress does not route /metrics), but on Docker Compose the api's port is the public webhook port."""
    if settings.metrics_token.get_secret_value():
        return [passed("metrics.token", "GET /metrics needs FROGFIX_METRICS_TOKEN as its bearer")]
    detail = (
        "FROGFIX_METRICS_TOKEN is empty, so GET /metrics, which names every project that uses FrogFix and its "
        "token use, is open to whoever reaches the api's port (with Docker Compose, the published FROGFIX_PORT)"
    )
    return [warned("metrics.token", detail, METRICS_TOKEN_FIX)]


def check_evidence_bound(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    """The worker's git reads the sandbox's hostile patch under prlimit's memory bound; without prlimit it
    still runs (a warning, once, in the worker's log), unbounded, which doctor says up front."""
    from worker.attempts.attempt import ReviewPolicy
    from worker.git.gitcalls import git_argv, prlimit_path

    if prlimit_path() is None:
        return [
            warned(
                "evidence.prlimit",
                "prlimit is not on PATH: the patch evidence's git then runs in the worker without its memory bound",
                "install util-linux (it provides prlimit) on the worker's host or image, or put it on PATH",
            )
        ]
    bound = ReviewPolicy.from_settings(settings).evidence.max_memory_bytes
    argv = git_argv(["--version"], bound)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CONNECT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    else:
        if done.returncode == 0:
            return [passed("evidence.prlimit", f"the patch evidence's git runs under {argv[0]} --as={bound}")]
        reason = (done.stderr.strip() or f"exit {done.returncode}")[:300]
    return [
        failed(
            "evidence.prlimit",
            f"git under {argv[0]} --as={bound} does not start ({reason}): every patch evidence would fail",
            "check that prlimit (util-linux) and git run for the worker's user",
        )
    ]


MERGE_TREE_GIT = (2, 38)  # `git merge-tree --write-tree`, which update rounds merge with (worker/git/merging.py)


def check_git(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    """The worker's git is new enough for update rounds (issue 25): they merge the target with
    `git merge-tree --write-tree`, git 2.38 or later. Older, only update rounds fail: a warning."""
    try:
        done = subprocess.run(["git", "--version"], capture_output=True, text=True, timeout=CONNECT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [failed("git.version", f"git does not run: {type(exc).__name__}: {exc}", "install git on the worker")]
    found = re.search(r"(\d+)\.(\d+)", done.stdout)
    version = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    shown = done.stdout.strip()[:80] or f"exit {done.returncode}"
    if version >= MERGE_TREE_GIT:
        return [passed("git.version", f"{shown}: update rounds can merge a moved target branch")]
    return [
        warned(
            "git.version",
            f"{shown} is older than 2.38: update rounds (`/frogfix rebase`, FROGFIX_AUTO_UPDATE) fail",
            "install git 2.38 or later on the worker's host or image",
        )
    ]
