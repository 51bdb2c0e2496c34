"""The tests' npm registry (tests/npm_registry.py) is a real one: npm, pnpm and Yarn install through it
with its credentials, a wrong password is refused, its log names what it served, private scoped
packages publish and install, and it serves from its storage when the public registry is gone."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from tests.npm_registry import PACKAGE_MANAGERS, Verdaccio, publish, tarball, tarball_of
from tests.servers import free_port

PRIVATE = "@company/left-pad-lite"
CLIENT_SCRIPTS = {"pnpm": "pnpm/bin/pnpm.cjs", "yarn classic": "yarn/bin/yarn.js",
                  "yarn berry": "@yarnpkg/cli-dist/bin/yarn.js"}
LEFT_PAD = {"index.js": "module.exports = (s, n, c = ' ') => String(s).padStart(n, c);\n"}


def run_client(npmrc: str, cwd: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """A package manager in `cwd` with its own empty home and cache (so every tarball comes from the
    registry), the registry and its credentials in the project's .npmrc."""
    cwd.mkdir(parents=True, exist_ok=True)
    if not (cwd / "package.json").exists():
        (cwd / "package.json").write_text(json.dumps({"name": cwd.name, "version": "1.0.0", "private": True}))
    (cwd / ".npmrc").write_text(npmrc)
    home = cwd.parent / f"{cwd.name}-home"
    home.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "npm_config_cache": str(home / "npm-cache"),
           "npm_config_update_notifier": "false", "npm_config_audit": "false", "npm_config_fund": "false"}
    return subprocess.run(list(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def installed_version(project: Path, name: str) -> str:
    return str(json.loads((project / "node_modules" / name / "package.json").read_text())["version"])


def test_npm_installs_through_the_registry_with_its_credentials(npm_registry: Verdaccio, tmp_path: Path) -> None:
    project = tmp_path / "app"
    before = len(npm_registry.requests())
    done = run_client(npm_registry.npmrc(), project, "npm", "install", "is-number@7.0.0")
    assert done.returncode == 0, done.stderr
    assert installed_version(project, "is-number") == "7.0.0"
    lock = json.loads((project / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/is-number"]["resolved"].startswith(npm_registry.plain_url)
    assert npm_registry.served_tarballs(since=before) == [("is-number", "7.0.0")]
    fetched = [r for r in npm_registry.requests() if r.path == "/is-number/-/is-number-7.0.0.tgz" and r.status == 200]
    assert fetched and all(r.user == npm_registry.user for r in fetched)


def test_basic_auth_is_accepted_and_a_wrong_password_gets_401(npm_registry: Verdaccio) -> None:
    packument = f"{npm_registry.plain_url}is-number"
    assert httpx.get(packument, auth=npm_registry.auth(), timeout=60).status_code == 200
    assert httpx.get(packument, auth=(npm_registry.user, "not-the-password"), timeout=60).status_code == 401
    assert httpx.get(packument, timeout=60).status_code == 401
    tarball_url = f"{npm_registry.plain_url}is-number/-/is-number-7.0.0.tgz"
    assert httpx.get(tarball_url, auth=(npm_registry.user, "not-the-password"), timeout=60).status_code == 401
    refused = [r for r in npm_registry.requests() if r.path == "/is-number" and r.status == 401]
    assert refused and all(r.user is None for r in refused)


def test_npm_with_a_wrong_password_fails_with_e401(npm_registry: Verdaccio, tmp_path: Path) -> None:
    project = tmp_path / "refused"
    done = run_client(npm_registry.npmrc(password="not-the-password"), project, "npm", "install", "is-number@7.0.0")
    assert done.returncode != 0
    assert "E401" in done.stderr, done.stderr
    assert not (project / "node_modules" / "is-number").exists()


def test_a_private_scoped_package_publishes_and_installs(npm_registry: Verdaccio, tmp_path: Path) -> None:
    integrity = publish(npm_registry, PRIVATE, "1.0.0", LEFT_PAD)
    assert publish(npm_registry, PRIVATE, "1.0.0", LEFT_PAD) == integrity  # the same bytes again: no conflict
    with pytest.raises(RuntimeError, match="HTTP 40"):
        publish(npm_registry, PRIVATE, "1.0.0", {"index.js": "module.exports = 'other bytes';\n"})
    project = tmp_path / "consumer"
    done = run_client(npm_registry.npmrc(), project, "npm", "install", f"{PRIVATE}@1.0.0")
    assert done.returncode == 0, done.stderr
    assert installed_version(project, PRIVATE) == "1.0.0"
    padded = subprocess.run(["node", "-e", f"console.log(require('{PRIVATE}')('7', 3, '0'))"], cwd=project,
                            capture_output=True, text=True, timeout=60)
    assert padded.stdout.strip() == "007", padded.stderr
    assert (PRIVATE, "1.0.0") in npm_registry.served_tarballs()


@pytest.fixture(scope="module")
def tools(npm_registry: Verdaccio, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package managers FrogFix installs from the mirror, installed from it (which fills its storage)."""
    folder = tmp_path_factory.mktemp("clients") / "tools"
    wanted = [f"{name}@{version}" for name, version in PACKAGE_MANAGERS]
    done = run_client(npm_registry.npmrc(), folder, "npm", "install", "--ignore-scripts", *wanted)
    assert done.returncode == 0, done.stderr
    return folder


def test_the_package_managers_are_served(npm_registry: Verdaccio, tools: Path) -> None:
    for name, version in PACKAGE_MANAGERS:
        assert installed_version(tools, name) == version
        assert (name, version) in npm_registry.served_tarballs()


@pytest.mark.parametrize("client", ["pnpm", "yarn classic", "yarn berry"])
def test_each_package_manager_authenticates_with_basic_credentials(
    npm_registry: Verdaccio, tools: Path, tmp_path: Path, client: str
) -> None:
    """Each sends `Authorization: Basic` from its own setting (.npmrc `_auth`; Berry's `npmAuthIdent`
    with `npmAlwaysAuth`), for package documents and tarballs alike."""
    project = tmp_path / "project"
    project.mkdir()
    command = ["node", str(tools / "node_modules" / CLIENT_SCRIPTS[client]), "add"]
    if client == "pnpm":
        command += ["--store-dir", str(tmp_path / "pnpm-store")]
    elif client == "yarn classic":
        command += ["--non-interactive", "--cache-folder", str(tmp_path / "yarn-cache")]
    else:
        (project / "package.json").write_text(json.dumps({"name": "berry", "packageManager": "yarn@4.5.3"}))
        (project / "yarn.lock").touch()
        (project / ".yarnrc.yml").write_text(json.dumps({
            "npmRegistryServer": npm_registry.plain_url.rstrip("/"), "unsafeHttpWhitelist": ["127.0.0.1"],
            "npmAuthIdent": f"{npm_registry.user}:{npm_registry.password}", "npmAlwaysAuth": True,
            "nodeLinker": "node-modules", "enableGlobalCache": False, "enableTelemetry": False,
        }))
    before = len(npm_registry.requests())
    done = run_client(npm_registry.npmrc(), project, *command, "is-number@7.0.0")
    assert done.returncode == 0, f"{client}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert installed_version(project, "is-number") == "7.0.0"
    fetched = [r for r in npm_registry.requests()[before:] if r.path == "/is-number/-/is-number-7.0.0.tgz"]
    assert fetched and all(r.status == 200 and r.user == npm_registry.user for r in fetched)


def test_it_serves_from_its_storage_when_the_public_registry_is_unreachable(
    npm_registry: Verdaccio, tmp_path: Path
) -> None:
    warm = run_client(npm_registry.npmrc(), tmp_path / "warm", "npm", "install", "is-number@7.0.0")
    assert warm.returncode == 0, warm.stderr
    offline = Verdaccio(tmp_path / "offline-server", uplink=f"http://127.0.0.1:{free_port()}/")
    (tmp_path / "offline-server").mkdir()
    offline.start()
    try:
        project = tmp_path / "offline"
        done = run_client(offline.npmrc(), project, "npm", "install", "is-number@7.0.0")
        assert done.returncode == 0, done.stderr
        assert installed_version(project, "is-number") == "7.0.0"
        assert offline.served_tarballs() == [("is-number", "7.0.0")]
    finally:
        offline.stop()


def test_tarball_paths_and_bytes() -> None:
    assert tarball_of("/is-number/-/is-number-7.0.0.tgz") == ("is-number", "7.0.0")
    assert tarball_of("/@company%2fleft-pad-lite/-/left-pad-lite-1.0.0-rc.1.tgz") == (PRIVATE, "1.0.0-rc.1")
    assert tarball_of("/@company/left-pad-lite/-/left-pad-lite-2.0.0.tgz") == (PRIVATE, "2.0.0")
    assert tarball_of("/is-number") is None and tarball_of("/-/ping") is None
    assert tarball(PRIVATE, "1.0.0", LEFT_PAD) == tarball(PRIVATE, "1.0.0", LEFT_PAD)
    assert shutil.which("node") and shutil.which("npm"), "the npm registry tests need node and npm (./install.sh)"


def test_two_servers_share_one_storage_while_both_publish(tmp_path: Path) -> None:
    """xdist workers each run a server on the shared storage: publishing the same new package from both
    at once (Verdaccio answers 409 while the other creates it) still ends with every version on both."""
    storage = tmp_path / "storage"
    servers = [Verdaccio(tmp_path / f"server-{i}", storage=storage, uplink=f"http://127.0.0.1:{free_port()}/")
               for i in range(2)]
    errors: list[str] = []

    def publish_all(server: Verdaccio) -> None:
        for patch in range(4):
            try:
                publish(server, "@company/raced", f"1.0.{patch}", {"index.js": f"module.exports = {patch};\n"})
            except RuntimeError as exc:
                errors.append(str(exc))

    for server in servers:
        server.folder.mkdir()
        server.start()
    try:
        threads = [threading.Thread(target=publish_all, args=(server,)) for server in servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert errors == []
        for server in servers:
            document = httpx.get(f"{server.plain_url}@company%2fraced", auth=server.auth(), timeout=60).json()
            assert sorted(document["versions"]) == ["1.0.0", "1.0.1", "1.0.2", "1.0.3"]
    finally:
        for server in servers:
            server.stop()


def test_the_request_log_lists_each_request_once(npm_registry: Verdaccio) -> None:
    """Verdaccio writes some requests twice (tests/npm_registry.py, `requests`): each is listed once."""
    base, wrong = npm_registry.plain_url, (npm_registry.user, "not-the-password")
    sent = [("GET", "is-number", npm_registry.auth()), ("GET", "is-number", wrong), ("GET", "-/ping", None),
            ("HEAD", "is-number/-/is-number-7.0.0.tgz", npm_registry.auth()), ("GET", "is-number", None),
            ("GET", "is-number/-/is-number-7.0.0.tgz", npm_registry.auth())]
    before = len(npm_registry.requests())
    for method, path, auth in sent:
        httpx.request(method, f"{base}{path}", auth=auth, timeout=60)
    seen = [(r.method, r.path, r.status, r.user) for r in npm_registry.requests()[before:]]
    user = npm_registry.user
    assert seen == [("GET", "/is-number", 200, user), ("GET", "/is-number", 401, None), ("GET", "/-/ping", 200, None),
                    ("HEAD", "/is-number/-/is-number-7.0.0.tgz", 200, user), ("GET", "/is-number", 401, None),
                    ("GET", "/is-number/-/is-number-7.0.0.tgz", 200, user)]


def test_a_port_taken_before_it_binds_is_chosen_again(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        registry = Verdaccio(tmp_path, storage=tmp_path / "storage", uplink=f"http://127.0.0.1:{free_port()}/")
        registry._at(taken.getsockname()[1])
        registry.start()
        try:
            assert registry.port != taken.getsockname()[1]
            assert httpx.get(f"{registry.plain_url}-/ping", timeout=60).status_code == 200
        finally:
            registry.stop()
