"""Shared fixtures: an isolated FrogFix configuration per test, real PostgreSQL and Redis servers."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.nonroot import nonroot as nonroot  # the fixture, for any test (see tests/nonroot.py)
from tests.npm_registry import npm_registry as npm_registry  # the company's npm mirror (a session fixture)
from tests.processes import Workers
from tests.servers import Postgres, Redis, postgres_server, redis_server

SHARED_FIXTURES = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures" / "forge"
SGLANG_FIXTURES = SHARED_FIXTURES.parent / "sglang"
PAYLOADS = Path(__file__).resolve().parent / "payloads"

GITLAB_SECRET = "gitlab-hook-secret-for-tests"
GITEA_SECRET = "gitea-hook-secret-for-tests"
ADMIN_TOKEN = "admin-token-for-tests-0123456789"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """test.sh runs the suite in two phases, named by FROGFIX_TEST_PHASE: `parallel` (under
    pytest-xdist) keeps the tests not marked `serial`, `serial` keeps only those. Without the
    variable (plain pytest) every test runs."""
    phase = os.environ.get("FROGFIX_TEST_PHASE", "")
    if phase not in ("", "parallel", "serial"):
        raise pytest.UsageError(f"FROGFIX_TEST_PHASE={phase!r}: use parallel, serial, or leave it unset")
    if not phase:
        return
    keep, drop = [], []
    for item in items:
        (keep if (item.get_closest_marker("serial") is not None) == (phase == "serial") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def configure(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """Point every cached piece (settings, engines, Celery) at a fresh configuration."""
    for key, value in env.items():
        monkeypatch.setenv(f"FROGFIX_{key.upper()}", value)
    from app.db import dispose_engines
    from app.queue import configure_celery
    from app.settings import get_settings, reset_settings_cache

    reset_settings_cache()
    dispose_engines()
    configure_celery(get_settings())


_TEMPLATE: list[Path] = []  # this test process's database at head, made on first use


def migrated_template() -> Path:
    """An SQLite database file Alembic brought to head once per test process: each test's database is a copy.

    The migrations themselves are tested on empty SQLite and PostgreSQL databases (tests/test_migrations.py),
    and a fresh data folder's own upgrade by the commands that make one (`demo`, `eval`: README's first
    steps); every other test only needs a database at head, which a file copy gives in well under a
    millisecond where running the migrations again takes a second or more."""
    if not _TEMPLATE:
        from app.migrate import upgrade

        folder = tempfile.mkdtemp(prefix="frogfix-migrated-")
        atexit.register(shutil.rmtree, folder, True)
        template = Path(folder) / "frogfix.db"
        upgrade(f"sqlite:///{template}")
        _TEMPLATE.append(template)
    return _TEMPLATE[0]


def seeded(data_dir: Path) -> Path:
    """`data_dir` with its embedded database at head (a copy of the template), unless it has one already."""
    database = data_dir / "frogfix.db"
    if not database.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(migrated_template(), database)
    return data_dir


@pytest.fixture(scope="session")
def migrated_database() -> Path:
    return migrated_template()


@pytest.fixture
def frogfix_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_database: Path
) -> Iterator[dict[str, Any]]:
    """Embedded defaults (SQLite + filesystem broker) in a temp folder, its database at head (a copy of
    the session's migrated one)."""
    for key in list(os.environ):
        if key.startswith("FROGFIX_"):
            monkeypatch.delenv(key)
    env = {
        "data_dir": str(tmp_path / "data"),
        "gitlab_webhook_secret": GITLAB_SECRET,
        "gitea_webhook_secret": GITEA_SECRET,
        "admin_token": ADMIN_TOKEN,
        "sweep_interval_seconds": "0",
    }
    configure(monkeypatch, **env)
    from app.settings import get_settings

    database = get_settings().resolved_database_url().removeprefix("sqlite:///")
    Path(database).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated_database, database)
    yield {"data_dir": tmp_path / "data", "monkeypatch": monkeypatch}
    from app.db import dispose_engines

    dispose_engines()


@pytest.fixture
def local_env(frogfix_env: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """`frogfix_env` with its workspaces outside pytest's tmp folder (which only root may enter), in a
    folder the sandbox's uid can traverse: for tests that run local sandboxes over real jobs."""
    workspaces = Path(tempfile.mkdtemp(prefix="frogfix-local-ws-"))
    workspaces.chmod(0o711)
    configure(frogfix_env["monkeypatch"], workspace_dir=str(workspaces))
    try:
        yield frogfix_env
    finally:
        shutil.rmtree(workspaces, ignore_errors=True)


@pytest.fixture(scope="session")
def pg() -> Iterator[Postgres]:
    if shutil.which("initdb") is None and not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        pytest.fail("PostgreSQL is not installed (apt-get install postgresql); .ci/run installs it")
    with postgres_server() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, frogfix_env: dict[str, Any]) -> str:
    """The test once on the embedded SQLite and once on a fresh, migrated PostgreSQL database of its own."""
    if request.param == "postgres":
        from app.migrate import upgrade

        pg = request.getfixturevalue("pg")
        module = request.node.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
        unique = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]
        url = pg.create_database(f"{re.sub(r'[^a-z0-9_]', '_', module.lower())[:40]}_{unique}")
        configure(frogfix_env["monkeypatch"], database_url=url)
        upgrade(url)
    return str(request.param)


@pytest.fixture(scope="session")
def redis() -> Iterator[Redis]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server); .ci/run installs it")
    with redis_server() as server:
        yield server


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    """Real `manage.py worker` processes, stopped (and killed if need be) after the test."""
    w = Workers(tmp_path)
    yield w
    w.stop_all()


@pytest.fixture
def client(frogfix_env: dict[str, Any]) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from app.web.main import create_app

    with TestClient(create_app(run_sweep=False), raise_server_exceptions=False) as c:
        yield c


def shared_fixture(relative: str) -> Path:
    path = SHARED_FIXTURES / relative
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(f"the shared forge fixtures are not here ({SHARED_FIXTURES}); CI provides ../shared")
    return path


SGLANG_ABSENT = "(shared sglang fixtures absent)"


def sglang_case_names(file: str) -> list[str]:
    """The case names of one ../shared/fixtures/sglang/*.jsonl file, for parametrize (read at
    collection); one placeholder when the folder is absent, which `sglang_case` then skips."""
    if not SGLANG_FIXTURES.is_dir():
        return [SGLANG_ABSENT]
    with open(SGLANG_FIXTURES / file, encoding="utf-8") as handle:
        return [json.loads(line)["name"] for line in handle if line.strip()]


def sglang_case(file: str, name: str) -> dict[str, Any]:
    """One case of what SGLang 0.5.23 really returns (its MANIFEST.json says how each was made)."""
    if name == SGLANG_ABSENT or not SGLANG_FIXTURES.is_dir():
        pytest.skip(f"the shared SGLang fixtures are not here ({SGLANG_FIXTURES}); CI provides ../shared")
    with open(SGLANG_FIXTURES / file, encoding="utf-8") as handle:
        for line in handle:
            case: dict[str, Any] = json.loads(line) if line.strip() else {}
            if case.get("name") == name:
                return case
    raise LookupError(f"no case {name!r} in {SGLANG_FIXTURES / file}")
