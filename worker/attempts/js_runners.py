"""A JavaScript or TypeScript repository's test runner, found in package.json, and how FrogFix reads it per test.

Why: `npm test` is rarely the runner itself. It is a script (`pnpm lint && vitest run --typecheck`,
`jest && npm run check:type:ts`) that runs lint and type checks beside the tests, and it starts the
runner through npm, a node program: node's child_process never passes extra descriptors on, so a
runner started that way never gets the results channel. FrogFix therefore runs the runner's own
invocation, started by the shell itself, and never appends flags to a compound script. Lint and type
checks are not test evidence.

The runners read per test (jest, vitest, mocha, `node --test`) load FrogFix's preload through
NODE_OPTIONS (`js_reporters/hook.cjs`, written into the sandbox by worker/attempts/evidence.py);
worker/attempts/run_checks.py reads what it sends.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

HOOK_DIR = "/tmp/.frogfix-js"
HOOK_FILE = "hook.cjs"
_REPORTERS = Path(__file__).with_name("js_reporters")
REPORTER_FILES = ("hook.cjs", "jest-reporter.cjs", "vitest-reporter.mjs", "node-test-reporter.mjs")
# The preload's environment: NODE_OPTIONS applies wherever node starts (a script, npx, a package manager).
NODE_ENV = {"NODE_OPTIONS": f"--require {HOOK_DIR}/{HOOK_FILE}"}
RUNNERS = ("jest", "vitest", "mocha", "node-test")
_PACKAGE_MANAGERS = ("npm", "pnpm", "yarn")
_SEPARATORS = frozenset({"&&", "||", ";", "|", "&", ";;", "|&"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
_COVERAGE = frozenset({"nyc", "c8"})  # wrappers that start the runner as a child: the channel would not reach it
_MAX_DEPTH = 4
_WATCH = frozenset({"--watch", "--watchAll", "-w"})
# npm's own commands that are no script: `npm run` follows a script, `npm exec`/`npx` a package's binary.
_NPM_SCRIPT_VERBS = {"run", "run-script", "rum", "urn"}
_TEST_VERBS = {"test", "t", "tst"}


def js_test_command(package_json: str) -> tuple[str, str] | None:
    """The runner's own command inside package.json's `scripts.test` and why; None when none runs one."""
    try:
        package = json.loads(package_json)
    except ValueError:
        return None
    scripts = package.get("scripts") if isinstance(package, dict) else None
    if not isinstance(scripts, dict) or not isinstance(scripts.get("test"), str):
        return None
    found = _runner_in(scripts, scripts["test"], _MAX_DEPTH)
    if found is None:
        return None
    shown = {"node-test": "node --test"}.get(runner_of(found) or "", runner_of(found))
    return found, f"package.json's test script runs {shown} (`{scripts['test'][:120]}`)"


def detect_js(workspace: Path) -> tuple[str, str] | None:
    """`js_test_command` for the workspace's package.json, if it has one that names a runner."""
    path = workspace / "package.json"
    if not path.is_file():
        return None
    try:
        return js_test_command(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def _segments(script: str) -> list[list[str]]:
    """The script's simple commands (split on &&, ||, ;, |), each as the shell's words."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    segments: list[list[str]] = [[]]
    try:
        for token in lexer:
            if token in _SEPARATORS:
                segments.append([])
            else:
                segments[-1].append(token)
    except ValueError:
        return []
    return [words for words in segments if words]


def _runner_in(scripts: Mapping[str, object], script: str, depth: int) -> str | None:
    if depth <= 0:
        return None
    for words in _segments(script):
        env, words = _environment(words)
        if not words:
            continue
        program = words[0]
        if program in _PACKAGE_MANAGERS or program == "npx":
            target = _script_named(program, words[1:])
            if target is not None and isinstance(scripts.get(target), str):
                found = _runner_in(scripts, str(scripts[target]), depth - 1)
                if found:
                    return found
                continue
            words = _binary_of(program, words[1:])
            if not words:
                continue
        command = _runner_words(words)
        if command:
            return " ".join([*env, shlex.join(command)])
    return None


def _environment(words: list[str]) -> tuple[list[str], list[str]]:
    """`A=b` prefixes (through `cross-env` and `env` too), kept for the shell; NODE_OPTIONS extends FrogFix's own."""
    env: list[str] = []
    while words:
        if words[0] in ("cross-env", "cross-env-shell", "env"):
            words = words[1:]
        elif _ASSIGNMENT.fullmatch(words[0]):
            name, _, value = words[0].partition("=")
            quoted = re.sub(r'([\\"$`])', r"\\\1", value)
            env.append(f'{name}="$NODE_OPTIONS {quoted}"' if name == "NODE_OPTIONS" else shlex.quote(words[0]))
            words = words[1:]
        else:
            break
    return env, words


def _script_named(program: str, args: list[str]) -> str | None:
    """The script `npm run x`, `pnpm x`, `yarn run x`, `npm test` runs; None when it runs no script."""
    while args and args[0].startswith("-") and program != "npm":
        args = args[1:]
    if program == "npx" or not args:
        return None
    verb = args[0]
    if verb in _TEST_VERBS:
        return "test"
    if program == "npm":
        return args[1] if verb in _NPM_SCRIPT_VERBS and len(args) > 1 else None
    if verb == "run":
        return args[1] if len(args) > 1 else None
    return verb  # pnpm x, yarn x: a script when there is one of that name, else a binary


def _binary_of(program: str, args: list[str]) -> list[str]:
    """The binary `npx jest`, `pnpm exec vitest`, `yarn vitest`, `npm exec -- mocha` starts (as its bare command)."""
    while args and args[0] in ("exec", "dlx", "--", "-y", "--yes", "--no-install", "--silent", "-s"):
        args = args[1:]
    return args if program != "npm" or (args and args[0] in RUNNERS) else []


def _runner_words(words: list[str]) -> list[str] | None:
    """The runner's own command from a simple command's words, or None when it starts no runner FrogFix reads."""
    while words and words[0] in _COVERAGE:
        words = words[1:]
        while words and words[0].startswith("-"):
            words = words[1:]
        if words and words[0] in (*_PACKAGE_MANAGERS, "npx"):
            words = _binary_of(words[0], words[1:])
    if not words:
        return None
    program = words[0].rsplit("/", 1)[-1]
    if program in ("jest", "mocha", "_mocha"):  # never watching: the run must end
        return [program, *(w for w in words[1:] if w not in _WATCH)]
    if program == "vitest":
        rest = [w for w in words[1:] if w not in _WATCH]
        if rest[:1] in (["watch"], ["dev"]):
            rest = rest[1:]
        if rest[:1] == ["bench"]:
            return None
        return ["vitest", *(rest if rest[:1] == ["run"] else ["run", *rest])]
    if program == "node" and "--test" in words[1:]:
        return ["node", *(w for w in words[1:] if w != "--watch")]
    return None


def runner_of(command: str | None) -> str | None:
    """Which runner FrogFix reads the command is itself (jest, vitest, mocha, node-test), or None.

    Only a command the shell starts directly counts (`A=b` prefixes allowed): through npm, npx or a
    script the runner never gets the results channel."""
    if not command:
        return None
    segments = _segments(command)
    if len(segments) != 1:
        return None
    _, words = _environment(segments[0])
    if not words:
        return None
    program = words[0].rsplit("/", 1)[-1]
    if program in ("jest", "vitest", "mocha"):
        return program
    if program == "_mocha":
        return "mocha"
    return "node-test" if program == "node" and "--test" in words[1:] else None


def one_file_hint(command: str | None) -> str | None:
    """How the agent runs one test file with the runner the test command starts, or None for other commands."""
    runner = runner_of(command)
    if runner is None:
        return None
    example = {
        "jest": "jest path/to/file.test.js",
        "vitest": "vitest run path/to/file.test.ts",
        "mocha": "mocha path/to/file.test.js",
        "node-test": "node --test path/to/file.test.js",
    }[runner]
    return f"To run one test file: `{example}`."


def reporter_files(sentinels: Mapping[str, str]) -> dict[str, str]:
    """The preload and reporters as written into the sandbox for one run, the preload's sentinels filled in."""
    files = {name: (_REPORTERS / name).read_text(encoding="utf-8") for name in REPORTER_FILES}
    line = "const SENTINELS = {};"
    assert line in files[HOOK_FILE]
    files[HOOK_FILE] = files[HOOK_FILE].replace(line, f"const SENTINELS = {json.dumps(dict(sentinels))};", 1)
    return files


def through_node(command: str | None) -> str | None:
    """The runner a command starts through node (npx, npm, pnpm, yarn, a package.json script), which
    never passes the results channel on; None when it starts none that way."""
    if not command or runner_of(command) is not None:
        return None
    for words in _segments(command):
        _, words = _environment(words)
        if words and (words[0] in _PACKAGE_MANAGERS or words[0] == "npx"):
            found = runner_of(shlex.join(_binary_of(words[0], words[1:])))
            if found is not None or _script_named(words[0], words[1:]) == "test":
                return found or "package.json's test script"
    return None
