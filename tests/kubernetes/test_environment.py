"""Test environments on the Kubernetes backend: a setup pod builds from the mirror through the index
tunnel, the environment is streamed to the host cache, and job pods get their own copy.

The API double runs each exec in a bubblewrap mount namespace with the pod's volumes at their real
paths (`real_paths=True`), so a venv built in the setup pod works unchanged in a job pod, as in a
cluster. The mirror is a real pypiserver on loopback with a canary password (tests/environment).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings
from sandbox import environment_stream
from sandbox.base import ENV_DIR, PUMP_PORT
from sandbox.environment_stream import EnvironmentRefused, receive_environment
from tests.doubles.kubernetes_api import KubernetesApiDouble
from tests.environment.test_setup_phase import CANARY, repo
from tests.environment.test_setup_phase import mirror as mirror  # a fixture, used by name
from tests.environment.test_setup_phase import roots as roots  # a fixture, used by name
from tests.kubernetes.conftest import NAMESPACE, PYTHON, wire_to_double
from tests.realrepos.mirror import PackageMirror
from worker import wiring
from worker.environment.builder import Environments

pytestmark = pytest.mark.bwrap


@pytest.fixture
def kube() -> Iterator[KubernetesApiDouble]:
    if shutil.which("bwrap") is None:
        pytest.skip("the double's real_paths mode needs bubblewrap (apt-get install bubblewrap)")
    with KubernetesApiDouble(real_paths=True) as double:
        yield double


@pytest.fixture
def k8s_settings(
    roots: tuple[Path, Path], mirror: PackageMirror, kube: KubernetesApiDouble, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """Settings for the Kubernetes backend, with wiring's options pointed at the double."""
    data, workspaces = roots
    settings = Settings(
        data_dir=data,
        workspace_dir=workspaces,
        pip_index_url=mirror.url_with_credentials,
        sandbox="kubernetes",
        sandbox_namespace=NAMESPACE,
    )
    wire_to_double(kube, monkeypatch, start_timeout_s=60.0)
    return settings


def environments(settings: Settings) -> Environments:
    return Environments(
        settings,
        lambda text: text.replace(CANARY, "[REDACTED]"),
        wiring.setup_opener(settings),
        scope="test:project",
    )


GITIGNORE = "_generated.py\n"
USES_BOTH = (
    "import unittest\nimport frogdep\nimport _generated\n\n"
    "class T(unittest.TestCase):\n    def test_it(self):\n"
    "        self.assertEqual((frogdep.VALUE, _generated.WHO), (42, 'setup'))\n"
)


# The double's pods share the host's loopback: a setup pod's index pump listens on PUMP_PORT there, a
# machine-wide port that another test's setup pod would hold at the same moment (a real pod has its own).
@pytest.mark.serial
def test_a_setup_pod_builds_from_the_mirror_through_the_tunnel_and_job_pods_use_it(
    k8s_settings: Settings, mirror: PackageMirror, kube: KubernetesApiDouble
) -> None:
    settings = k8s_settings
    checkout = repo(
        settings.resolved_workspace_dir() / "checkout",
        "frogdep==1.0\n",
        test=USES_BOTH,
        extra={".gitignore": GITIGNORE},
    )
    setup = "echo \"WHO = 'setup'\" > _generated.py"  # a git-ignored file the build writes, as hatch-vcs does
    report = environments(settings).for_checkout(checkout, "python3 -m unittest", setup, None)
    assert report.ok and report.built and not report.cached, (report.reason, report.log_tail)
    assert "frogdep-1.0-py3-none-any.whl" in mirror.downloads()  # through tunnel and relay, with the password

    # Three setup pods: resolve (16Mi of pins), the mirror's packages (the environment's 2Gi), the project's own
    # install (offline: no tunnel; the environment copied in, its layer in the runner's folder).
    setup_pods = [body for kind, body in kube.received if kind == "pods"]
    assert len(setup_pods) == 3

    def env_size(pod: dict[str, Any]) -> str:
        mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
        return next(v for v in pod["spec"]["volumes"] if v["name"] == mounts[ENV_DIR])["emptyDir"]["sizeLimit"]

    assert [env_size(pod) for pod in setup_pods] == ["16Mi", "2Gi", "2Gi"]
    policies = [body for kind, body in kube.received if kind == "networkpolicies"]
    assert policies and all(p["spec"]["egress"] == [] and p["spec"]["ingress"] == [] for p in policies)
    tunnel = [e for e in kube.execs if "--tunnel" in e.argv]
    assert len(tunnel) == 2 and all(str(PUMP_PORT) in t.argv for t in tunnel)
    for pod in setup_pods:
        env_names = {item["name"] for item in pod["spec"]["containers"][0]["env"]}
        assert not any(name.startswith("FROGFIX_") for name in env_names)
    assert report.path is not None and (report.path / "bin" / "python").is_symlink()
    assert report.project is not None and (report.project / "workspace" / "_generated.py").is_file()

    created = len([k for k, _ in kube.received if k == "pods"])
    with closing(wiring.open_job_sandbox(checkout, settings, environment=report.path, project=report.project)) as box:
        run = box.run_command("python3 -m unittest -v 2>&1; python3 -c 'import sys; print(sys.prefix)'", timeout=120)
    assert run.exit_code == 0 and "OK" in run.log and ENV_DIR in run.log, run.log
    job_pod = [body for kind, body in kube.received if kind == "pods"][created]
    job_mounts = [m["mountPath"] for m in job_pod["spec"]["containers"][0]["volumeMounts"]]
    assert ENV_DIR in job_mounts

    again = environments(settings).for_checkout(checkout, "python3 -m unittest", setup, None)
    # The environment is the cache's; the project's own install runs again (one pod), in the new job.
    assert again.ok and again.cached and len([k for k, _ in kube.received if k == "pods"]) == created + 2

    texts = json.dumps([body for _, body in kube.received]) + json.dumps([e.argv for e in kube.execs])
    assert CANARY not in texts
    leaked = [
        str(p)
        for base in (settings.data_dir, kube._base)
        for p in Path(base).rglob("*")
        if p.is_file() and not p.is_symlink() and CANARY.encode() in p.read_bytes()
    ]
    assert leaked == []


@pytest.mark.serial  # its setup pod's pump listens on PUMP_PORT on the host's loopback too (see above)
def test_a_failed_setup_pod_build_is_an_environment_error(k8s_settings: Settings, kube: KubernetesApiDouble) -> None:
    checkout = repo(k8s_settings.resolved_workspace_dir() / "checkout", "frogfix-no-such-package==3.1\n")
    report = environments(k8s_settings).for_checkout(checkout, "python3 -m unittest", None, None)
    assert not report.ok and "installing the declared dependencies failed" in report.reason
    assert "frogfix-no-such-package" in report.log_tail and CANARY not in json.dumps(report.to_dict())
    assert kube.names("pods", NAMESPACE) == []  # the setup pod is gone


# ----------------------------------------------------------------------------- what comes out of a setup pod


def stream(*entries: dict[str, Any], data: dict[str, bytes] | None = None, tail: bytes = b"") -> io.BytesIO:
    """A setup pod's stream as PACK writes it: a JSON header line per entry, a file's bytes after it."""
    out = bytearray()
    for header in entries:
        out += json.dumps(header).encode() + b"\n"
        if header.get("t") == "f":
            out += (data or {}).get(header["p"], b"")
    out += b'{"end": true}\n' + tail
    return io.BytesIO(bytes(out))


def test_a_venv_shaped_stream_is_kept_with_its_absolute_interpreter_link(tmp_path: Path) -> None:
    entries = stream(
        {"p": "bin", "t": "d"},
        {"p": "bin/python", "t": "l", "to": "/usr/bin/python3"},
        {"p": "bin/tool", "t": "f", "x": True, "n": 26},
        {"p": "pyvenv.cfg", "t": "f", "n": 16},
        data={"bin/tool": b"#!/frogfix/env/bin/python\n", "pyvenv.cfg": b"home = /usr/bin\n"},
    )
    assert receive_environment(entries, str(tmp_path), 10_000) == 4
    assert os.readlink(tmp_path / "bin" / "python") == "/usr/bin/python3"
    assert (tmp_path / "bin" / "tool").stat().st_mode & 0o7777 == 0o755
    assert (tmp_path / "pyvenv.cfg").read_bytes() == b"home = /usr/bin\n"


OUTSIDE = "/tmp/frogfix-escaped-by-a-setup-pod"
DEEP = "/".join(["d" * 250] * 20)


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([{"p": "../frogfix-escaped", "t": "f", "n": 0}], "bad entry name"),
        ([{"p": OUTSIDE, "t": "f", "n": 0}], "bad entry name"),
        ([{"p": "a/./b", "t": "d"}], "bad entry name"),
        ([{"p": "lib", "t": "l", "to": "/tmp"}, {"p": "lib/frogfix-escaped-by-a-setup-pod", "t": "f", "n": 0}],
         "parent is not a folder"),
        ([{"p": "bin", "t": "l", "to": OUTSIDE}, {"p": "bin", "t": "f", "n": 1}], "FileExistsError"),
        ([{"p": "x", "t": "f", "n": 0}, {"p": "x/y", "t": "f", "n": 0}], "parent is not a folder"),
        ([{"p": "missing/y", "t": "f", "n": 0}], "parent is not a folder"),
        ([{"p": "hard", "t": "h", "to": "/etc/passwd"}], "folders, files and links only"),
        ([{"p": "big", "t": "f", "n": 5000}], "FROGFIX_ENVIRONMENT_SIZE"),
        ([{"p": "bad", "t": "f", "n": -1}], "bad size"),
        ([{"p": "x", "t": "d", "pad": "y" * 20_000}], "longer than"),
        ([{"p": f"e{i}", "t": "d"} for i in range(3)], "FROGFIX_ENVIRONMENT_SIZE"),  # entries count too
        ([{"p": DEEP, "t": "f", "n": 0}], "bad entry name"),
    ],
)
def test_a_hostile_stream_is_refused(tmp_path: Path, entries: list[dict[str, Any]], why: str) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(EnvironmentRefused, match=why):
        receive_environment(stream(*entries), str(dest), 1200)
    assert not Path(OUTSIDE).exists() and not (tmp_path / "frogfix-escaped").exists()


def test_a_stream_that_goes_on_after_its_end_or_stops_early_is_refused(tmp_path: Path) -> None:
    for name, source in {
        "more": stream({"p": "a", "t": "d"}, tail=b"x" * 10),
        "short": io.BytesIO(b'{"p": "f", "t": "f", "n": 10}\nabc'),
        "unended": io.BytesIO(b'{"p": "a", "t": "d"}\n'),
        "garbage": io.BytesIO(b"\x00\xff not json\n"),
    }.items():
        dest = tmp_path / name
        dest.mkdir()
        with pytest.raises(EnvironmentRefused):
            receive_environment(source, str(dest), 10_000)


def test_the_pack_script_is_what_receive_reads(tmp_path: Path) -> None:
    """The pod's side (PACK, run by a real interpreter) and the host's side agree on the stream."""
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to("/usr/bin/python3")
    (env / "lib.py").write_text("X = 1\n")
    (env / "bin" / "run").write_bytes(b"#!/bin/sh\n" * 200_000)
    (env / "bin" / "run").chmod(0o755)
    packed = subprocess.run([PYTHON, "-I", "-S", "-c", environment_stream.PACK, str(env)], capture_output=True,
                            check=True).stdout
    dest = tmp_path / "dest"
    dest.mkdir()
    assert receive_environment(io.BytesIO(packed), str(dest), 10**8) == 4
    assert (dest / "lib.py").read_text() == "X = 1\n" and os.readlink(dest / "bin" / "python") == "/usr/bin/python3"
    assert (dest / "bin" / "run").read_bytes() == (env / "bin" / "run").read_bytes()
    assert os.access(dest / "bin" / "run", os.X_OK)


# Serial for the same reason as the test above: the setup pod's pump holds PUMP_PORT on the shared loopback.
@pytest.mark.serial
def test_a_setup_pod_installs_a_javascript_lockfile_from_the_npm_mirror_and_job_pods_get_node_modules(
    roots: tuple[Path, Path], kube: KubernetesApiDouble, npm_registry: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.environment.test_javascript_environment import PACKAGE, SOURCES, js_repo

    data, workspaces = roots
    settings = Settings(data_dir=data, workspace_dir=workspaces, npm_registry_url=npm_registry.url,
                        sandbox="kubernetes", sandbox_namespace=NAMESPACE)
    wire_to_double(kube, monkeypatch, start_timeout_s=60.0)
    checkout = js_repo(settings.resolved_workspace_dir() / "checkout", PACKAGE, SOURCES)
    before = len(npm_registry.requests())
    report = environments(settings).for_checkout(checkout, "node --test", None, None)
    assert report.ok and report.built and not report.cached, (report.reason, report.log_tail)
    assert ("is-number", "7.0.0") in npm_registry.served_tarballs(since=before)  # through tunnel and relay
    setup_pods = [body for kind, body in kube.received if kind == "pods"]
    assert len(setup_pods) == 1  # one install step; no project layer for JavaScript
    assert [e for e in kube.execs if "--tunnel" in e.argv]

    with closing(wiring.open_job_sandbox(checkout, settings, environment=report.path)) as box:
        command = "node -e \"console.log(require('is-number')(7))\"; git -c safe.directory='*' status --porcelain"
        run = box.run_command(command, timeout=120)
    assert run.exit_code == 0 and run.log.strip() == "true", run.log  # node_modules there, and not in git status
    texts = json.dumps([body for _, body in kube.received]) + json.dumps([e.argv for e in kube.execs])
    assert npm_registry.password not in texts
