"""The setup phase for real: a pypiserver mirror on loopback (with a password), bubblewrap, uv, the relay.

Each test builds a small repository whose test dependency (`frogdep`, a wheel made here) exists
only on the mirror, so an environment that imports it was built from the mirror and nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings
from tests.doubles.openai_server import ScriptedOpenAIServer
from tests.nonroot import NonRoot
from tests.realrepos.mirror import PackageMirror
from worker.environment.builder import Environments
from worker.wiring import open_job_sandbox, setup_opener

ROOT = Path(__file__).resolve().parents[2]
CANARY = "mirror-canary-7f3e91c2"
pytestmark = pytest.mark.bwrap


def wheel(folder: Path, name: str, version: str, module: str) -> Path:
    """A pure-Python wheel, written by hand (PEP 427): the mirror's only copy of `name`."""
    dist = f"{name}-{version}"
    files = {
        f"{name}/__init__.py": module,
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: frogfix-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    target = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return target


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageMirror]:
    packages = tmp_path_factory.mktemp("packages")
    wheel(packages, "frogdep", "1.0", "VALUE = 42\n")
    with PackageMirror(packages, CANARY) as served:
        yield served


@pytest.fixture
def roots() -> Iterator[tuple[Path, Path]]:
    """Data and workspace folders the sandbox's unprivileged uid can reach (pytest's tmp is 0700)."""
    base = Path("/tmp") / f"frogfix-test-env-{os.getpid()}-{os.urandom(3).hex()}"
    base.mkdir(mode=0o711)
    base.chmod(0o711)
    yield base / "data", base / "workspaces"
    shutil.rmtree(base, ignore_errors=True)


USES_FROGDEP = "import frogdep\n\ndef test_it():\n    assert frogdep.VALUE == 42\n"


def repo(path: Path, requirements: str, test: str = USES_FROGDEP, extra: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "requirements.txt").write_text(requirements)
    (path / "test_it.py").write_text(test)
    for name, text in (extra or {}).items():
        (path / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"],
                   check=True)
    path.chmod(0o755)
    return path


def settings_for(roots: tuple[Path, Path], mirror: PackageMirror) -> Settings:
    data, workspaces = roots
    return Settings(data_dir=data, workspace_dir=workspaces, pip_index_url=mirror.url_with_credentials)


def environments(settings: Settings, stages: list[tuple[str, str]] | None = None) -> Environments:
    seen = stages if stages is not None else []
    return Environments(
        settings, lambda text: text.replace(CANARY, "[REDACTED]"),
        setup_opener(settings),
        scope="test:project", on_event=lambda event: seen.append((event.kind.value, event.message)),
    )


class Listener:
    """A TCP listener on the host's loopback that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


PROBE = """import socket, sys
for port in sys.argv[1:]:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=3).close()
        print("reached", port)
        sys.exit(1)
    except OSError as exc:
        print("unreachable", port, type(exc).__name__)
"""


def test_the_environment_comes_from_the_mirror_and_the_host_packages_stay_out(
    roots: tuple[Path, Path], mirror: PackageMirror
) -> None:
    settings = settings_for(roots, mirror)
    checkout = repo(settings.resolved_workspace_dir() / "checkout", "frogdep==1.0\n")
    stages: list[tuple[str, str]] = []
    report = environments(settings, stages).for_checkout(checkout, "python3 -m unittest", None, None)
    assert report.ok and report.built and not report.cached, report
    assert report.path is not None and any(name == "frogdep-1.0-py3-none-any.whl" for name in mirror.downloads())
    assert ("environment_building", "building the test environment from the package mirror") in stages
    with closing(open_job_sandbox(checkout, settings, environment=report.path)) as box:
        used = box.run_command("python3 -c 'import frogdep, sys; print(frogdep.VALUE, sys.prefix)'", timeout=60)
        host = box.run_command("python3 -c 'import pytest'", timeout=60)  # python3-pytest is on the host
        probe = box.run_command(f"python3 -c '{PROBE}' {mirror.port} 3141", timeout=60)
    assert used.exit_code == 0 and "42 /frogfix/env" in used.log, used.log
    assert host.exit_code != 0 and "No module named 'pytest'" in host.log
    assert probe.exit_code == 0 and "reached" not in probe.log, probe.log  # the job's sandboxes reach nothing
    again = environments(settings).for_checkout(checkout, "python3 -m unittest", None, None)
    assert again.ok and again.cached and again.path == report.path
    (checkout / "requirements.txt").write_text("frogdep==1.0\n# changed\n")  # a patched dependency file
    changed = environments(settings).for_checkout(checkout, "python3 -m unittest", None, None)
    assert changed.ok and not changed.cached and changed.path == report.path  # resolved again: the same pins


def test_the_setup_phase_reaches_the_mirror_and_nothing_else(roots: tuple[Path, Path], mirror: PackageMirror) -> None:
    settings = settings_for(roots, mirror)
    other = Listener()
    try:
        checkout = repo(settings.resolved_workspace_dir() / "checkout", "frogdep==1.0\n", extra={"probe.py": PROBE})
        setup = f"python3 probe.py {other.port} {mirror.port} && python3 -c 'import frogdep'"
        report = environments(settings).for_checkout(checkout, "python3 -m unittest", setup, None)
        assert report.ok, report.log_tail  # the probe exits 1 if it reached a port
        assert other.accepted == 0
    finally:
        other.close()
    assert mirror.downloads()  # while the install itself reached the mirror, through the relay


def test_a_dependency_missing_from_the_mirror_is_an_environment_error(
    roots: tuple[Path, Path], mirror: PackageMirror
) -> None:
    settings = settings_for(roots, mirror)
    checkout = repo(settings.resolved_workspace_dir() / "checkout", "frogfix-no-such-package==3.1\n")
    report = environments(settings).for_checkout(checkout, "python3 -m unittest", None, None)
    assert not report.ok and "installing the declared dependencies failed" in report.reason
    assert "frogfix-no-such-package" in report.log_tail
    assert CANARY not in json.dumps(report.to_dict())


def run_fix(repo_dir: Path, roots: tuple[Path, Path], model_url: str, env: dict[str, str]) -> Any:
    data, workspaces = roots
    issue = data.parent / "issue.md"
    issue.write_text("test_it fails\n\nThe test fails.\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    environ.update({"FROGFIX_DATA_DIR": str(data), "FROGFIX_WORKSPACE_DIR": str(workspaces),
                    "FROGFIX_MODEL_BASE_URL": model_url, "FROGFIX_MODEL_NAME": "scripted", **env})
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), "fix", str(repo_dir), "--issue", str(issue),
                           "--json"], env=environ, capture_output=True, text=True, timeout=600)


def test_fix_ends_before_any_model_call_when_the_environment_cannot_be_built_and_leaks_no_password(
    roots: tuple[Path, Path], mirror: PackageMirror
) -> None:
    checkout = repo(roots[0].parent / "checkout", "frogfix-no-such-package==3.1\n")
    with ScriptedOpenAIServer([]) as model:
        proc = run_fix(checkout, roots, model.base_url, {"FROGFIX_PIP_INDEX_URL": mirror.url_with_credentials})
        calls = len(model.requests)
    assert proc.returncode == 3, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "environment_error" and out["usage"]["calls"] == 0 and calls == 0
    env = out["environment"]
    assert env["ok"] is False and "frogfix-no-such-package" in env["log_tail"] and env["reason"]
    assert "environment error: installing the declared dependencies failed" in proc.stderr
    leaked = [str(p) for p in roots[0].parent.rglob("*") if p.is_file() and not p.is_symlink()
              and CANARY.encode() in p.read_bytes()]
    assert CANARY not in proc.stdout + proc.stderr and leaked == []


def test_fix_ends_before_any_model_call_when_the_base_tests_cannot_start(roots: tuple[Path, Path]) -> None:
    """No mirror at all: the host's pytest refuses the repository's option (exit 4), so nothing can be verified."""
    checkout = repo(roots[0].parent / "checkout", "", test="def test_it():\n    assert True\n",
                    extra={"pytest.ini": "[pytest]\naddopts = --frogfix-no-such-option\n"})
    with ScriptedOpenAIServer([]) as model:
        proc = run_fix(checkout, roots, model.base_url, {})
        calls = len(model.requests)
    out = json.loads(proc.stdout)
    assert out["status"] == "environment_error" and calls == 0 and out["usage"]["calls"] == 0, proc.stderr
    assert "usage error" in out["environment"]["reason"] and out["tests"]["before"]["exit_code"] == 4
    assert "environment error: the tests could not start on the base commit" in proc.stderr


def test_a_non_root_worker_builds_the_environment_and_its_sandboxes_use_it(
    nonroot: NonRoot, mirror: PackageMirror
) -> None:
    """The shipped worker image runs as a plain user: the setup sandbox, relay and cache work there too."""
    base = nonroot.folder("environment-")
    out = nonroot.run_json(Path(__file__).with_name("nonroot_setup.py"), str(base), mirror.url_with_credentials,
                           timeout=600)
    assert out["report"]["ok"] and out["report"]["built"], out["report"]
    assert "42 /frogfix/env" in out["used"], out["used"]
    leaked = [str(p) for p in base.rglob("*")
              if p.is_file() and not p.is_symlink() and CANARY.encode() in p.read_bytes()]
    assert leaked == [] and CANARY not in json.dumps(out)


def test_a_patched_declarations_environment_serves_that_checkout_alone_and_is_never_cached(
    roots: tuple[Path, Path], mirror: PackageMirror
) -> None:
    """An environment built because a patch changed the declarations is the job's own: gone with it."""
    settings = settings_for(roots, mirror)
    checkout = repo(settings.resolved_workspace_dir() / "checkout", "frogdep==1.0\n# patched\n")
    job = environments(settings)
    report = job.for_checkout(checkout, "python3 -m unittest", None, None, trusted=False)
    assert report.ok and report.built and not report.cached, report
    root = settings.resolved_environment_dir()
    assert report.path is not None and root not in (report.path.parent, report.path.parent.parent)
    assert [p.name for p in root.iterdir() if len(p.name) == 64] == []  # no entry in the cache
    assert not list((root / "resolved").glob("*.json")) if (root / "resolved").exists() else True
    later = environments(settings).for_checkout(checkout, "python3 -m unittest", None, None)  # a trusted base now
    assert later.ok and not later.cached and later.path != report.path
    job.close()
    assert not report.path.exists()
