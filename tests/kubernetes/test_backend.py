"""The Kubernetes sandbox against the API double: what it creates, in which order, how it talks to
the runner, how it recovers a broken stream, and that it cleans up whatever happens."""

from __future__ import annotations

import math
import os
import subprocess
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest

from sandbox import PatchTooLarge, SandboxError, SandboxSpec, SandboxUnavailable, open_sandbox
from sandbox.base import SandboxLimits, SetupMounts
from sandbox.kubernetes import KubernetesSandbox
from sandbox.kubernetes_manifests import DEFAULT_IMAGE, INIT, LABEL_SANDBOX, RUNNER_PATH
from tests.doubles.kubernetes_api import V4, KubernetesApiDouble
from tests.kubernetes.conftest import NAMESPACE, TEST_LIMITS, MakeSandbox, sandbox_options
from tests.sandbox import forged_replies
from tests.sandbox.support import init_repo, leaf_bash

CALC = "def add(a, b):\n    return a - b\n"


def only(items: list[dict]) -> dict:
    assert len(items) == 1, items
    return items[0]


def wait_for(condition: object, timeout: float = 10.0) -> None:
    """Poll a condition the test cannot be told about (a file a command creates in the pod)."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def assert_all_gone(kube: KubernetesApiDouble) -> None:
    assert kube.objects("pods", NAMESPACE) == []
    assert kube.objects("networkpolicies", NAMESPACE) == []


def pod_gone_before_policy_deleted(kube: KubernetesApiDouble, pod: str, policy: str) -> None:
    verbs = kube.verbs()
    assert verbs.index(("vanish", "pods", pod)) < verbs.index(("delete", "networkpolicies", policy))


# ------------------------------------------------------------------------------ what it creates


def test_policy_exists_before_the_pod_and_denies_everything(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    sb = make_k8s(workspace, labels={"frogfix/job": "42", "frogfix/attempt": "2"})
    verbs = kube.verbs()
    assert verbs[:2] == [("create", "networkpolicies", sb.name), ("create", "pods", sb.name)]
    policy = only(kube.objects("networkpolicies", NAMESPACE))
    pod = only(kube.objects("pods", NAMESPACE))
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {LABEL_SANDBOX: sb.name}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [],
    }
    assert pod["metadata"]["labels"][LABEL_SANDBOX] == sb.name  # the policy selects this pod


def test_pod_spec_has_every_hardening_field(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FROGFIX_GITLAB_TOKEN", "glpat-canary-token-0123456789")
    monkeypatch.setenv("GITEA_TOKEN", "gitea-canary-token-0123456789")
    limits = SandboxLimits(wall_seconds=1234.5, memory_bytes=3 * 1024**3)
    started = time.monotonic()
    sb = make_k8s(
        workspace,
        limits=limits,
        env={"CI": "1"},
        labels={"frogfix/job": "42", "frogfix/attempt": "2"},
        cpus=1.5,
        ephemeral_storage="8Gi",
    )
    pod = only(kube.objects("pods", NAMESPACE))
    spec = pod["spec"]
    assert pod["metadata"]["labels"]["frogfix/job"] == "42"
    assert pod["metadata"]["labels"]["frogfix/attempt"] == "2"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    # The wall limit, less the start before the pod was made (the first sandbox of a process imports the client).
    assert math.ceil(1234.5 - (time.monotonic() - started)) <= spec["activeDeadlineSeconds"] <= math.ceil(1234.5)
    assert spec["hostNetwork"] is False and spec["hostPID"] is False and spec["hostIPC"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "serviceAccountName" not in spec
    container = only(spec["containers"])
    assert container["image"] == DEFAULT_IMAGE
    ctx = container["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["privileged"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    resources = container["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "1500m", "memory": "3Gi", "ephemeral-storage": "8Gi"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for path in ("/workspace", "/tmp"):
        assert "sizeLimit" in volumes[mounts[path]]["emptyDir"]
    assert all(set(v) == {"name", "emptyDir"} for v in spec["volumes"])  # no secret, hostPath or projected volume
    assert "envFrom" not in container
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"HOME": "/tmp/home", "LANG": "C.UTF-8", "CI": "1"}
    assert "canary" not in str(kube.received)
    # ...and inside, the runner sees only that environment (plus what the runtime adds).
    assert sb.call_tool("Bash", {"command": "env | grep -c -i -e canary -e FROGFIX_ -e GITLAB_ -e GITEA_"}) == (
        leaf_bash(1, "0\n", "")
    )


def test_image_comes_from_the_spec_or_the_default(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    make_k8s(workspace, image="registry.example.com/team/py311:3")
    make_k8s(workspace, default_image="registry.example.com/frogfix-sandbox:py3.12")
    images = sorted(only(p["spec"]["containers"])["image"] for p in kube.objects("pods", NAMESPACE))
    assert images == ["registry.example.com/frogfix-sandbox:py3.12", "registry.example.com/team/py311:3"]


@pytest.mark.parametrize("key", ["FROGFIX_GITLAB_TOKEN", "GITLAB_TOKEN", "gitea_token", "BAD=NAME"])
def test_secrets_and_forge_variables_never_reach_the_api(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path, key: str
) -> None:
    with pytest.raises(ValueError):
        make_k8s(workspace, env={key: "x"})
    assert kube.events == []


def test_workspace_goes_in_as_one_tar_stream_and_the_runner_is_one_long_stream(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    init_repo(workspace, {"src/calc.py": CALC, "big.bin": os.urandom(3 * 1024**2)})
    os.link(workspace / "src/calc.py", workspace / "src/hard.py")
    os.symlink("/etc/hostname", workspace / "abs-link")
    sb = make_k8s(workspace)
    upload, runner = kube.execs
    assert upload.argv[-3:] == ["/workspace", "/frogfix", "/tmp/home"] and upload.exit_code == 0
    assert upload.stdin_bytes > 3 * 1024**2
    assert "/frogfix/runner.py" in runner.argv and runner.exit_code is None
    requests, messages = kube.counters["requests"], kube.counters["stream_messages"]
    for _ in range(20):
        assert (
            sb.call_tool("Read", {"file_path": "src/hard.py"}) == "src/hard.py\n1. def add(a, b):\n2.     return a - b"
        )
    assert kube.counters["requests"] == requests  # no new API request per call...
    assert kube.counters["stream_messages"] == messages + 20  # ...one message on the open stream
    assert len(kube.execs) == 2
    out = sb.call_tool("Bash", {"command": "stat -c %h src/hard.py; readlink abs-link; stat -c %s big.bin"})
    assert out == leaf_bash(0, f"2\n/etc/hostname\n{3 * 1024**2}\n", "")


def test_patch_and_commands_run_inside_and_the_host_workspace_stays_untouched(
    make_k8s: MakeSandbox, workspace: Path
) -> None:
    base = init_repo(workspace, {"src/calc.py": CALC})
    sb = make_k8s(workspace)
    sb.call_tool("Edit", {"file_path": "src/calc.py", "old_string": "a - b", "new_string": "a + b"})
    result = sb.run_command(
        "python3 -B -c 'import sys; sys.path.insert(0, \"src\"); import calc; print(calc.add(2, 3))'", 30
    )
    assert (result.exit_code, result.log, result.timed_out) == (0, "5\n", False)
    patch = sb.patch(base)
    assert patch.startswith("diff --git a/src/calc.py b/src/calc.py\n")
    assert "-    return a - b\n+    return a + b\n" in patch
    assert (workspace / "src/calc.py").read_text() == CALC


def test_commands_in_the_pod_cannot_reach_the_runner_channel(make_k8s: MakeSandbox, workspace: Path) -> None:
    """Issue 12, finding 1, in a pod: the runner is an exec'd process with its commands' uid, not
    pid 1, so its own non-dumpable flag is the wall: no open of /proc/<runner>/fd/*, no
    /proc/<runner>/mem, no pidfd_getfd, no ptrace, and the next replies are the runner's."""
    base = init_repo(workspace, {"probe.py": forged_replies.PROBE, "calc.py": CALC})
    sb = make_k8s(workspace)
    runner = sb.runner_info["pid"]
    # Request ids count from 1 after the start's ping: the probe forges from its own on.
    report = forged_replies.probe_report(sb.run_command(f"exec python3 -B probe.py 1 {runner}", 60).log)
    assert isinstance(report, dict), f"a forged reply replaced the probe's output: {report!r}"
    assert report["pids"] == [runner]
    assert (report["opened"], report["mem"], report["getfd"], report["ptrace"]) == ([], [], [], []), report
    failing = sb.run_command("echo real-failure; exit 1", 30)
    assert (failing.exit_code, failing.log) == (1, "real-failure\n")
    assert forged_replies.FORGED_MARK not in sb.patch(base)


def test_a_patch_over_the_limit_is_patch_too_large_and_no_replay_entry(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    base = init_repo(workspace, {"a.txt": "a\n"})
    sb = make_k8s(workspace, max_patch_bytes=2000)
    sb.call_tool("Write", {"file_path": "big.txt", "content": "x" * 5000})
    with pytest.raises(PatchTooLarge) as caught:
        sb.patch_bytes(base)
    assert caught.value.limit == 2000
    assert str(caught.value) == "sandbox runner: ValueError: the patch is larger than 2000 bytes"
    sb.call_tool("Write", {"file_path": "big.txt", "content": "small\n"})
    kube.break_streams()  # the refused patch is not replayed; the sandbox goes on
    assert "+small" in sb.patch(base)
    assert sb.recoveries == 1


def test_factory_opens_the_kubernetes_backend(kube: KubernetesApiDouble, workspace: Path) -> None:
    (workspace / "a.txt").write_text("hi\n")
    spec = SandboxSpec(workspace=str(workspace), limits=TEST_LIMITS)
    with open_sandbox(spec, "kubernetes", *sandbox_options(kube)) as sb:
        assert isinstance(sb, KubernetesSandbox)
        assert sb.call_tool("Read", {"file_path": "a.txt"}) == "a.txt\n1. hi"
    assert_all_gone(kube)


def test_a_setup_pod_never_runs_its_runner_with_reclaim(
    kube: KubernetesApiDouble, workspace: Path, tmp_path: Path
) -> None:
    """A setup pod's runner must not kill every other process of the pod (the index tunnel is one), even
    where the options ask for --reclaim; the double refuses --reclaim, so the pod starts only without it."""
    files = tmp_path / "setup-files"
    files.mkdir()
    (files / "build.sh").write_text("true\n")
    setup = SetupMounts(env_size_bytes=16 * 1024**2, files=str(files), relay=None, out=str(tmp_path / "out"))
    spec = SandboxSpec(workspace=str(workspace), limits=TEST_LIMITS, setup=setup)
    with closing(KubernetesSandbox(spec, *sandbox_options(kube, reclaim=True))) as sb:
        assert (sb.reclaim, sb.max_recoveries) == (False, 0)
        assert sb.ping()["pong"] is True
    runners = [e.argv for e in kube.execs if RUNNER_PATH in e.argv]
    assert len(runners) == 1 and "--reclaim" not in runners[0]
    assert_all_gone(kube)


def test_v4_stream_protocol_works_too(kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path) -> None:
    kube.protocols = (V4,)
    base = init_repo(workspace, {"a.txt": "one\n"})
    sb = make_k8s(workspace)
    assert {e.protocol for e in kube.execs} == {V4}
    sb.call_tool("Write", {"file_path": "a.txt", "content": "two\n"})
    assert "+two" in sb.patch(base)


def test_pod_that_starts_slowly_is_waited_for(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    kube.pending_polls = 3
    sb = make_k8s(workspace)
    assert kube.verbs().count(("get", "pods", sb.name)) == 4
    assert sb.ping()["pong"] is True


def test_two_sandboxes_in_parallel_threads(kube: KubernetesApiDouble, make_k8s: MakeSandbox, tmp_path: Path) -> None:
    results: dict[int, list[str]] = {}

    def work(n: int) -> None:
        folder = tmp_path / f"ws{n}"
        folder.mkdir()
        (folder / "n.txt").write_text(f"{n}\n")
        sb = make_k8s(folder)
        results[n] = [sb.call_tool("Bash", {"command": "cat n.txt"}) for _ in range(10)]

    threads = [threading.Thread(target=work, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == {n: [leaf_bash(0, f"{n}\n", "")] * 10 for n in range(2)}


# ------------------------------------------------------------------------------ cleanup


def test_cleanup_after_success_deletes_the_policy_only_after_the_pod_is_gone(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    kube.terminating_polls = 3
    sb = make_k8s(workspace)
    sb.call_tool("Bash", {"command": "sleep 60 >/dev/null 2>&1 &"})  # a leftover process
    assert kube.live_processes(NAMESPACE, sb.name) >= 2
    sb.close()
    assert_all_gone(kube)
    pod_gone_before_policy_deleted(kube, sb.name, sb.name)
    assert kube.live_processes(NAMESPACE, sb.name) == 0
    sb.close()  # idempotent
    with pytest.raises(SandboxError, match="closed"):
        sb.call_tool("Read", {"file_path": "x"})


def test_cleanup_after_failure_inside_the_with_block(kube: KubernetesApiDouble, workspace: Path) -> None:
    spec = SandboxSpec(workspace=str(workspace), limits=TEST_LIMITS)
    with pytest.raises(KeyboardInterrupt), KubernetesSandbox(spec, *sandbox_options(kube)) as sb:
        sb.call_tool("Write", {"file_path": "a.txt", "content": "x"})
        raise KeyboardInterrupt
    assert_all_gone(kube)
    pod_gone_before_policy_deleted(kube, sb.name, sb.name)


def test_cleanup_after_cancellation_from_another_thread(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    sb = make_k8s(workspace)
    started = kube.pod_path(NAMESPACE, sb.pod_name) / "started"
    outcome: list[BaseException | str] = []

    def long_call() -> None:
        try:
            outcome.append(sb.call_tool("Bash", {"command": "touch started; sleep 60", "timeout": 100}))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=long_call)
    thread.start()
    wait_for(started.exists)
    began = time.monotonic()
    sb.close()
    thread.join(timeout=10)
    assert not thread.is_alive() and time.monotonic() - began < 10
    assert isinstance(outcome[0], SandboxError) and "closed" in str(outcome[0])
    assert_all_gone(kube)
    assert kube.live_processes(NAMESPACE, sb.name) == 0


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("image", "ImagePullBackOff"),
        ("create-pod", "500"),
        ("upload", "copying the workspace"),
        ("slow", "did not start within"),
        ("runner", "runner did not start"),
    ],
)
def test_cleanup_when_the_start_fails(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path, fault: str, message: str
) -> None:
    options: dict[str, object] = {}
    if fault == "image":
        kube.image_errors["missing:1"] = "ImagePullBackOff"
        options["image"] = "missing:1"
    elif fault == "create-pod":
        kube.fail_next("create", "pods", 500)
    elif fault == "upload":
        options["python"] = "/nonexistent/python3"
    elif fault == "slow":
        kube.pending_polls = 10_000
        options["start_timeout_s"] = 0.3
    else:
        options["runner_script"] = str(workspace.parent / "broken-runner.py")
        (workspace.parent / "broken-runner.py").write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(SandboxUnavailable, match=message):
        make_k8s(workspace, **options)
    assert_all_gone(kube)
    assert next(kind for verb, kind, _ in kube.verbs() if verb == "create") == "networkpolicies"


def test_no_pod_without_its_policy(kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path) -> None:
    kube.fail_next("create", "networkpolicies", 403, "Forbidden")
    with pytest.raises(SandboxUnavailable, match="403"):
        make_k8s(workspace)
    assert ("create", "pods") not in [(verb, kind) for verb, kind, _ in kube.verbs()]
    assert_all_gone(kube)


def test_a_wrong_token_is_unavailable(kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="401"):
        make_k8s(workspace, configuration=kube.configuration(token="wrong"))


def test_policy_stays_for_the_reaper_while_a_pod_will_not_go(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    kube.terminating_polls = 10**6
    sb = make_k8s(workspace, delete_wait_s=0.2)
    sb.close()
    assert kube.names("networkpolicies", NAMESPACE) == [sb.name]  # never a pod without its policy
    assert kube.get("pods", NAMESPACE, sb.name)["metadata"]["deletionTimestamp"]


# ------------------------------------------------------------------------------ recovery


def test_a_broken_stream_is_recovered_by_recreating_the_pod_and_replaying(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    base = init_repo(workspace, {"src/calc.py": CALC})
    sb = make_k8s(workspace)
    first = sb.pod_name
    sb.call_tool("Edit", {"file_path": "src/calc.py", "old_string": "a - b", "new_string": "a + b"})
    sb.call_tool("Write", {"file_path": "notes/todo.txt", "content": "check\n"})
    sb.call_tool("Bash", {"command": "echo made > made.txt; date +%s%N"})  # output varies, status does not
    assert sb.call_tool("Read", {"file_path": "made.txt"}) == "made.txt\n1. made"
    assert sb.run_command("test -f made.txt", 10).exit_code == 0
    assert kube.break_streams(NAMESPACE, first) == 1

    assert sb.call_tool("Read", {"file_path": "src/calc.py"}) == "src/calc.py\n1. def add(a, b):\n2.     return a + b"
    assert sb.call_tool("Bash", {"command": "cat made.txt notes/todo.txt"}) == leaf_bash(0, "made\ncheck\n", "")
    assert sb.recoveries == 1 and sb.pod_name == f"{first}-r1"
    assert kube.names("pods", NAMESPACE) == [sb.pod_name]
    assert kube.names("networkpolicies", NAMESPACE) == [sb.name]  # the same policy selects the new pod
    assert only(kube.objects("pods", NAMESPACE))["metadata"]["labels"][LABEL_SANDBOX] == sb.name
    assert "notes/todo.txt" in sb.patch(base)
    sb.close()
    assert_all_gone(kube)


def test_replay_that_diverges_fails_the_sandbox(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    (workspace / "calc.py").write_text(CALC)
    sb = make_k8s(workspace)
    sb.call_tool("Edit", {"file_path": "calc.py", "old_string": "a - b", "new_string": "a + b"})
    (workspace / "calc.py").write_text("something else\n")  # the copy a new pod gets differs now
    kube.break_streams()
    with pytest.raises(SandboxError, match=r"diverged at mutating call 1 of 1 \(Edit call\).*old_string was not found"):
        sb.call_tool("Read", {"file_path": "calc.py"})
    with pytest.raises(SandboxError, match="diverged"):
        sb.call_tool("Read", {"file_path": "calc.py"})
    sb.close()
    assert_all_gone(kube)


def test_a_call_that_breaks_the_stream_twice_is_fatal(make_k8s: MakeSandbox, workspace: Path) -> None:
    sb = make_k8s(workspace)
    with pytest.raises(SandboxError, match="broke again on the same call"):
        sb.call_tool("Bash", {"command": "kill -9 $PPID"})  # the runner's own process
    assert sb.recoveries == 1


def test_recoveries_are_bounded(kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path) -> None:
    sb = make_k8s(workspace, max_recoveries=1)
    kube.break_streams()
    assert sb.ping()["pong"] is True
    kube.break_streams()
    with pytest.raises(SandboxError, match="recoveries are used up"):
        sb.ping()


def test_a_failing_recovery_is_fatal(kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path) -> None:
    sb = make_k8s(workspace)
    kube.fail_next("create", "pods", 500)
    kube.break_streams()
    with pytest.raises(SandboxError, match="recovering the sandbox failed"):
        sb.ping()
    sb.close()
    assert_all_gone(kube)


def test_wall_clock_limit(kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path) -> None:
    limits = SandboxLimits(wall_seconds=1.5, default_tool_timeout=60.0)
    sb = make_k8s(workspace, limits=limits, reply_grace_s=0.5)
    assert only(kube.objects("pods", NAMESPACE))["spec"]["activeDeadlineSeconds"] == 2
    began = time.monotonic()
    with pytest.raises(SandboxError, match=r"wall-clock limit of 1\.5s"):
        sb.call_tool("Bash", {"command": "sleep 30"})
    assert time.monotonic() - began < 10


@pytest.mark.skipif(os.geteuid() != 0, reason="starting the init as another uid needs root; CI runs as root")
def test_the_pods_init_is_not_dumpable_either() -> None:
    """Pid 1 of a sandbox pod runs with the commands' uid: non-dumpable, its /proc entries belong
    to root, so a command cannot open its descriptors, read its memory or ptrace it."""
    # the system python3, as a sandbox image has it (the venv may sit under a folder only root can enter)
    init = subprocess.Popen(["/usr/bin/python3", "-I", "-S", "-B", "-c", INIT], user=65534, group=65534)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{init.pid}/status").read_text().count("python") == 0:
            time.sleep(0.05)  # until it has exec'd python
        # and until its first lines ran (a loaded machine may take seconds): a dumpable process's /proc
        # is its own uid's, so this waits out the deadline and fails if the init never drops it
        while time.monotonic() < deadline and init.poll() is None and os.stat(f"/proc/{init.pid}/fd").st_uid != 0:
            time.sleep(0.05)
        assert init.poll() is None, "the init exited"
        assert os.stat(f"/proc/{init.pid}/fd").st_uid == 0
    finally:
        init.terminate()
        init.wait(timeout=10)
