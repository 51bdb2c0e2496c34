"""Environments no job can poison (issue 34), tried with the worker as an unprivileged user.

Before: job A's build (an in-tree backend, or a module setup.py imports) wrote a forced-pass
conftest.py and a backdoored copy of a tracked module where the cached environment kept generated
files; a later, clean job B with the same declarations reused that environment, ran its tests with
the conftest and published both in its patch. The relay fetched the mirror host's `/admin/secret`
with FrogFix's credentials, and a build wrote 180 MiB to the host past a 64 MiB bound.

Now the cached environment holds only what the mirror served (no code of the project runs where
it is built), the project's own install runs in each job into that job's own layer, generated
files never land on tracked paths (a generated conftest.py is refused), the relay serves the index
only, and nothing a build writes reaches the host but what is read out, within the bound.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.environment.nonroot_poison import MARK
from tests.environment.pypi_wheels import copy_wheels, wheels
from tests.environment.test_setup_phase import CANARY, wheel
from tests.nonroot import NonRoot
from tests.realrepos.mirror import PackageMirror

pytestmark = pytest.mark.bwrap
SCRIPT = Path(__file__).with_name("nonroot_poison.py")


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageMirror]:
    packages = tmp_path_factory.mktemp("packages")
    wheel(packages, "frogdep", "1.0", "VALUE = 42\n")
    copy_wheels(wheels("setuptools", "wheel"), packages)
    with PackageMirror(packages, CANARY) as served:
        yield served


@pytest.mark.parametrize("variant", ["backend", "setup_py"])
def test_one_jobs_build_reaches_no_other_job_no_run_and_no_patch(
    nonroot: NonRoot, mirror: PackageMirror, variant: str
) -> None:
    out = nonroot.run_json(SCRIPT, str(nonroot.folder("poison-")), mirror.url_with_credentials, variant, timeout=900)
    a, b, seen = out["a"], out["b"], out["b_seen"]
    assert a["ok"], a
    # Job A's own layer is its own: its project's .pth ran in its own job; its backdoored copy of the tracked
    # module was not laid over the checkout.
    assert MARK in out["a_sees"] and "buggy" in out["a_sees"], out["a_sees"]
    assert b["ok"], b
    assert out["b_same_env"], "job B reuses the cached environment of the mirror's packages"
    # Job B's runs: the honest failure stays a failure, its own module, no conftest, the environment's python.
    assert "FAILED (failures=1)" in seen["tests"] and "exit=1" in seen["tests"], seen["tests"]
    assert "test_dep" in seen["tests"] and MARK not in seen["tests"]
    probe = seen["probe"]
    assert "conftest.py" not in probe and "VALUE = 'buggy'" in probe and "backdoor" not in probe, probe
    assert "python3=/frogfix/env/bin/python3" in probe and "poisoned None /frogfix/env/bin/python3" in probe, probe
    assert out["patch"] == "", out["patch"]
    # Nothing of A's is left on the host (its layer went with its job), and the mirror host's other paths
    # were never asked for, with or without dot segments.
    assert out["marked"] == [], out["marked"]
    asked = [request.path for request in mirror.requests()]
    assert not any("admin" in path for path in asked), asked


def test_a_build_writing_past_the_size_bound_is_refused_and_leaves_nothing_on_the_host(
    nonroot: NonRoot, mirror: PackageMirror
) -> None:
    out = nonroot.run_json(SCRIPT, str(nonroot.folder("size-")), mirror.url_with_credentials, "size", timeout=900)
    assert not out["a"]["ok"] and "the project's own install failed" in out["a"]["reason"], out["a"]
    assert "No space left on device" in out["a"]["log_tail"], out["a"]["log_tail"]
    assert out["kept_bytes"] < 16 * 1024**2, out["kept_bytes"]  # the 100 MiB the build wrote stayed in its RAM


def test_a_generated_conftest_is_refused_with_a_clear_reason(nonroot: NonRoot, mirror: PackageMirror) -> None:
    out = nonroot.run_json(SCRIPT, str(nonroot.folder("gen-")), mirror.url_with_credentials, "generated", timeout=900)
    reason = out["a"]["reason"]
    assert not out["a"]["ok"] and "generated conftest.py" in reason and "never lays" in reason, out["a"]
    assert json.dumps(out).count(CANARY) == 0
