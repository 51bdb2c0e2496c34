"""A JavaScript repository's environment as `fix` meets it: from the npm mirror only, or an
`environment_error` before any model call that says why, and the mirror's password nowhere.

The mirror is a real Verdaccio on loopback (tests/npm_registry.py) where one is needed; the cases that
end before any download need none.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.openai_server import ScriptedOpenAIServer, assistant
from tests.environment.test_setup_phase import Listener
from tests.realrepos import run_fix as realrepos_fix

pytestmark = pytest.mark.bwrap


@pytest.fixture
def roots() -> Iterator[Path]:
    """A base folder the sandbox's unprivileged uid can reach (pytest's tmp is 0700)."""
    base = Path("/tmp") / f"frogfix-test-js-{os.getpid()}-{os.urandom(3).hex()}"
    base.mkdir(mode=0o711)
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def js_repo(path: Path, package: dict[str, Any], files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    (path / "package.json").write_text(json.dumps(package, indent=2))
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    subprocess.run("git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm base",
                   shell=True, cwd=path, check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(path)], check=True)
    return path


def run_fix(repo: Path, base: Path, model_url: str, registry: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """`manage.py fix --json` on `repo` with `registry` as the only mirror (the realrepos tests' one runner)."""
    issue = base / "issue.md"
    issue.write_text("add() is wrong\n\nIt subtracts.\n")
    return realrepos_fix(repo, issue, data_dir=base / "data", workspace_dir=base / "ws", model_url=model_url,
                         npm_registry_url=registry, timeout=600)


IS_NUMBER_INTEGRITY = (
    "sha512-41Cifkg6e8TylSpdtTpeLVMqvSBEVzTttHvERD741+pnZ8ANv0004MRL43QKPDlK9cGvNp6NZWZUBlbGXYxxng=="
)
PACKAGE = {"name": "calc", "version": "1.0.0", "scripts": {"test": "node --test"},
           "devDependencies": {"is-number": "7.0.0"}}
LOCK = json.dumps({
    "name": "calc", "version": "1.0.0", "lockfileVersion": 3, "requires": True,
    "packages": {
        "": {"name": "calc", "version": "1.0.0", "devDependencies": {"is-number": "7.0.0"}},
        "node_modules/is-number": {
            "version": "7.0.0", "resolved": "https://registry.npmjs.org/is-number/-/is-number-7.0.0.tgz",
            "integrity": IS_NUMBER_INTEGRITY,
            "dev": True, "license": "MIT", "engines": {"node": ">=0.12.0"},
        },
    },
}, indent=2)
SOURCES = {
    "package-lock.json": LOCK,
    "calc.js": "exports.add = (a, b) => a - b;\n",
    "test/calc.test.js": (
        "const test = require('node:test');\nconst assert = require('node:assert');\n"
        "const isNumber = require('is-number');\nconst { add } = require('../calc');\n"
        "test('adds', () => { assert.ok(isNumber(add(1, 2))); assert.strictEqual(add(1, 2), 3); });\n"
    ),
}


def ends_before_the_model(proc: subprocess.CompletedProcess[str], out: Any, model: ScriptedOpenAIServer) -> str:
    assert out is not None, proc.stderr[-3000:]
    assert out["status"] == "environment_error", json.dumps(out, indent=1)[-3000:]
    assert out["usage"]["calls"] == 0 and not [r for r in model.requests if b"chat/completions" in r[:200]]
    return str(out["environment"]["reason"])


def test_no_registry_set_ends_the_job_before_the_model_saying_so(roots: Path) -> None:
    repo = js_repo(roots / "repo", PACKAGE, SOURCES)
    with ScriptedOpenAIServer([assistant("done")]) as model:
        proc, out = run_fix(repo, roots, model.base_url, "")
        reason = ends_before_the_model(proc, out, model)
    assert "FROGFIX_NPM_REGISTRY_URL is not set" in reason, reason


def test_a_git_dependency_ends_the_job_naming_it(roots: Path) -> None:
    package = {**PACKAGE, "dependencies": {"left-pad": "git+https://git.example.com/left-pad.git#v1"}}
    repo = js_repo(roots / "repo", package, SOURCES)
    door = Listener()
    with ScriptedOpenAIServer([assistant("done")]) as model:
        proc, out = run_fix(repo, roots, model.base_url, f"http://127.0.0.1:{door.port}/")
        reason = ends_before_the_model(proc, out, model)
    assert "left-pad (git+https://git.example.com/left-pad.git#v1)" in reason and "mirror cannot serve" in reason
    assert door.accepted == 0  # nothing was fetched: the plan refused it first


def test_an_unreachable_registry_ends_the_job_with_the_reason_and_no_password(roots: Path) -> None:
    repo = js_repo(roots / "repo", PACKAGE, SOURCES)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    canary = "npm-canary-5c1d9e"
    with ScriptedOpenAIServer([assistant("done")]) as model:
        proc, out = run_fix(repo, roots, model.base_url, f"http://frogfix:{canary}@127.0.0.1:{port}/npm/")
        reason = ends_before_the_model(proc, out, model)
    assert "installing the lockfile's packages failed" in reason and "did not answer" in reason, reason
    assert canary not in proc.stdout + proc.stderr
    leaked = subprocess.run(["grep", "-rl", canary, str(roots)], capture_output=True, text=True).stdout
    assert leaked == "", leaked


def test_a_registry_refusing_the_password_ends_the_job_naming_the_refusal(roots: Path, npm_registry: Any) -> None:
    repo = js_repo(roots / "repo", PACKAGE, SOURCES)
    wrong = f"http://{npm_registry.user}:wrong-password-4d2a@127.0.0.1:{npm_registry.port}/"
    with ScriptedOpenAIServer([assistant("done")]) as model:
        proc, out = run_fix(repo, roots, model.base_url, wrong)
        reason = ends_before_the_model(proc, out, model)
    assert "installing the lockfile's packages failed" in reason, reason
    assert "HTTP 401: it refused FrogFix's credentials" in reason, reason
    assert "wrong-password-4d2a" not in proc.stdout + proc.stderr


PRIVATE = "@company/frog-pad"
PRIVATE_FILES = {"index.js": "module.exports = (s) => `frog:${s}`;\n"}


def environment_run(repo: Path, base: Path, registry: str, command: str) -> tuple[Any, str]:
    """The checkout's environment built from `registry`, then `command` in a job sandbox over a copy."""
    from contextlib import closing

    from app.settings import Settings
    from worker.environment.builder import Environments
    from worker.wiring import open_job_sandbox, setup_opener

    settings = Settings(data_dir=base / "data", workspace_dir=base / "ws", npm_registry_url=registry)
    environments = Environments(settings, lambda text: text, setup_opener(settings), scope="test:js")
    report = environments.for_checkout(repo, None, None, None)
    if not report.ok:
        return report, ""
    copy = base / "copy"
    shutil.copytree(repo, copy, symlinks=True)
    subprocess.run(["chmod", "-R", "a+rX", str(copy)], check=True)
    with closing(open_job_sandbox(copy, settings, None, environment=report.path)) as box:
        return report, box.run_command(command, timeout=300).log


def test_scoped_packages_come_from_the_mirror_whatever_the_repositorys_npmrc_says(
    roots: Path, npm_registry: Any
) -> None:
    from tests.npm_registry import publish

    integrity = publish(npm_registry, PRIVATE, "1.0.0", PRIVATE_FILES)
    door = Listener()
    elsewhere = f"http://127.0.0.1:{door.port}/"
    lock = json.loads(LOCK)
    lock["packages"][""]["dependencies"] = {PRIVATE: "1.0.0"}
    lock["packages"][f"node_modules/{PRIVATE}"] = {
        "version": "1.0.0", "resolved": f"https://registry.npmjs.org/{PRIVATE}/-/frog-pad-1.0.0.tgz",
        "integrity": integrity, "license": "MIT",
    }
    npmrc = f"registry={elsewhere}\n@company:registry={elsewhere}\n//127.0.0.1:{door.port}/:_authToken=abc\n"
    repo = js_repo(roots / "repo", {**PACKAGE, "dependencies": {PRIVATE: "1.0.0"}},
                   {**SOURCES, "package-lock.json": json.dumps(lock), ".npmrc": npmrc})
    before = len(npm_registry.requests())
    report, log = environment_run(
        repo, roots, npm_registry.url,
        f"node -e \"console.log(require('{PRIVATE}')('ok'), require('is-number')(3))\"",
    )
    assert report.ok, report.to_dict()
    assert "frog:ok true" in log, log
    assert door.accepted == 0  # the repository's .npmrc sent nothing elsewhere
    served = npm_registry.served_tarballs(since=before)
    assert (PRIVATE, "1.0.0") in served and ("is-number", "7.0.0") in served, served
    leaked = subprocess.run(["grep", "-rl", npm_registry.password, str(roots)], capture_output=True, text=True)
    assert leaked.stdout == "", leaked.stdout


def test_a_yarn_berry_repository_is_installed_by_the_yarn_it_names_from_the_mirror(
    roots: Path, npm_registry: Any
) -> None:
    """The lockfile is made here by Yarn 4 itself (from the mirror); its .yarnrc.yml names a yarnPath the
    repository does not have, a plugin and another registry: none of them is used."""
    tools = roots / "tools"
    tools.mkdir()
    (tools / ".npmrc").write_text(npm_registry.npmrc())
    host = {"PATH": os.environ["PATH"], "HOME": str(roots / "home"), "npm_config_cache": str(roots / "npm-cache")}
    done = subprocess.run(["npm", "install", "--ignore-scripts", "--no-audit", "--no-fund", "@yarnpkg/cli-dist@4.5.3"],
                          cwd=tools, env=host, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    yarn = tools / "node_modules/@yarnpkg/cli-dist/bin/yarn.js"
    repo = roots / "repo"
    repo.mkdir()
    (repo / "package.json").write_text(json.dumps({**PACKAGE, "packageManager": "yarn@4.5.3"}))
    (repo / ".yarnrc.yml").write_text(json.dumps({
        "npmRegistryServer": npm_registry.plain_url.rstrip("/"), "unsafeHttpWhitelist": ["127.0.0.1"],
        "npmAuthIdent": f"{npm_registry.user}:{npm_registry.password}", "npmAlwaysAuth": True,
        "nodeLinker": "node-modules", "enableGlobalCache": False, "enableTelemetry": False,
    }))
    (repo / "yarn.lock").touch()
    made = subprocess.run(["node", str(yarn), "install"], cwd=repo, env={**host, "YARN_ENABLE_IMMUTABLE_INSTALLS": "0"},
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout[-2000:]
    door = Listener()
    (repo / ".yarnrc.yml").write_text(
        f"yarnPath: .yarn/releases/yarn-evil.cjs\nnpmRegistryServer: http://127.0.0.1:{door.port}\n"
        "plugins:\n  - path: .yarn/plugins/evil.cjs\nnodeLinker: pnp\n"
    )
    shutil.rmtree(repo / "node_modules")
    for name, text in SOURCES.items():
        if name != "package-lock.json":
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)
    subprocess.run("git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm base",
                   shell=True, cwd=repo, check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(repo)], check=True)
    before = len(npm_registry.requests())
    command = "(cd /tmp && yarn --version); node --test 2>&1 | tail -9"
    report, log = environment_run(repo, roots, npm_registry.url, command)
    assert report.ok, (report.reason, report.log_tail)
    assert report.detected[0].startswith("yarn 4.5.3"), report.detected
    assert "4.5.3" in log and "fail 1" in log, log  # the test runs (and fails on the bug): is-number resolved
    served = npm_registry.served_tarballs(since=before)
    assert ("is-number", "7.0.0") in served and ("@yarnpkg/cli-dist", "4.5.3") in served, served
    assert door.accepted == 0


def test_a_non_root_worker_installs_the_lockfile_and_its_sandboxes_use_it(nonroot: Any, npm_registry: Any) -> None:
    """The shipped worker image runs as a plain user: the setup sandbox, the relay's npm mode and the binds work."""
    base = nonroot.folder("javascript-")
    out = nonroot.run_json(Path(__file__).with_name("nonroot_javascript.py"), str(base), npm_registry.url,
                           timeout=600)
    assert out["report"]["ok"] and out["report"]["built"], out["report"]
    lines = out["used"].splitlines()
    assert lines[0] == "true" and lines[-1] == "READ-ONLY", out["used"]  # installed, and never writable
    leaked = [str(p) for p in base.rglob("*")
              if p.is_file() and not p.is_symlink() and npm_registry.password.encode() in p.read_bytes()]
    assert leaked == [] and npm_registry.password not in json.dumps(out)


def test_a_dependency_whose_install_script_downloads_ends_the_environment_naming_it(
    roots: Path, npm_registry: Any
) -> None:
    """Its own postinstall fetches a binary from elsewhere: the setup sandbox reaches nothing but the mirror, so the
    script fails and the environment says which dependency; the repository's own scripts never ran at all."""
    from tests.npm_registry import publish

    door = Listener()
    fetch = (  # the same bytes every run: the mirror's storage keeps a published version for good
        "require('https').get('https://downloads.example.com/binary', () => process.exit(0))"
        ".on('error', (e) => { console.error('download failed: ' + e.code); process.exit(1); });\n"
    )
    manifest = {"name": "@company/needs-binary", "version": "1.0.1", "main": "index.js", "license": "MIT",
                "scripts": {"postinstall": "node fetch.js"}}
    integrity = publish(npm_registry, "@company/needs-binary", "1.0.1",
                        {"package.json": json.dumps(manifest), "fetch.js": fetch, "index.js": "module.exports = 1;\n"})
    lock = json.loads(LOCK)
    lock["packages"][""]["dependencies"] = {"@company/needs-binary": "1.0.1"}
    lock["packages"]["node_modules/@company/needs-binary"] = {
        "version": "1.0.1", "hasInstallScript": True, "integrity": integrity, "license": "MIT",
        "resolved": "https://registry.npmjs.org/@company/needs-binary/-/needs-binary-1.0.1.tgz",
    }
    own = {**PACKAGE, "dependencies": {"@company/needs-binary": "1.0.1"},
           "scripts": {**PACKAGE["scripts"], "postinstall": f"node -e \"require('http').get('http://127.0.0.1:{door.port}/own')\""}}
    repo = js_repo(roots / "repo", own, {**SOURCES, "package-lock.json": json.dumps(lock)})
    report, _ = environment_run(repo, roots, npm_registry.url, "true")
    assert not report.ok, report.to_dict()
    assert "the install script of the dependency @company/needs-binary failed" in report.reason, report.reason
    assert "download failed" in report.log_tail, report.log_tail
    assert door.accepted == 0  # neither the dependency's download nor the repository's own postinstall got out
