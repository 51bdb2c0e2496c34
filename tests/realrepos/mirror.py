"""A real PEP 503 package index on loopback, standing in for the company's mirror.

pypiserver serves a folder of wheels and sdists behind HTTP basic auth (htpasswd) for both the
index and the downloads, with no fallback to PyPI: a package the folder lacks is a 404, as on an
air-gapped mirror, so a test proves that FrogFix built the environment from the mirror and nothing
else. `fill` downloads, once per wanted list, what the realrepos tasks need into a cache folder
outside the repository (pip from PyPI, isolated from the machine's pip config).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from packaging.requirements import Requirement

from tests.realrepos import LEGACY_BUILD_REQUIRES, Task
from tests.servers import free_port

USER = "frogfix-mirror"
PYPI = "https://pypi.org/simple"
MARKER = ".frogfix-filled.json"  # written last: a folder without it is half-filled, never served as filled
FILL_FORMAT = 1  # bump when what `fill` puts in a folder changes, so old caches are not reused

# The sandbox's interpreter: CPython 3.11 on Debian 12 (glibc 2.36), x86_64. pip does not widen a
# `manylinux_2_36` platform to the older glibc tags, so every tag that runs there is named.
MANYLINUX = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)]
PLATFORMS = [*MANYLINUX, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
TARGET_ARGS = (
    "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
    *(arg for platform in PLATFORMS for arg in ("--platform", platform)),
)
TARGET_MARKERS = {
    "python_version": "3.11", "python_full_version": "3.11.2", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
    "platform_machine": "x86_64", "os_name": "posix",
}
# Resolved with their dependencies besides each task's build backend: pip itself (a builder may
# upgrade it, werkzeug's env_notes do) and the newest pytest (a builder may add the test runner).
ALWAYS_RESOLVED = (("pip",), ("pytest",), LEGACY_BUILD_REQUIRES)
READY_SECONDS = 60.0  # pypiserver starts in about a second; a loaded CI runner gets far more room
# wsgiref's access line, which pypiserver routes into its log: the status is the one sent (401s included).
ACCESS_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3}) ')


@dataclass(frozen=True)
class Request:
    """One line of the mirror's access log."""

    method: str
    path: str
    status: int


@dataclass(frozen=True)
class Wanted:
    """What the mirror must serve: exact pins (no dependencies) and requirement sets resolved whole."""

    pins: tuple[str, ...]
    resolved: tuple[tuple[str, ...], ...]

    @property
    def key(self) -> str:
        """Names the cache folder: the same list on any machine fills the same folder."""
        blob = json.dumps([FILL_FORMAT, TARGET_ARGS, self.pins, self.resolved]).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def wanted(tasks: Iterable[Task]) -> Wanted:
    """Each task's env_freeze pins and applicable lock lines, plus its build backend with its dependencies.

    Build backends are resolved, not pinned, because pip and uv install them in an isolated build
    environment by their own `requires`; env_freeze never lists them.
    """
    pins: set[str] = set()
    resolved: set[tuple[str, ...]] = set(ALWAYS_RESOLVED)
    for task in tasks:
        pins.update(_pin(line) for line in task.pins)
        for line in task.locked:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(TARGET_MARKERS):
                pins.add(_pin(f"{requirement.name}{requirement.specifier}"))
        resolved.add(tuple(task.build_requires))
    return Wanted(tuple(sorted(pins)), tuple(sorted(resolved)))


def _pin(line: str) -> str:
    """`Name==1.0` in one spelling (PEP 503 name), so env_freeze and lock lines dedupe."""
    requirement = Requirement(line)
    name = re.sub(r"[-_.]+", "-", requirement.name).lower()
    if len(requirement.specifier) != 1 or next(iter(requirement.specifier)).operator != "==":
        raise ValueError(f"not an exact pin: {line!r}")
    return f"{name}{requirement.specifier}"


def cache_dir(want: Wanted) -> Path:
    """`$FROGFIX_TEST_MIRROR_CACHE/<key>` (default ~/.cache/frogfix-test-mirror): stable across runs."""
    base = os.environ.get("FROGFIX_TEST_MIRROR_CACHE") or str(Path.home() / ".cache" / "frogfix-test-mirror")
    return Path(base) / want.key


def is_filled(packages_dir: Path, want: Wanted) -> bool:
    """Only a folder whose marker names this very list counts; a killed fill left no marker."""
    try:
        marker = json.loads((packages_dir / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(marker.get("key") == want.key and all((packages_dir / f).is_file() for f in marker.get("files", [])))


def fill(packages_dir: Path, tasks: Sequence[Task]) -> Path:
    """Download what `tasks` need into `packages_dir` unless it is already filled for them.

    Pins go one pip call each (in parallel, `--no-deps`): a wheel for the target when one exists,
    else the sdist (docopt 0.6.2 has no wheel). Build backends go one resolving call per set.
    A lock file beside the folder keeps two fills (xdist workers, a bench) from racing.
    """
    want = wanted(tasks)
    packages_dir.mkdir(parents=True, exist_ok=True)
    with open(packages_dir.with_name(packages_dir.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_filled(packages_dir, want):
            return packages_dir
        (packages_dir / MARKER).unlink(missing_ok=True)
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            failures = [f for f in pool.map(lambda pin: _download_pin(packages_dir, pin), want.pins) if f]
        for group in want.resolved:
            done = _pip_download(packages_dir, [*TARGET_ARGS, "--only-binary=:all:", *group])
            if done.returncode != 0:
                failures.append(f"{' '.join(group)} (with dependencies):\n{done.stderr[-2000:]}")
        if failures:
            raise RuntimeError("could not fill the test mirror from PyPI:\n" + "\n".join(failures))
        files = sorted(p.name for p in packages_dir.iterdir() if p.is_file() and not p.name.startswith("."))
        note = {"key": want.key, "files": files, "pins": want.pins, "resolved": want.resolved,
                "seconds": round(time.monotonic() - started, 1)}
        (packages_dir / MARKER).write_text(json.dumps(note, indent=1))
    return packages_dir


def filled_cache(tasks: Sequence[Task]) -> Path:
    """The cache folder for `tasks`, filled (downloads happen on the first run only)."""
    return fill(cache_dir(wanted(tasks)), tasks)


def _download_pin(dest: Path, pin: str) -> str | None:
    """A wheel for the target, else the sdist; None when one of them came, else why not."""
    wheel = _pip_download(dest, [*TARGET_ARGS, "--only-binary=:all:", "--no-deps", pin])
    if wheel.returncode == 0:
        return None
    sdist = _pip_download(dest, [f"--no-binary={Requirement(pin).name}", "--no-deps", pin])
    if sdist.returncode == 0:
        return None
    return f"{pin}: no wheel ({wheel.stderr.strip()[-300:]}) and no sdist ({sdist.stderr.strip()[-300:]})"


def _pip_download(dest: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    """pip from PyPI alone: `--isolated` drops the machine's pip.conf and PIP_* (find-links, extra
    indexes, a constraints file) so what lands in the mirror came from PyPI and nowhere else."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    command = [sys.executable, "-m", "pip", "download", "--isolated", "--index-url", PYPI, "--no-input",
               "--progress-bar", "off", "--disable-pip-version-check", "--dest", str(dest), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


class PackageMirror:
    """pypiserver on 127.0.0.1 serving `packages_dir`; list and download need `frogfix-mirror:<password>`.

    Use as a context manager. `requests()` reads its access log (method and path of every request,
    the refused ones too) so a test can tell the environment really came from here. The log holds
    no header, so the password is not in it; the htpasswd file holds only its hash.
    """

    def __init__(self, packages_dir: Path, password: str) -> None:
        from passlib.apache import HtpasswdFile  # here, so collecting the tests needs no dev extra

        self.packages_dir = Path(packages_dir)
        self.password = password
        self.port = 0
        self._home = Path(tempfile.mkdtemp(prefix="frogfix-mirror-"))
        self._log = self._home / "access.log"
        self._proc: subprocess.Popen[bytes] | None = None
        # apr_md5_crypt (htpasswd's default): checked on every request, so a slow hash would slow every download.
        passwords = HtpasswdFile(str(self._home / "htpasswd"), new=True, default_scheme="apr_md5_crypt")
        passwords.set_password(USER, password)
        passwords.save()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple/"

    @property
    def url_with_credentials(self) -> str:
        return f"http://{USER}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/simple/"

    def start(self) -> PackageMirror:
        """Start on a free port; retry on another when the port was taken between choosing and binding."""
        last = ""
        for _ in range(3):
            self.port = free_port()
            self._proc = subprocess.Popen(self._command(), stdout=subprocess.DEVNULL,
                                          stderr=open(self._home / "stderr.log", "wb"),  # noqa: SIM115
                                          start_new_session=True)
            if self._wait_ready():
                return self
            last = (self._home / "stderr.log").read_text(errors="replace")[-2000:]
            self._terminate()
        self.stop()
        raise RuntimeError(f"pypiserver did not start:\n{last}")

    def _command(self) -> list[str]:
        return [
            sys.executable, "-m", "pypiserver", "run", "--host", "127.0.0.1", "--port", str(self.port),
            "--authenticate", "download,list", "--passwords", str(self._home / "htpasswd"), "--disable-fallback",
            "--hash-algo", "sha256", "--server", "wsgiref", "--health-endpoint", "/health",
            "-v", "--log-stream", "none", "--log-file", str(self._log), "--log-frmt", "%(message)s",
            "--log-req-frmt", "request %(REQUEST_METHOD)s %(PATH_INFO)s", "--log-res-frmt", "response %(status)s",
            str(self.packages_dir),
        ]

    def _wait_ready(self) -> bool:
        """Poll the health endpoint until it answers or the process dies; never a fixed sleep."""
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        return False

    def requests(self) -> list[Request]:
        """Every request answered so far, in order, with the status sent (the health polls too)."""
        try:
            text = self._log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        found = (ACCESS_LINE.search(line) for line in text.splitlines())
        return [Request(m["method"], m["path"], int(m["status"])) for m in found if m]

    def downloads(self) -> list[str]:
        """Names of the files served with 200 from /packages/: what a client really installed from here."""
        served = (r for r in self.requests() if r.path.startswith("/packages/") and r.status == 200)
        return [r.path.rsplit("/", 1)[-1] for r in served]

    def _terminate(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._proc = None

    def stop(self) -> None:
        self._terminate()
        shutil.rmtree(self._home, ignore_errors=True)

    def __enter__(self) -> PackageMirror:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
