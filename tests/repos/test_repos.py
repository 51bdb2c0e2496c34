"""worker/git/gitcalls.py, mirrors.py, workspace_pool.py and publishing.py against a real git smart-HTTP server
on 127.0.0.1 (tests/doubles/git_http.py)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from app.forge.api import basic_auth_header, secret_forms
from tests.doubles.git_http import git
from tests.repos.conftest import BINARY, HEADER, TOKEN, Upstream
from worker.git import gitcalls, mirrors
from worker.git.gitcalls import GIT_RETRY, RepoError, RepoTransient, mirror_key
from worker.git.mirrors import RepoCache, resolve
from worker.git.publishing import commit_patch, push_branch
from worker.git.workspace_pool import make_workspace, remove_workspace

CANARIES = [s.encode() for s in secret_forms(TOKEN)] + [HEADER.encode(), b"CANARY"]
KEY = mirror_key("gitea", "acme/widgets")


def assert_no_secret_under(*roots: Path) -> None:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                leaked = [c for c in CANARIES if c in data]
                assert not leaked, f"{path} holds {leaked}"


def sandbox_patch(workspace: Path, base: str) -> str:
    """What the sandbox hands back: `git add -A` then `git diff --cached --binary <base>`."""
    assert git("add", "-A", cwd=workspace).returncode == 0
    done = git("diff", "--cached", "--binary", base, cwd=workspace)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def cache(tmp_path: Path) -> RepoCache:
    return RepoCache(tmp_path / "mirrors", timeout=20)


# -- mirrors -----------------------------------------------------------------------------------


def test_mirror_is_created_then_updated(upstream: Upstream, cache: RepoCache) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    assert mirror == cache.root / f"{KEY}.git"
    assert resolve(mirror, "main") == resolve(mirror, "HEAD") == resolve(mirror, "refs/heads/main") == upstream.second
    assert resolve(mirror, upstream.first) == upstream.first
    assert all(r.authorization == HEADER for r in upstream.server.requests)

    git("branch", "doomed", cwd=upstream.work)
    assert git("push", "-q", str(upstream.bare), "doomed", cwd=upstream.work).returncode == 0
    third = upstream.commit({"new.txt": "new\n"}, "third")
    assert cache.mirror(KEY, upstream.url, HEADER) == mirror
    assert resolve(mirror, "main") == third
    assert resolve(mirror, "doomed") == upstream.second

    git("--git-dir", str(upstream.bare), "branch", "-D", "doomed")
    cache.mirror(KEY, upstream.url, HEADER)
    with pytest.raises(RepoError):
        resolve(mirror, "doomed")  # pruned
    config = (mirror / "config").read_text()
    assert TOKEN not in config and "remote" not in config and "extraHeader" not in config
    assert_no_secret_under(cache.root)
    assert not list(cache.root.glob("*.new"))


def test_locks_left_by_a_killed_fetch_are_cleared(upstream: Upstream, cache: RepoCache) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    (mirror / "packed-refs.lock").write_text("")
    (mirror / "refs" / "heads" / "main.lock").write_text("")
    third = upstream.commit({"new.txt": "new\n"}, "third")
    cache.mirror(KEY, upstream.url, HEADER)
    assert resolve(mirror, "main") == third


def test_mirror_follows_a_renamed_default_branch(upstream: Upstream, cache: RepoCache) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    bare = str(upstream.bare)
    assert git("--git-dir", bare, "branch", "-m", "main", "trunk").returncode == 0
    cache.mirror(KEY, upstream.url, HEADER)
    assert resolve(mirror, "HEAD") == resolve(mirror, "trunk") == upstream.second


@pytest.mark.parametrize("header", [None, basic_auth_header("oauth2", "glpat-CANARY-wrong-token-000")])
def test_refused_auth_is_permanent_and_leaks_nothing(upstream: Upstream, cache: RepoCache, header: str | None) -> None:
    with pytest.raises(RepoError) as caught:
        cache.mirror(KEY, upstream.url, header)
    assert not isinstance(caught.value, RepoTransient)
    message = str(caught.value)
    assert "CANARY" not in message and "Authorization" not in message and (header or "x") not in message
    assert not (cache.root / f"{KEY}.git").exists() and not list(cache.root.glob("*.new"))
    assert {r.status for r in upstream.server.requests} == {401}


def test_a_later_refusal_keeps_the_mirror(upstream: Upstream, cache: RepoCache) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    with pytest.raises(RepoError) as caught:
        cache.mirror(KEY, upstream.url, basic_auth_header("oauth2", "nope-nope-nope"))
    assert not isinstance(caught.value, RepoTransient) and "nope-nope-nope" not in str(caught.value)
    assert resolve(mirror, "main") == upstream.second


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_server_down_is_transient(cache: RepoCache) -> None:
    url = f"http://127.0.0.1:{closed_port()}/acme/widgets.git"
    with pytest.raises(RepoTransient) as caught:
        cache.mirror(KEY, url, HEADER)
    assert TOKEN not in str(caught.value) and "connect" in str(caught.value)


@pytest.fixture
def failing_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/acme/widgets.git"
    server.shutdown()
    server.server_close()


def test_server_error_is_transient(failing_server: str, cache: RepoCache) -> None:
    with pytest.raises(RepoTransient) as caught:
        cache.mirror(KEY, failing_server, HEADER)
    assert "503" in str(caught.value) and TOKEN not in str(caught.value)


def test_a_hung_server_is_killed_and_transient(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/acme/widgets.git"
        started = time.monotonic()
        with pytest.raises(RepoTransient, match="timed out"):
            RepoCache(tmp_path / "m", timeout=1.0).mirror(KEY, url, HEADER)
        assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "url",
    ["http://oauth2:secret@127.0.0.1/x.git", "ssh://git@host/x.git", "ext::sh -c evil", "http://host/a b", "/abs"],
)
def test_bad_clone_urls_are_refused(cache: RepoCache, url: str) -> None:
    with pytest.raises(RepoError) as caught:
        cache.mirror(KEY, url, None)
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize("key", ["..", "../x", "/abs", "a/b", "", "x.lock", ".hidden", "a\nb"])
def test_bad_keys_are_refused(cache: RepoCache, key: str) -> None:
    with pytest.raises(RepoError):
        cache.mirror(key, "http://127.0.0.1:1/x.git", None)


def test_mirror_keys_are_safe_and_distinct() -> None:
    keys = {mirror_key("gitlab", "a/b_c"), mirror_key("gitlab", "a_b/c"), mirror_key("gitea", "a/b_c")}
    assert len(keys) == 3
    assert all(gitcalls.check_key(k) == k for k in keys | {mirror_key("gitlab", "../../etc")})


def test_concurrent_mirror_calls_fetch_one_at_a_time(
    upstream: Upstream, cache: RepoCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_run = gitcalls.run_git
    active, peak, fetches = [0], [0], [0]
    guard = threading.Lock()

    def counting_run(args: list[str], **kwargs: Any) -> Any:
        network = ("fetch" in args and "--depth=1" not in args) or "ls-remote" in args
        if network:
            with guard:
                active[0] += 1
                fetches[0] += "fetch" in args
                peak[0] = max(peak[0], active[0])
            time.sleep(0.2)  # widen the window in which an unlocked second fetch would overlap
        try:
            return real_run(args, **kwargs)
        finally:
            if network:
                with guard:
                    active[0] -= 1

    monkeypatch.setattr(mirrors, "run_git", counting_run)  # the mirror's git calls go through its own name
    results: list[Path | BaseException] = []

    def call() -> None:
        try:
            results.append(cache.mirror(KEY, upstream.url, HEADER))
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [cache.root / f"{KEY}.git"] * 2
    assert fetches[0] == 2 and peak[0] == 1
    assert resolve(results[0], "main") == upstream.second  # type: ignore[arg-type]


# -- workspaces --------------------------------------------------------------------------------


def test_workspace_at_an_older_commit(upstream: Upstream, cache: RepoCache, tmp_path: Path) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    ws = tmp_path / "ws"
    make_workspace(mirror, ws, upstream.first)

    assert git("rev-parse", "HEAD", cwd=ws).stdout.strip() == upstream.first
    files = sorted(str(p.relative_to(ws)) for p in ws.rglob("*") if p.is_file() and ".git" not in p.parts)
    assert files == ["README.md", "app/calc.py", "docs/old.txt"]
    assert (ws / "app/calc.py").read_text() == "def add(a, b):\n    return a - b\n"
    assert git("status", "--porcelain", cwd=ws).stdout == ""
    assert git("remote", cwd=ws).stdout == ""
    assert git("config", "user.name", cwd=ws).stdout.strip() == "FrogFix"
    assert git("fsck", "--no-progress", cwd=ws).returncode == 0
    assert not (ws / ".git" / "objects" / "info" / "alternates").exists()
    assert not (ws / ".git" / "FETCH_HEAD").exists()
    assert str(mirror) not in (ws / ".git" / "config").read_text()

    # the sandbox's patch command works against the base
    (ws / "app/calc.py").write_text("def add(a, b):\n    return a + b\n")
    assert "+    return a + b" in sandbox_patch(ws, upstream.first)

    mirror_inodes = {p.stat().st_ino for p in mirror.rglob("*") if p.is_file()}
    for path in (ws / ".git").rglob("*"):
        if path.is_file():
            info = path.stat()
            assert info.st_nlink == 1 and info.st_ino not in mirror_inodes, path
    assert_no_secret_under(ws, cache.root)


def test_workspace_errors(upstream: Upstream, cache: RepoCache, tmp_path: Path) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    with pytest.raises(RepoError):
        make_workspace(mirror, tmp_path / "a", "main")  # a full sha only
    with pytest.raises(RepoError, match="not in the mirror") as caught:
        make_workspace(mirror, tmp_path / "b", "0" * 40)
    assert not isinstance(caught.value, RepoTransient)
    assert not (tmp_path / "b").exists()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x").write_text("x")
    with pytest.raises(RepoError):
        make_workspace(mirror, tmp_path / "c", upstream.first)
    assert (tmp_path / "c" / "x").exists()


# -- commit and push ---------------------------------------------------------------------------


def test_commit_patch_and_push_land_on_our_branch(upstream: Upstream, cache: RepoCache, tmp_path: Path) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    base = resolve(mirror, "main")
    ws = tmp_path / "ws"
    make_workspace(mirror, ws, base)
    (ws / "app/calc.py").write_text("def add(a, b):\n    return a + b\n")
    (ws / "assets/new.bin").write_bytes(BINARY[::-1])
    (ws / "assets/logo.bin").write_bytes(BINARY + b"\xff\x00more")
    (ws / "README.md").unlink()
    patch = sandbox_patch(ws, base)
    assert "GIT binary patch" in patch

    sha = commit_patch(mirror, base, patch, "Fix add()\n\nCloses #7", ("FrogFix", "frogfix@localhost"), tmp_path / "s")
    branch = gitcalls.branch_for_issue(7)
    push_branch(mirror, upstream.url, HEADER, branch, sha)

    assert upstream.rev(f"refs/heads/{branch}") == sha
    assert upstream.rev("main") == base  # nothing else moved
    bare = str(upstream.bare)
    assert git("--git-dir", bare, "rev-parse", f"{sha}^@").stdout.split() == [base]  # one parent
    raw = subprocess.run(["git", "--git-dir", bare, "cat-file", "blob", f"{sha}:assets/new.bin"], capture_output=True)
    assert raw.stdout == BINARY[::-1]
    raw = subprocess.run(["git", "--git-dir", bare, "cat-file", "blob", f"{sha}:assets/logo.bin"], capture_output=True)
    assert raw.stdout == BINARY + b"\xff\x00more"
    assert git("--git-dir", bare, "ls-tree", "--name-only", sha).stdout.split() == ["app", "assets"]
    assert git("--git-dir", bare, "log", "-1", "--format=%an <%ae>|%s", sha).stdout.strip() == (
        "FrogFix <frogfix@localhost>|Fix add()"
    )
    ((old, new, ref),) = upstream.server.pushes[-1].updates
    assert (set(old), new, ref) == ({"0"}, sha, "refs/heads/frogfix/issue-7")

    # a second attempt for the same issue replaces our branch (force on that one ref)
    (ws / "app/calc.py").write_text("def add(a, b):\n    return b + a\n")
    second = commit_patch(mirror, base, sandbox_patch(ws, base), "Fix again", ("FrogFix", "f@l"), tmp_path / "s")
    push_branch(mirror, upstream.url, HEADER, branch, second)
    assert upstream.rev(f"refs/heads/{branch}") == second

    # with a lease: refused when the branch is not what we say we last pushed, taken when it is
    with pytest.raises(RepoError, match="rejected") as caught:
        push_branch(mirror, upstream.url, HEADER, branch, sha, expect_old=sha)
    assert not isinstance(caught.value, RepoTransient) and TOKEN not in str(caught.value)
    assert upstream.rev(f"refs/heads/{branch}") == second
    push_branch(mirror, upstream.url, HEADER, branch, sha, expect_old=second)
    assert upstream.rev(f"refs/heads/{branch}") == sha
    with pytest.raises(RepoError):
        push_branch(mirror, upstream.url, HEADER, "frogfix/issue-8", sha, expect_old=second)
    push_branch(mirror, upstream.url, HEADER, "frogfix/issue-8", sha, expect_old="")
    assert upstream.rev("refs/heads/frogfix/issue-8") == sha

    # the next fetch brings our branch into the mirror; no secret anywhere
    cache.mirror(KEY, upstream.url, HEADER)
    assert resolve(mirror, branch) == sha
    assert_no_secret_under(ws, cache.root, tmp_path / "s")


@pytest.mark.parametrize(
    "branch",
    [
        "main",
        "refs/heads/main",
        "frogfix/../main",
        "refs/heads/frogfix/issue-7",
        "frogfix/",
        "frogfix",
        "frogfix/a b",
        "frogfix/x.lock",
        "frogfix/a@{1}",
        "frogfix/a:refs/heads/main",
        "+frogfix/a",
        "frogfix//a",
        "frogfix/-a/../../main",
    ],
)
def test_push_to_any_other_branch_is_refused_before_the_network(
    upstream: Upstream, cache: RepoCache, branch: str
) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    before = len(upstream.server.requests)
    with pytest.raises(RepoError, match="refusing"):
        push_branch(mirror, upstream.url, HEADER, branch, upstream.second)
    assert len(upstream.server.requests) == before and not upstream.server.pushes


def test_push_failures(upstream: Upstream, cache: RepoCache, tmp_path: Path) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    with pytest.raises(RepoError, match="not in") as caught:
        push_branch(mirror, upstream.url, HEADER, "frogfix/issue-1", "1" * 40)
    with pytest.raises(RepoError) as caught:
        push_branch(mirror, upstream.url, basic_auth_header("oauth2", "bad-token-0000"), "frogfix/x", upstream.second)
    assert not isinstance(caught.value, RepoTransient) and "bad-token-0000" not in str(caught.value)
    down = f"http://127.0.0.1:{closed_port()}/acme/widgets.git"
    with pytest.raises(RepoTransient):
        push_branch(mirror, down, HEADER, "frogfix/issue-1", upstream.second)
    assert not upstream.server.pushes or all(p.status != 200 for p in upstream.server.pushes)


@pytest.mark.parametrize(
    "patch",
    [
        "diff --git a/../evil b/../evil\nnew file mode 100644\n--- /dev/null\n+++ b/../evil\n@@ -0,0 +1 @@\n+x\n",
        "diff --git a/.git/config b/.git/config\nnew file mode 100644\n--- /dev/null\n+++ b/.git/config\n"
        "@@ -0,0 +1 @@\n+x\n",
        "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-nothere\n+x\n",
        "",
        "   \n",
    ],
)
def test_bad_patches_are_refused(upstream: Upstream, cache: RepoCache, tmp_path: Path, patch: str) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    with pytest.raises(RepoError):
        commit_patch(mirror, upstream.second, patch, "x", ("FrogFix", "f@l"), tmp_path / "s")
    assert not (tmp_path / "evil").exists()


def test_commit_patch_refuses_a_bad_identity(upstream: Upstream, cache: RepoCache, tmp_path: Path) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    patch = "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-hello\n+bye\n"
    with pytest.raises(RepoError):
        commit_patch(mirror, upstream.second, patch, "x", ("Evil\nName", "f@l"), tmp_path / "s")
    sha = commit_patch(mirror, upstream.second, patch.encode(), "x", ("FrogFix", "f@l"), tmp_path / "s")
    assert resolve(mirror, sha) == sha


# -- removal -----------------------------------------------------------------------------------


def in_child(fn: Callable[[], None], *, uid: int | None = None) -> int:
    """Run `fn` in a forked child (as `uid` when given); its exit code: 0 ok, 1 RepoError, 2 other."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 2
        try:
            if uid is not None:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            fn()
            code = 0
        except RepoError:
            code = 1
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


NOBODY = 65534


@pytest.fixture
def shared_tmp(tmp_path: Path) -> Iterator[Path]:
    """A folder an unprivileged uid can work in (pytest's own is root-only when we are root)."""
    folder = Path(tempfile.mkdtemp(prefix="frogfix-repos-"))
    folder.chmod(0o777)
    yield folder
    remove_workspace(folder)


def build_hostile_tree(root: Path, outside: Path) -> Path:
    """What a sandbox may leave: read-only files, unreadable folders, a symlink pointing out."""
    ws = root / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "f.txt").write_text("x")
    (ws / "a" / "link").symlink_to(outside, target_is_directory=True)
    (ws / "a" / "b" / "f.txt").chmod(0o400)
    (ws / "a" / "b").chmod(0o500)
    (ws / "a").chmod(0o000)
    return ws


def test_remove_workspace_handles_read_only_trees_and_never_follows_links(shared_tmp: Path) -> None:
    outside = shared_tmp / "outside"
    outside.mkdir(mode=0o755)
    (outside / "keep.txt").write_text("keep")
    outside.chmod(0o555)
    uid = NOBODY if os.geteuid() == 0 else None  # as root, permissions would not be tested at all
    if uid is not None:
        assert in_child(lambda: build_hostile_tree(shared_tmp, outside), uid=uid) == 0
    else:
        build_hostile_tree(shared_tmp, outside)
    ws = shared_tmp / "ws"
    assert in_child(lambda: remove_workspace(ws), uid=uid) == 0
    assert not ws.exists()
    assert (outside / "keep.txt").read_text() == "keep"
    assert stat.S_IMODE(outside.stat().st_mode) == 0o555  # not chmod-ed through the link
    remove_workspace(ws)  # already gone: fine


def test_remove_workspace_reports_what_it_cannot_remove(shared_tmp: Path) -> None:
    """A tree owned by someone else in a folder we may not write: RepoError, not a crash."""
    theirs = shared_tmp / "theirs"
    (theirs / "sub").mkdir(parents=True)
    (theirs / "sub" / "f").write_text("x")
    if os.geteuid() == 0:
        theirs.chmod(0o755)
        (theirs / "sub").chmod(0o755)
        assert in_child(lambda: remove_workspace(theirs), uid=NOBODY) == 1
    else:
        with pytest.raises(RepoError):
            remove_workspace(Path("/proc/self/fdinfo"))


def test_retry_transient_retries_network_trouble_only() -> None:
    waits: list[float] = []
    outcomes: list[Exception | str] = [gitcalls.RepoTransient("502"), gitcalls.RepoTransient("reset"), "ok"]

    def flaky() -> str:
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    retry = replace(GIT_RETRY, sleep=waits.append, jitter=lambda: 1.0)
    assert gitcalls.retry_transient("git fetch", flaky, retry=retry) == "ok"
    assert waits == [2.0, 4.0]

    def refused() -> str:
        raise gitcalls.RepoError("authentication failed")

    waits.clear()
    with pytest.raises(gitcalls.RepoError, match="authentication"):
        gitcalls.retry_transient("git push", refused, retry=replace(GIT_RETRY, sleep=waits.append))
    assert waits == []  # a permanent error is not worth another try

    def down() -> str:
        raise gitcalls.RepoTransient("connection refused")

    with pytest.raises(gitcalls.RepoTransient):
        gitcalls.retry_transient("git fetch", down, retry=replace(GIT_RETRY, base_delay_s=0.0, sleep=waits.append))
    assert waits == [0.0, 0.0]  # bounded: three tries, then the last error


def test_push_options_reach_the_server_and_odd_ones_are_refused_before_the_network(
    upstream: Upstream, cache: RepoCache
) -> None:
    """GitLab's `ci.skip` travels as `git push -o`; nothing else can ride along in an option."""
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    branch = gitcalls.branch_for_issue(9)
    push_branch(mirror, upstream.url, HEADER, branch, upstream.second, push_options=["ci.skip"])
    assert upstream.server.pushes[-1].options == ["ci.skip"] and upstream.rev(f"refs/heads/{branch}") == upstream.second
    second = upstream.second
    push_branch(mirror, upstream.url, HEADER, branch, second, expect_old=second, push_options=["ci.skip"])
    assert upstream.server.pushes[-1].options == ["ci.skip"]
    before = len(upstream.server.requests)
    for odd in ("ci.skip\nci.variable=A=1", "", "-o", "--receive-pack=x", "ci.skip\0"):
        with pytest.raises(RepoError, match="invalid push option"):
            push_branch(mirror, upstream.url, HEADER, branch, upstream.second, push_options=[odd])
    assert len(upstream.server.requests) == before
