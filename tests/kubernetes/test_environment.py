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
import tarfile
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings
from sandbox import kubernetes_environment
from sandbox.base import ENV_DIR, PUMP_PORT
from sandbox.kubernetes_environment import EnvironmentRefused, receive_environment
from tests.doubles.kubernetes_api import KubernetesApiDouble
from tests.environment.test_setup_phase import CANARY, repo
from tests.environment.test_setup_phase import mirror as mirror  # a fixture, used by name
from tests.environment.test_setup_phase import roots as roots  # a fixture, used by name
from tests.kubernetes.conftest import NAMESPACE, PYTHON
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
    real = wiring.sandbox_options

    def options(s: Settings) -> dict[str, Any]:
        return {
            **real(s),
            "configuration": kube.configuration(),
            "python": PYTHON,
            "reclaim": False,
            "start_timeout_s": 60.0,
            "delete_wait_s": 5.0,
        }

    monkeypatch.setattr(wiring, "sandbox_options", options)
    return settings


def environments(settings: Settings) -> Environments:
    return Environments(
        settings,
        lambda text: text.replace(CANARY, "[REDACTED]"),
        lambda ws, mounts, env, image: wiring.open_setup_sandbox(ws, settings, mounts, env, image),
        scope="test:project",
    )


GITIGNORE = "_generated.py\n"
USES_BOTH = (
    "import unittest\nimport frogdep\nimport _generated\n\n"
    "class T(unittest.TestCase):\n    def test_it(self):\n"
    "        self.assertEqual((frogdep.VALUE, _generated.WHO), (42, 'setup'))\n"
)


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

    setup_pod = kube.received[[kind for kind, _ in kube.received].index("pods")][1]
    spec = setup_pod["spec"]
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    volume = next(v for v in spec["volumes"] if v["name"] == mounts[ENV_DIR])
    assert volume["emptyDir"]["sizeLimit"] == "2Gi"
    policies = [body for kind, body in kube.received if kind == "networkpolicies"]
    assert policies and all(p["spec"]["egress"] == [] and p["spec"]["ingress"] == [] for p in policies)
    tunnel = [e for e in kube.execs if "--tunnel" in e.argv]
    assert len(tunnel) == 1 and str(PUMP_PORT) in tunnel[0].argv
    env_names = {item["name"] for item in spec["containers"][0]["env"]}
    assert not any(name.startswith("FROGFIX_") for name in env_names)
    assert report.path is not None and (report.path / "bin" / "python").is_symlink()

    created = len([k for k, _ in kube.received if k == "pods"])
    with closing(wiring.open_job_sandbox(checkout, settings, environment=report.path)) as box:
        run = box.run_command("python3 -m unittest -v 2>&1; python3 -c 'import sys; print(sys.prefix)'", timeout=120)
    assert run.exit_code == 0 and "OK" in run.log and ENV_DIR in run.log, run.log
    job_pod = [body for kind, body in kube.received if kind == "pods"][created]
    job_mounts = [m["mountPath"] for m in job_pod["spec"]["containers"][0]["volumeMounts"]]
    assert ENV_DIR in job_mounts

    again = environments(settings).for_checkout(checkout, "python3 -m unittest", setup, None)
    assert again.ok and again.cached and len([k for k, _ in kube.received if k == "pods"]) == created + 1

    texts = json.dumps([body for _, body in kube.received]) + json.dumps([e.argv for e in kube.execs])
    assert CANARY not in texts
    leaked = [
        str(p)
        for base in (settings.data_dir, kube._base)
        for p in Path(base).rglob("*")
        if p.is_file() and not p.is_symlink() and CANARY.encode() in p.read_bytes()
    ]
    assert leaked == []


def test_a_failed_setup_pod_build_is_an_environment_error(k8s_settings: Settings, kube: KubernetesApiDouble) -> None:
    checkout = repo(k8s_settings.resolved_workspace_dir() / "checkout", "frogfix-no-such-package==3.1\n")
    report = environments(k8s_settings).for_checkout(checkout, "python3 -m unittest", None, None)
    assert not report.ok and "installing the declared dependencies failed" in report.reason
    assert "frogfix-no-such-package" in report.log_tail and CANARY not in json.dumps(report.to_dict())
    assert kube.names("pods", NAMESPACE) == []  # the setup pod is gone


# ----------------------------------------------------------------------------- what comes out of a setup pod


def archive(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as out:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            out.addfile(info, io.BytesIO(data) if info.isreg() else None)
    buffer.seek(0)
    return buffer


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


def test_a_venv_shaped_stream_is_kept_with_its_absolute_interpreter_link(tmp_path: Path) -> None:
    stream = archive(
        (entry("env", tarfile.DIRTYPE, mode=0o755), b""),
        (entry("env/bin", tarfile.DIRTYPE, mode=0o755), b""),
        (entry("env/bin/python", tarfile.SYMTYPE, "/usr/bin/python3"), b""),
        (entry("env/bin/tool", mode=0o4755), b"#!/frogfix/env/bin/python\n"),
        (entry("env/pyvenv.cfg"), b"home = /usr/bin\n"),
    )
    assert receive_environment(stream, str(tmp_path), 10_000) == 4
    assert os.readlink(tmp_path / "bin" / "python") == "/usr/bin/python3"
    assert (tmp_path / "bin" / "tool").stat().st_mode & 0o7777 == 0o755  # no set-id bit kept


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([(entry("env/../../escaped"), b"x")], "outside"),
        ([(entry("/etc/frogfix-escaped"), b"x")], "outside env/"),
        ([(entry("env/lib", tarfile.SYMTYPE, "/etc"), b""), (entry("env/lib/frogfix-escaped"), b"x")], "refused"),
        ([(entry("env/bin", tarfile.SYMTYPE, "/etc"), b""), (entry("env/bin", mode=0o644), b"x")], "refused"),
        ([(entry("env/passwd", tarfile.LNKTYPE, "/etc/passwd"), b"")], "hard link"),
        ([(entry("env/dev", tarfile.CHRTYPE), b"")], "special file"),
        ([(entry("env/big"), b"x" * 2000)], "FROGFIX_ENVIRONMENT_SIZE"),
    ],
)
def test_a_hostile_stream_is_refused(tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], why: str) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(EnvironmentRefused, match=why):
        receive_environment(archive(*members), str(dest), 1000)
    assert not (tmp_path / "escaped").exists() and not Path("/etc/frogfix-escaped").exists()
    assert not Path("/etc/lib").exists()


def test_the_pack_script_is_what_receive_reads(tmp_path: Path) -> None:
    """The pod's side (PACK, run by a real interpreter) and the host's side agree on the stream."""
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to("/usr/bin/python3")
    (env / "lib.py").write_text("X = 1\n")
    packed = subprocess.run(
        [PYTHON, "-I", "-S", "-c", kubernetes_environment.PACK, str(env)], capture_output=True, check=True
    ).stdout
    dest = tmp_path / "dest"
    dest.mkdir()
    assert receive_environment(io.BytesIO(packed), str(dest), 10_000) == 3
    assert (dest / "lib.py").read_text() == "X = 1\n" and os.readlink(dest / "bin" / "python") == "/usr/bin/python3"
