"""A built JavaScript environment laid over the checkout: readable where Node looks, never writable
(one job could otherwise plant files a later job runs), its runners' caches in scratch folders, and
never part of the patch."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from app.settings import Settings
from sandbox.base import SandboxError, SandboxSpec
from worker.environment.layout import Layout, write_layout
from worker.wiring import open_job_sandbox, sandbox_spec

pytestmark = pytest.mark.bwrap


@pytest.fixture
def base() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="frogfix-binds-"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def environment(base: Path) -> Path:
    """An environment as javascript.py leaves it: ENTRY/env/checkout/<folder>/node_modules, the layout beside."""
    env = base / "entry" / "env"
    for rel in ("checkout/node_modules/left", "checkout/packages/a/node_modules/right",
                "checkout/node_modules/.vite", "checkout/node_modules/.bin"):
        (env / rel).mkdir(parents=True)
    (env / "checkout/node_modules/left/index.js").write_text("module.exports = 'left from the environment'\n")
    (env / "checkout/packages/a/node_modules/right/index.js").write_text("module.exports = 'right'\n")
    write_layout(base / "entry", Layout("javascript", (".", "packages/a"), ()))
    subprocess.run(["chmod", "-R", "a+rX", str(base)], check=True)
    return env


def checkout(base: Path) -> Path:
    repo = base / "repo"
    (repo / "packages" / "a").mkdir(parents=True)
    (repo / "index.js").write_text("console.log(require('left'))\n")
    (repo / "packages/a/index.js").write_text("console.log(require('right'))\n")
    subprocess.run("git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm base",
                   shell=True, cwd=repo, check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(repo)], check=True)
    return repo


def test_node_finds_the_environment_which_stays_read_only_and_out_of_the_patch(base: Path) -> None:
    settings = Settings(data_dir=base / "data", workspace_dir=base / "ws")
    env, repo = environment(base), checkout(base)
    script = (
        "node index.js && (cd packages/a && node index.js); "
        "touch node_modules/planted 2>/dev/null && echo PLANTED; "
        "echo x > node_modules/left/index.js 2>/dev/null && echo OVERWROTE; "
        "touch node_modules/.vite/cache-ok && echo SCRATCH-WRITABLE; "
        "case :$PATH: in *:/workspace/node_modules/.bin:*) echo BIN-ON-PATH;; esac; "
        "git status --porcelain --untracked-files=all | sed 's/^/STATUS /'"
    )
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    with closing(open_job_sandbox(repo, settings, None, environment=env)) as box:
        res = box.run_command(script, timeout=120)
        patch = box.patch(head.stdout.strip())
    assert "left from the environment" in res.log and "right" in res.log, res.log
    assert "PLANTED" not in res.log and "OVERWROTE" not in res.log, res.log
    assert "SCRATCH-WRITABLE" in res.log and "BIN-ON-PATH" in res.log, res.log
    assert "STATUS" not in res.log, res.log  # node_modules is never an untracked change
    assert patch == ""
    assert not (env / "checkout/node_modules/planted").exists()
    assert (env / "checkout/node_modules/left/index.js").read_text().startswith("module.exports")


def test_a_bind_that_climbs_out_of_the_checkout_is_refused(base: Path) -> None:
    settings = Settings(data_dir=base / "data", workspace_dir=base / "ws")
    env, repo = environment(base), checkout(base)
    spec = sandbox_spec(repo, settings, environment=env)
    bad = SandboxSpec(workspace=spec.workspace, env=spec.env, limits=spec.limits, environment=spec.environment,
                      checkout_binds=((str(env / "checkout/node_modules"), "../escape"),))
    from sandbox.local import LocalSandbox
    from worker.wiring import sandbox_options

    with pytest.raises(SandboxError, match="plain relative path"):
        LocalSandbox(bad, sandbox_options(settings)).close()
