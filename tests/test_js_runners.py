"""JavaScript runners: the runner's own command found in package.json, and real jest, vitest, mocha and
node's own runner read per test through FrogFix's preload (worker/attempts/js_reporters/), on a real pipe.

The runners are installed once with npm into a cache folder outside the repository (pinned versions,
a file lock so xdist workers do not race) and linked into each repository the tests make; the
preload and reporters are the files `verification_command` writes into the sandbox, with the run's
sentinels, loaded through NODE_OPTIONS exactly as REPORT_ENV gives it. What arrived on the channel
is judged by run_checks.check_run, as a real run's is.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.settings import get_settings
from app.statuses import EvidenceLevel
from sandbox.local import MOUNT_POINT
from tests.nonroot import NonRoot
from worker.attempts import verifier
from worker.attempts.evidence import REPORT_ENV, RunOutcome, judge, verification_command
from worker.attempts.js_runners import (
    HOOK_DIR,
    detect_js,
    js_test_command,
    one_file_hint,
    reporter_files,
    runner_of,
    through_node,
)
from worker.attempts.repo_config import RepoConfig, detect_test_command, load_repo_config, review_flags
from worker.attempts.run_checks import RunCheck, check_run, direct_runner, new_sentinels
from worker.attempts.stored_patch import ChangedFile, PatchEvidence
from worker.attempts.verifier import run_tests
from worker.leaf.prompts import add_test_command

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT.parent / "shared" / "fixtures" / "realrepos-js"
VERSIONS = {"jest": "29.7.0", "vitest": "4.0.17", "mocha": "11.7.1"}


# ---- the runner's own command ----


def script(test: str, **others: str) -> str:
    return json.dumps({"scripts": {"test": test, **others}})


@pytest.mark.parametrize(
    ("test", "others", "command"),
    [
        ("pnpm lint && vitest run --typecheck", {"lint": "eslint ."}, "vitest run --typecheck"),
        ("jest && npm run check:type:ts", {"check:type:ts": "tsd && tsc -p x.json"}, "jest"),
        ("vitest", {}, "vitest run"),
        ("vitest watch --coverage", {}, "vitest run --coverage"),
        ("jest --watchAll --ci", {}, "jest --ci"),
        ("mocha -w --recursive", {}, "mocha --recursive"),
        ("node --test --watch test/", {}, "node --test test/"),
        ("cross-env NODE_ENV=test jest --ci", {}, "NODE_ENV=test jest --ci"),
        ("NODE_OPTIONS=--no-warnings jest", {}, 'NODE_OPTIONS="$NODE_OPTIONS --no-warnings" jest'),  # the preload stays
        ("npm run unit", {"unit": "mocha -r ts-node/register 'test/*.ts'"}, "mocha -r ts-node/register 'test/*.ts'"),
        ("pnpm unit", {"unit": "yarn run inner", "inner": "node --test test/"}, "node --test test/"),
        ("yarn --silent vitest run", {}, "vitest run"),
        ("npx jest", {}, "jest"),
        ('nyc mocha "test/*.js"', {}, "mocha 'test/*.js'"),
        ("npm run lint; vitest run | tee out.txt", {"lint": "eslint ."}, "vitest run"),
        ("eslint . && tsc && prettier --check .", {}, None),
        ("npm run lint", {"lint": "eslint ."}, None),
        ("npm run a", {"a": "npm run b", "b": "npm run a"}, None),  # a loop: depth-limited
        ("vitest bench", {}, None),
        ("node scripts/test.js", {}, None),
    ],
)
def test_the_runners_own_command_is_found_in_the_test_script(
    test: str, others: dict[str, str], command: str | None
) -> None:
    found = js_test_command(script(test, **others))
    assert (found[0] if found else None) == command
    if command is not None:
        assert runner_of(command) is not None and direct_runner(command) == ("$" not in command)


def test_no_test_script_or_broken_json_names_no_runner() -> None:
    assert js_test_command("{") is None
    assert js_test_command('{"scripts": {"build": "tsc"}}') is None
    assert js_test_command('{"scripts": "jest"}') is None


def _fixture_package(name: str) -> str:
    with tarfile.open(FIXTURES / name / "base.tar.gz") as tar:
        member = tar.extractfile("package.json")
        assert member is not None
        return member.read().decode("utf-8")


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="the shared JavaScript fixtures are not in this checkout")
@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("commander-configureoutput-copy", "jest"),
        ("d3-format-prefix-parens", "vitest run"),
        ("ufo-withbase-prefix", "vitest run --typecheck"),
    ],
)
def test_the_real_fixtures_package_json(tmp_path: Path, name: str, command: str) -> None:
    (tmp_path / "package.json").write_text(_fixture_package(name))
    assert detect_js(tmp_path) is not None
    found = detect_test_command(tmp_path)
    assert found is not None and found[0] == command and "package.json" in found[1]


def test_one_file_hint_reaches_the_agents_task() -> None:
    assert one_file_hint("jest") == "To run one test file: `jest path/to/file.test.js`."
    assert "vitest run path/to/file.test.ts" in (one_file_hint("vitest run --typecheck") or "")
    assert "node --test path/to/file.test.js" in (one_file_hint("node --test") or "")
    assert "mocha path/to/file.test.js" in (one_file_hint("NODE_ENV=test mocha") or "")
    assert one_file_hint("npm test") is None and one_file_hint("python3 -m pytest -q") is None
    task = add_test_command("Fix the bug.", "jest", one_file_hint("jest"))
    assert "`jest`" in task and "`jest path/to/file.test.js`" in task
    assert add_test_command("Fix.", "pytest", None).endswith("you can run it too.")


def test_a_runner_started_through_node_is_named_as_such() -> None:
    assert through_node("npx jest") == "jest"
    assert through_node("pnpm exec vitest run") == "vitest"
    assert through_node("npm test") == "package.json's test script"
    assert through_node("jest") is None and through_node("make test") is None
    assert runner_of("npx jest") is None and not direct_runner("npx jest") and not direct_runner("jest && tsc")


def test_runner_files_are_flagged_like_pytests() -> None:
    paths = ("jest.config.ts", "web/vitest.config.mts", "vitest.workspace.ts", "vite.config.js", ".mocharc.yml",
             "src/setupTests.ts", "test/jest.setup.js", "babel.config.cjs", ".babelrc", "tsconfig.build.json",
             "src/__tests__/a.js", "src/a.test.ts")  # fmt: skip
    flags = review_flags(changes(*paths), RepoConfig(test_command="jest"))
    assert len(flags) == len(paths)
    assert all("test file or test-runner configuration" in flag for flag in flags), flags
    assert review_flags(changes("src/index.ts"), RepoConfig(test_command="jest")) == []


def changes(*paths: str) -> PatchEvidence:
    return PatchEvidence("0" * 40, "1" * 40, "", tuple(ChangedFile(p) for p in paths))


def test_the_verification_run_writes_the_preload_with_its_sentinels() -> None:
    sentinels = new_sentinels()
    assert REPORT_ENV["NODE_OPTIONS"] == f"--require {HOOK_DIR}/hook.cjs"
    command = verification_command("jest", sentinels)
    assert f"{HOOK_DIR}/hook.cjs" in command and f"{HOOK_DIR}/vitest-reporter.mjs" in command
    assert json.dumps(sentinels) in reporter_files(sentinels)["hook.cjs"]
    assert command.endswith("{ jest\n}")


# ---- the real runners, on a real pipe ----


@pytest.fixture(scope="session")
def runners() -> Path:
    """jest, vitest and mocha at pinned versions, installed once per machine outside the repository."""
    return install(VERSIONS)


@pytest.fixture(scope="session")
def jest30() -> Path:
    """Jest 30, whose @jest/core is one bundled file: FrogFix's reporter goes in through the configuration."""
    return install({"jest": "30.2.0"})


def install(versions: dict[str, str]) -> Path:
    """The packages at these versions in a cache folder of their own (a file lock: xdist workers wait, not race)."""
    npm, node = shutil.which("npm"), shutil.which("node")
    assert npm and node, "node and npm are needed (the sandbox image and the local sandbox have them)"
    key = hashlib.sha256(json.dumps(versions, sort_keys=True).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "frogfix-tests" / "js-runners"
    folder = cache / key
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "installed").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            (folder / "package.json").write_text('{"private": true}')
            specs = [f"{name}@{version}" for name, version in versions.items()]
            subprocess.run([npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", *specs],
                           cwd=folder, check=True, capture_output=True, timeout=900)  # fmt: skip
            (folder / "installed").write_text(json.dumps(versions))
    return folder / "node_modules"


def make_repo(root: Path, files: dict[str, str], modules: Path, package: dict[str, object] | None = None) -> Path:
    repo = root / "repo"
    for name, text in {"package.json": json.dumps(package or {"private": True}), **files}.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    (repo / "node_modules").symlink_to(modules, target_is_directory=True)
    return repo


def run(repo: Path, command: str, sentinels: dict[str, str] | None = None) -> tuple[RunCheck, str, int]:
    """The command as a verification run starts it: the preload through NODE_OPTIONS, the channel a pipe."""
    sentinels = sentinels if sentinels is not None else new_sentinels()
    hooks = repo.parent / "hooks"
    hooks.mkdir(exist_ok=True)
    for name, text in reporter_files(sentinels).items():
        (hooks / name).write_text(text)
    read, write = os.pipe()
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read, 65536), b"")))
    reader.start()
    env = {**os.environ, "FROGFIX_RESULTS_FD": str(write), "NODE_OPTIONS": f"--require {hooks}/hook.cjs",
           "PATH": f"{repo}/node_modules/.bin:{os.environ['PATH']}", "CI": "1", "NO_COLOR": "1"}  # fmt: skip
    try:
        done = subprocess.run(["bash", "-c", command], cwd=repo, env=env, pass_fds=(write,), capture_output=True,
                              text=True, timeout=600)  # fmt: skip
    finally:
        os.close(write)
        reader.join(timeout=600)
        os.close(read)
    log = done.stdout + done.stderr
    return check_run(b"".join(chunks).decode(), log, done.returncode, False, command, sentinels), log, done.returncode


JEST_TESTS = """
describe('outer', () => {
  describe('inner', () => {
    test('passes', () => {});
    test('fails', () => { expect(1).toBe(2); });
  });
  test.skip('skipped', () => {});
  test.todo('later');
});
test('sees no extra argv', () => { expect(process.argv.slice(2)).toEqual([]); });
"""
VITEST_TESTS = "import { describe, test, expect } from 'vitest';\n" + JEST_TESTS.replace(
    "sees no extra argv', () => { expect(process.argv.slice(2)).toEqual([]); }", "top', () => {}"
)
MOCHA_TESTS = """const assert = require('assert');
describe('outer', () => {
  describe('inner', () => {
    it('passes', () => {});
    it('fails', () => { assert.equal(1, 2); });
  });
  it.skip('skipped', () => {});
});
it('top', () => {});
"""
NODE_TESTS = """const { describe, it, test } = require('node:test');
const assert = require('node:assert');
describe('outer', () => {
  describe('inner', () => {
    it('passes', () => {});
    it('fails', () => { assert.equal(1, 2); });
  });
  it('skipped', { skip: true }, () => {});
  it.todo('later');
});
test('top', () => {});
"""
BROKEN = "this is not javascript (\n"


def expected(file: str, top: str = "top", todo: bool = True) -> dict[str, str]:
    cases = {f"{file}::outer > inner > passes": "passed", f"{file}::outer > inner > fails": "failed",
             f"{file}::outer > skipped": "skipped", f"{file}::{top}": "passed"}  # fmt: skip
    return {**cases, f"{file}::outer > later": "skipped"} if todo else cases


def test_jest_per_test_without_a_word_added_to_argv(tmp_path: Path, runners: Path) -> None:
    files = {"tests/a.test.js": JEST_TESTS, "tests/b.test.js": BROKEN}
    repo = make_repo(tmp_path, files, runners, {"private": True, "jest": {"maxWorkers": 1}})  # in band, as commander
    check, log, code = run(repo, "jest")
    assert code == 1, log
    assert check.tests == {**expected("tests/a.test.js", "sees no extra argv"),
                           "tests/b.test.js::<file failed to run>": "failed"}  # fmt: skip
    assert check.tampered == "" and any("jest has no way to add a test" in n for n in check.unavailable)


@pytest.fixture(scope="session")
def vitest2() -> Path:
    """Vitest 2, whose reporter API gives every result at the end of the run."""
    return install({"vitest": "2.1.9"})


def test_vitest_2_per_test_at_the_end_of_its_run(tmp_path: Path, vitest2: Path) -> None:
    files = {"test/a.test.js": VITEST_TESTS, "test/b.test.js": BROKEN}
    repo = make_repo(tmp_path, files, vitest2, {"private": True, "type": "module"})
    check, log, code = run(repo, "vitest run")
    assert code == 1, log
    assert check.tests == {**expected("test/a.test.js"), "test/b.test.js::<file failed to run>": "failed"}
    assert check.tampered == ""


def test_jest_keeps_the_projects_own_reporters(tmp_path: Path, runners: Path) -> None:
    reporter = "module.exports = class { onRunComplete() { console.log('THE PROJECT REPORTER RAN'); } };\n"
    files = {"tests/a.test.js": JEST_TESTS, "my-reporter.js": reporter}
    jest = {"maxWorkers": 1, "reporters": ["default", "<rootDir>/my-reporter.js"]}
    check, log, code = run(make_repo(tmp_path, files, runners, {"private": True, "jest": jest}), "jest")
    assert code == 1 and "THE PROJECT REPORTER RAN" in log and "Tests:" in log, log
    assert check.tests == expected("tests/a.test.js", "sees no extra argv") and check.tampered == ""


def test_jest_30_per_test_without_a_word_added_to_argv(tmp_path: Path, jest30: Path) -> None:
    files = {"tests/a.test.js": JEST_TESTS, "tests/b.test.js": BROKEN}
    repo = make_repo(tmp_path, files, jest30, {"private": True, "jest": {"maxWorkers": 1}})
    check, log, code = run(repo, "jest")
    assert code == 1, log
    assert check.tests == {**expected("tests/a.test.js", "sees no extra argv"),
                           "tests/b.test.js::<file failed to run>": "failed"}  # fmt: skip
    assert check.tampered == ""


def test_vitest_per_test_with_its_default_reporter_kept(tmp_path: Path, runners: Path) -> None:
    files = {"test/a.test.js": VITEST_TESTS, "test/b.test.js": BROKEN}
    repo = make_repo(tmp_path, files, runners, {"private": True, "type": "module"})
    check, log, code = run(repo, "vitest run")
    assert code == 1, log
    assert check.tests == {**expected("test/a.test.js"), "test/b.test.js::<file failed to run>": "failed"}
    assert check.tampered == "" and "Test Files" in log  # vitest's own report still printed


def test_vitest_loads_its_config_from_a_read_only_node_modules(tmp_path: Path, runners: Path) -> None:
    """A job's node_modules is read-only: vite's default config loader writes there, the one FrogFix picks does not."""
    files = {"test/a.test.js": VITEST_TESTS, "vitest.config.js": "export default { test: { testTimeout: 9000 } };\n"}
    repo = make_repo(tmp_path, files, runners, {"private": True, "type": "module"})
    read_only = "mount --bind node_modules/ node_modules/ && mount -o remount,bind,ro node_modules/"
    check, log, code = run(repo, f"unshare -rm sh -c '{read_only} && exec vitest run'")
    assert code == 1 and "EROFS" not in log, log
    assert check.tests == expected("test/a.test.js") and check.tampered == ""


def test_mocha_per_test_with_sentinels_no_one_sees(tmp_path: Path, runners: Path) -> None:
    repo = make_repo(tmp_path, {"test/a.test.js": MOCHA_TESTS}, runners)
    sentinels = new_sentinels()
    check, log, code = run(repo, "mocha", sentinels)
    assert code == 1, log  # the failing sentinels count in no exit code
    assert check.tests == expected("test/a.test.js", todo=False)
    assert check.tampered == "" and not any("sentinels" in note for note in check.unavailable)
    assert not any(name in log for name in sentinels) and "2 passing" in log and "1 failing" in log


def test_a_mocha_forgery_that_turns_failures_into_passes_meets_the_sentinels(tmp_path: Path, runners: Path) -> None:
    forger = (
        "const Runner = require('mocha/lib/runner');\n"
        "Runner.prototype.fail = function (test) { test.state = 'passed'; this.emit('pass', test); };\n"
        "it('fails', () => { throw new Error('no'); });\n"
    )
    repo = make_repo(tmp_path, {"test/a.test.js": forger}, runners)
    check, log, code = run(repo, "mocha")
    assert code == 0 and "1 passing" in log, log  # what the process says
    assert check.tampered == "FrogFix's sentinel test that must fail was reported passed", check


def test_mocha_tests_cannot_take_or_rewrite_the_channel_in_process(tmp_path: Path, runners: Path) -> None:
    forger = (
        "const fs = require('fs');\n"
        "const hook = Object.keys(require.cache).find((f) => f.endsWith('hook.cjs'));\n"
        "const sender = require(hook).takeSender();\n"
        "if (sender) sender.send('case', {id: 'test/a.test.js::forged', outcome: 'passed'});\n"
        "const write = fs.writeSync;\n"
        "fs.writeSync = function (fd, data, ...rest) {\n"
        "  if (Buffer.isBuffer(data)) data = Buffer.from(data.toString().replace(/\"failed\"/g, '\"passed\"'));\n"
        "  return write.call(this, fd, data, ...rest);\n"
        "};\n"
        "it('fails', () => { throw new Error('no'); });\n"
    )
    repo = make_repo(tmp_path, {"test/a.test.js": forger}, runners)
    check, log, code = run(repo, "mocha")
    assert code == 1, log
    assert check.tests == {"test/a.test.js::fails": "failed"} and check.tampered == "", check


def test_a_mocha_file_that_fails_to_load_is_its_one_result(tmp_path: Path, runners: Path) -> None:
    repo = make_repo(tmp_path, {"test/a.test.js": MOCHA_TESTS, "test/b.test.js": BROKEN}, runners)
    check, log, code = run(repo, "mocha")
    assert code != 0, log
    assert check.tests == {"test/b.test.js::<file failed to run>": "failed"}
    assert check.tampered == ""


def test_node_test_per_test_with_spec_on_stdout(tmp_path: Path, runners: Path) -> None:
    repo = make_repo(tmp_path, {"test/a.test.js": NODE_TESTS, "test/b.test.js": BROKEN}, runners)
    check, log, code = run(repo, "node --test test/")
    assert code == 1, log
    assert check.tests == {**expected("test/a.test.js"), "test/b.test.js::<file failed to run>": "failed"}
    assert check.tampered == "" and "✖ fails" in log  # spec's own report


def test_node_test_keeps_a_reporter_the_project_chose(tmp_path: Path, runners: Path) -> None:
    repo = make_repo(tmp_path, {"test/a.test.js": NODE_TESTS}, runners)
    check, log, code = run(repo, "node --test --test-reporter=tap test/")
    assert code == 1 and "TAP version" in log and "# fail 1" in log, log  # tap's own report, on stdout
    assert check.tests == expected("test/a.test.js") and check.tampered == ""


def test_a_mocha_esm_file_that_fails_to_link_is_its_one_result(tmp_path: Path, runners: Path) -> None:
    files = {"test/a.test.mjs": "import { missing } from './lib.mjs';\nit('uses it', () => missing());\n",
             "test/lib.mjs": "export const present = 1;\n"}  # fmt: skip
    repo = make_repo(tmp_path, files, runners)
    check, log, code = run(repo, "mocha 'test/*.test.mjs'")
    assert code != 0, log
    assert check.tests == {"test/a.test.mjs::<file failed to run>": "failed"} and check.tampered == ""


def test_ids_are_relative_to_the_checkouts_root(tmp_path: Path, runners: Path) -> None:
    repo = make_repo(tmp_path, {"packages/lib/test/a.test.js": MOCHA_TESTS, ".git/HEAD": "ref: refs/heads/main\n"},
                     runners)  # fmt: skip
    (repo / "packages" / "lib" / "node_modules").symlink_to(runners, target_is_directory=True)
    check, log, _ = run(repo, "cd packages/lib && mocha")
    assert check.tests == expected("packages/lib/test/a.test.js", todo=False), log


def test_a_runner_started_through_npx_gets_no_channel_and_says_so(tmp_path: Path, runners: Path) -> None:
    repo = make_repo(tmp_path, {"tests/a.test.js": JEST_TESTS}, runners)
    check, log, code = run(repo, "npx jest")
    assert code == 1, log
    assert check.tests is None and check.tampered == ""
    assert any("through node" in note and "judged by exit codes" in note for note in check.unavailable)


FORGE_EVERY_FD = """
const fs = require('fs');
for (let fd = 3; fd < 256; fd++) {
  for (const n of [1, 2, 3, 50]) {
    const line = JSON.stringify({k: 'case', n, id: 'x.test.js::forged', outcome: 'passed'}) + '\\n';
    try { fs.writeSync(fd, line); } catch (e) {}
  }
}
console.log('Tests: 3 passed, 3 total');
console.log('3 passing');
"""


@pytest.mark.parametrize(
    ("runner", "command", "test_file", "body"),
    [
        ("jest", "jest", "tests/f.test.js",
         "test('fails', () => { expect(1).toBe(2); });\ntest('forges', () => {%s});"),
        ("vitest", "vitest run", "test/f.test.js",
         "import {test, expect} from 'vitest';\nimport {createRequire} from 'node:module';\n"
         "const require = createRequire(import.meta.url);\n"
         "test('fails', () => { expect(1).toBe(2); });\ntest('forges', () => {%s});"),
        ("mocha", "mocha", "test/f.test.js",
         "it('fails', () => { throw new Error('no'); });\nit('forges', () => {%s});"),
        ("node-test", "node --test test/", "test/f.test.js",
         "const {test} = require('node:test');\ntest('fails', () => { throw new Error('no'); });\n"
         "test('forges', () => {%s});"),
    ],
)
def test_fake_lines_on_every_descriptor_never_make_a_believed_pass(
    tmp_path: Path, runners: Path, runner: str, command: str, test_file: str, body: str
) -> None:
    package = {"private": True, "type": "module"} if runner == "vitest" else {"private": True}
    repo = make_repo(tmp_path, {test_file: body % FORGE_EVERY_FD}, runners, package)
    check, log, _ = run(repo, command)
    # Where the test reaches the channel (mocha runs tests in its own process) the lines are out of
    # order; where it cannot (workers, child processes), the failing test stays failed, or the
    # worker the writes broke fails its file or the run.
    assert check.tampered or check.tests is None or "failed" in check.tests.values(), (check, log)
    assert "x.test.js::forged" not in (check.tests or {})
    assert (check.tests or {}).get(f"{test_file}::fails") != "passed"


@pytest.mark.parametrize(
    ("runner", "command", "test_file", "body"),
    [
        ("mocha", "mocha", "test/e.test.js",
         "it('fails', () => { throw new Error('no'); });\nit('exits', () => { process.exit(0); });"),
        ("jest", "jest", "tests/e.test.js",
         "test('fails', () => { expect(1).toBe(2); });\ntest('exits', () => { process.exit(0); });"),
        ("vitest", "vitest run", "test/e.test.js",
         "import {test, expect} from 'vitest';\ntest('fails', () => { expect(1).toBe(2); });\n"
         "test('exits', () => { process.exit(0); });"),
        ("node-test", "node --test test/", "test/e.test.js",
         "const {test} = require('node:test');\ntest('fails', () => { throw new Error('no'); });\n"
         "test('exits', () => { process.exit(0); });"),
    ],
)
def test_a_test_that_exits_early_with_0_is_never_a_believed_pass(
    tmp_path: Path, runners: Path, runner: str, command: str, test_file: str, body: str
) -> None:
    package = {"private": True, "type": "module"} if runner == "vitest" else {"private": True}
    repo = make_repo(tmp_path, {test_file: body}, runners, package)
    check, log, code = run(repo, command)
    if runner == "node-test":
        # Node's own runner reports the file passed (its child exited 0 before reporting its tests):
        # FrogFix sees none of that file's tests, so none of them proves anything (docs/EVIDENCE.md).
        assert code == 0 and check.tests is not None and f"{test_file}::fails" not in check.tests
        return
    believed_pass = not check.tampered and check.tests is not None and "failed" not in check.tests.values()
    assert not believed_pass, (check, log)
    if code == 0:  # the process claimed success: the runner's own session says otherwise
        assert check.tampered, (check, log)


# ---- through the real verification path: detection, the local sandbox, run_tests ----


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A job workspace the sandbox's unprivileged user can reach (run_tests removes it)."""
    root = Path(tempfile.mkdtemp(prefix="frogfix-js-runners-"))
    root.chmod(0o755)
    yield root / "ws"
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(
    ("test_script", "files", "command", "tests"),
    [
        ("eslint . && node --test test/", {"test/a.test.js": NODE_TESTS}, "node --test test/",
         expected("test/a.test.js")),
        ("jest && tsc -p tsconfig.json", {"tests/a.test.js": JEST_TESTS}, "jest",
         expected("tests/a.test.js", "sees no extra argv")),
        ("npm run lint && mocha", {"test/a.test.js": MOCHA_TESTS}, "mocha", expected("test/a.test.js", todo=False)),
    ],
)
def test_a_detected_runner_is_read_per_test_in_the_sandbox(
    workspace: Path, runners: Path, test_script: str, files: dict[str, str], command: str, tests: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The lead's environment puts the checkout's node_modules/.bin first on PATH; here the test does.
    path = f"{MOUNT_POINT}/node_modules/.bin:/usr/local/bin:/usr/bin:/bin"
    monkeypatch.setattr(verifier, "REPORT_ENV", {**REPORT_ENV, "PATH": path})
    package = {"scripts": {"test": test_script, "lint": "eslint ."}, "jest": {"maxWorkers": 1}}
    for name, text in {"package.json": json.dumps(package), **files}.items():
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text(text)
    if command != "node --test test/":  # the lead's environment binds node_modules; here a copy stands for it
        shutil.copytree(runners, workspace / "node_modules", symlinks=True)
    config = load_repo_config(workspace)
    assert config.test_command == command and config.test_command_source.startswith("detected: package.json")
    run = run_tests(workspace, config, get_settings(), lambda text: text)
    assert run.exit_code == 1, run.log
    assert run.tests == tests and run.tampered == "", run
    assert not any("never" in note for note in run.unavailable), run.unavailable


# ---- what run_checks makes of a JavaScript session's lines ----


def lines(*records: dict[str, object]) -> str:
    return "".join(json.dumps({**record, "n": n}) + "\n" for n, record in enumerate(records, 1))


START = {"k": "start", "runner": "vitest", "version": "4.0.17", "pid": 7}
PASS = {"k": "case", "id": "test/a.test.js::a > b", "outcome": "passed"}
FAIL = {"k": "case", "id": "test/a.test.js::a > c", "outcome": "failed"}
PLANTED = {"k": "planted", "names": [], "why": "vitest has no way to add a test to a run"}


def end(status: int) -> dict[str, object]:
    return {"k": "end", "exitstatus": status, "stopped": False}


def test_a_js_session_is_read_and_its_exit_code_held_to_its_end() -> None:
    results = lines(START, PASS, FAIL, {**FAIL, "outcome": "passed"}, PLANTED, end(1))
    check = check_run(results, "", 1, False, "vitest run", {})
    assert check.tests == {PASS["id"]: "passed", FAIL["id"]: "failed"} and check.tampered == ""  # worst copy counts
    said = check_run(results, "", 0, False, "vitest run", {}).tampered
    assert said == "the test command exited 0 but its vitest session ended with 1"
    assert check_run(results, "", 0, False, "pnpm lint && vitest run", {}).tampered == ""  # not the runner itself
    passing = lines(START, PASS, PLANTED, end(0))
    noted = check_run(passing, "", 1, False, "vitest run", {})  # coverage thresholds: the project's own
    assert noted.tampered == ""
    assert any("exited 1 after its vitest session ended with 0" in note for note in noted.unavailable)


def test_a_js_session_that_never_ended_is_not_believed() -> None:
    check = check_run(lines(START, PASS), "", 1, False, "vitest run", {})
    assert check.tests is None and any("a vitest session never finished" in n for n in check.unavailable)
    assert check_run(lines(START, PASS), "", 0, False, "vitest run", {}).tampered == (
        "the test command exited 0 but its vitest session never finished"
    )


def test_forged_js_lines_are_tampered() -> None:
    out_of_order = lines(START, PASS) + json.dumps({**FAIL, "n": 9}) + "\n"
    assert "out of order" in check_run(out_of_order, "", 0, False, "jest", {}).tampered
    after_end = lines(START, PASS, PLANTED, end(0), PASS)
    assert "after" in check_run(after_end, "", 0, False, "jest", {}).tampered
    assert check_run(lines(START, {**PASS, "outcome": "xpass"}, end(0)), "", 0, False, "jest", {}).tampered
    assert check_run(lines({**START, "runner": "karma"}), "", 0, False, "jest", {}).tampered
    pytest_case = lines({"k": "start", "pytest": "8", "pid": 1}, PASS)  # a JS record in pytest's session
    assert check_run(pytest_case, "", 0, False, "pytest", {}).tampered


def test_a_failed_run_with_no_failing_test_is_never_an_all_pass() -> None:
    check = check_run(lines(START, PASS, PLANTED, end(1)), "", 1, False, "vitest run", {})
    assert check.tests == {PASS["id"]: "passed", "::<the run failed outside its tests>": "failed"}


def test_a_vitest_fix_is_reproduced_by_the_unchanged_verdict(tmp_path: Path, runners: Path) -> None:
    """Evidence reads TestRun.tests only: a JavaScript runner's ids give the same verdicts as pytest's."""
    source = {"src/add.js": "export const add = (a, b) => a - b;\n"}
    old_test = "import {test, expect} from 'vitest';\nimport {add} from '../src/add.js';\n"
    new_test = old_test + "describe('add', () => { test('adds', () => { expect(add(1, 2)).toBe(3); }); });\n"
    new_test = new_test.replace("import {test,", "import {describe, test,")
    package = {"private": True, "type": "module"}

    def outcome(files: dict[str, str], name: str) -> RunOutcome:
        check, _, code = run(make_repo(tmp_path / name, files, runners, package), "vitest run")
        return RunOutcome(code, True, check.tests, check.tampered, tuple(check.unavailable))

    base = outcome({**source, "test/add.test.js": old_test + "test('zero', () => {});\n"}, "base")
    tests_only = outcome({**source, "test/add.test.js": new_test}, "tests-only")
    fixed = outcome({"src/add.js": "export const add = (a, b) => a + b;\n", "test/add.test.js": new_test}, "fixed")
    evidence = judge(base, [fixed], tests_only, ["test/add.test.js"])
    assert evidence.level == EvidenceLevel.reproduced and evidence.per_test, evidence
    assert evidence.reproduction.tests == ["test/add.test.js::add > adds"]


@pytest.mark.bwrap  # the nonroot fixture checks that bubblewrap runs for that user
def test_node_test_is_read_per_test_for_a_non_root_worker(nonroot: NonRoot) -> None:
    outcome = nonroot.run_json(ROOT / "tests" / "js_worker_side.py", str(nonroot.folder("js-")), timeout=300)
    assert outcome["command"] == "node --test test/" and outcome["exit_code"] == 1, outcome
    assert outcome["tests"] == {"test/a.test.js::outer > passes": "passed", "test/a.test.js::outer > fails": "failed"}
    assert outcome["tampered"] == ""
