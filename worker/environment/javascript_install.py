"""The install step's text: the script a setup sandbox runs, its environment, and the install files cleaned.

Kept apart from javascript.py (which decides and caches) so the builder's setup sandbox can take the
variables without the JavaScript module, and each piece can be read and tested as text.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence

from sandbox.base import ENV_DIR
from worker.environment.javascript_declared import PUBLIC_REGISTRIES, JavaScriptPlan
from worker.environment.layout import CHECKOUT_FOLDER, PACKAGE_MANAGER_VARIABLES, SCRATCH
from worker.environment.steps import pump_lines

CACHE = "/workspace/.frogfix-cache"  # the package managers' download caches: in the workspace's room, never saved
# Yarn Berry keeps its install state in .yarn/ and refuses to run scripts without it: FrogFix keeps it in
# the root node_modules, which every sandbox of the job gets (layout.py sets the same path there).
YARN_STATE = PACKAGE_MANAGER_VARIABLES["YARN_INSTALL_STATE_PATH"]
# Files runners write inside their own package (vitest --typecheck: tsc's build info in vitest/dist), which is
# read-only in a job's sandbox: each becomes a link into the sandbox's own /tmp.
RUNNER_WRITES = (("vitest/dist", "tsconfig.tmp.tsbuildinfo"),)

# .npmrc keys that shape the installed tree, kept; every other key (registries, credentials, proxies,
# certificates, scripts, paths, pnpmfiles) is dropped, so no rc file sends the install elsewhere.
NPMRC_KEPT = frozenset({
    "shamefully-hoist", "public-hoist-pattern", "hoist-pattern", "hoist", "node-linker", "auto-install-peers",
    "strict-peer-dependencies", "dedupe-peer-dependents", "resolve-peers-from-workspace-root",
    "link-workspace-packages", "prefer-workspace-packages", "shared-workspace-lockfile", "legacy-peer-deps",
    "install-strategy", "include-workspace-root", "inject-workspace-packages", "peers-suffix-max-length",
    "virtual-store-dir-max-length", "lockfile-include-tarball-url", "save-workspace-protocol", "omit", "include",
})
# .yarnrc.yml's top-level keys kept (Yarn Berry); registries, scopes, auth, yarnPath and plugins go.
YARNRC_KEPT = frozenset({"packageExtensions", "nmHoistingLimits", "nmMode", "nmSelfReferences", "compressionLevel"})
# pnpm-workspace.yaml's top-level keys dropped (pnpm 10 reads settings there too).
PNPM_WORKSPACE_DROPPED = re.compile(
    r"^(registry|registries|storeDir|pnpmfile|globalPnpmfile|npmPath|cacheDir|scriptShell|shellEmulator|"
    r"managePackageManagerVersions|packageManagerStrict|packageManagerStrictVersion|httpProxy|httpsProxy|"
    r"noProxy|ca|cafile|cert|key|strictSsl|gitShallowHosts)\s*:"
)



def rewrite_registry_urls(text: str, registry: str, mirror_spellings: Sequence[str] = (), inside: str = "") -> str:
    """The lockfile's registry URLs pointed at the relay (hashes untouched): the public registry's to the
    mirror's registry path, the mirror's own (a lockfile made against it) to the same path on the relay."""
    for spelling in mirror_spellings:
        text = text.replace(spelling + "/", inside + "/")
    for host in PUBLIC_REGISTRIES:
        text = text.replace(f"https://{host}/", registry).replace(f"http://{host}/", registry)
    return text


def clean_npmrc(text: str) -> str:
    kept = []
    for line in text.splitlines():
        key = line.split("=", 1)[0].strip()
        if "=" in line and key in NPMRC_KEPT:
            kept.append(line)
    return "\n".join(kept) + ("\n" if kept else "")


def clean_yarnrc_yml(text: str) -> str:
    kept, keep = [], False
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            keep = line.split(":", 1)[0].strip().strip("\"'") in YARNRC_KEPT
        if keep:
            kept.append(line)
    return "\n".join(kept) + ("\n" if kept else "")


def clean_pnpm_workspace(text: str) -> str:
    kept, keep = [], True
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            keep = PNPM_WORKSPACE_DROPPED.match(line) is None
        if keep:
            kept.append(line)
    return "\n".join(kept) + ("\n" if kept else "")


def install_script(plan: JavaScriptPlan) -> str:
    """The setup sandbox's script: the package manager from the mirror, then the frozen install, scripts off,
    then each node_modules folder saved under ENV_DIR/checkout at its place."""
    manager = plan.manager
    reg = '"$npm_config_registry"'
    npm = f"npm --registry={reg} --cache={CACHE}/npm --no-audit --no-fund --no-update-notifier"
    script = [*pump_lines(), f"mkdir -p {CACHE} {ENV_DIR}/pm {ENV_DIR}/{CHECKOUT_FOLDER}", "cd /workspace"]
    if manager.package:
        script.append(f'echo "frogfix: installing {manager.shown()} from the package mirror"')
        script.append(
            f"{npm} install --prefix {ENV_DIR}/pm --ignore-scripts --no-save --no-package-lock "
            f"{shlex.quote(f'{manager.package}@{manager.version}')} >/dev/null"
        )
    script.append(f'echo "frogfix: installing the packages {plan.lockfile} pins ({manager.shown()}, scripts off)"')
    script.append(_install_command(manager.kind, npm, reg))
    script.append('echo "frogfix: running the dependencies\' own install scripts (the mirror is the only way out)"')
    script.append(_rebuild_command(manager.kind, npm))
    script.append(f"mkdir -p {' '.join(SCRATCH)}")
    for package, name in RUNNER_WRITES:  # each install of the package (pnpm keeps one per peer set)
        script.append(
            f"find node_modules -type d -path '*/node_modules/{package}' 2>/dev/null | while read -r d; do "
            f'ln -sfn "/tmp/.frogfix-{package.replace("/", "-")}-$(echo "$d" | cksum | cut -d" " -f1)-{name}" '
            f'"$d/{name}"; done'
        )
    for rel in (".", *plan.workspaces):
        source = "/workspace" if rel == "." else f"/workspace/{rel}"
        target = f"{ENV_DIR}/{CHECKOUT_FOLDER}" + ("" if rel == "." else f"/{rel}")
        script.append(
            f"if [ -d {shlex.quote(source)}/node_modules ] && [ ! -L {shlex.quote(source)}/node_modules ]; then "
            f"mkdir -p {shlex.quote(target)} && cp -a {shlex.quote(source)}/node_modules {shlex.quote(target)}/ && "
            f"rm -rf {shlex.quote(source)}/node_modules; fi"
        )
    script.append('echo "frogfix: environment ready"')
    return "\n".join(script) + "\n"


def _rebuild_command(kind: str, npm: str) -> str:
    """The dependencies' own install scripts (esbuild's check, a native addon's prebuilt binary), after the
    frozen install: the repository's own scripts are not in the install's view (strip_scripts), so only code
    the mirror served runs, and a script that needs the internet (a binary download) fails, naming itself.
    pnpm runs only the builds the repository allowed (onlyBuiltDependencies), as pnpm itself does."""
    pm = f"{ENV_DIR}/pm/node_modules/.bin"
    if kind == "pnpm":
        return f"{pm}/pnpm rebuild --reporter=append-only --config.store-dir={CACHE}/pnpm"
    if kind == "yarn-berry":
        return f"YARN_ENABLE_SCRIPTS=true {pm}/yarn rebuild"
    return f"{npm} rebuild --foreground-scripts"  # npm's own, and Yarn classic's tree (it has no rebuild)


def strip_scripts(package_json: str) -> str:
    """A package.json as the install sees it: without `scripts`, so no lifecycle script of the repository runs."""
    try:
        package = json.loads(package_json)
    except ValueError:
        return package_json  # the package manager says what is wrong with it
    if isinstance(package, dict):
        package.pop("scripts", None)
    return json.dumps(package, indent=2) + "\n"


_SCRIPT_FAILURE = (
    re.compile(r"npm (?:error|ERR!) path \S*?/node_modules/((?:@[^/\s]+/)?[^/\s]+)\s*$", re.M),
    re.compile(r"node_modules/(?:\.pnpm/[^/\s]+/node_modules/)?((?:@[^/\s]+/)?[^/\s]+) (?:pre|post)?install: ", re.M),
    re.compile(r"YN0009: .*?((?:@[^/\s]+/)?[^@/\s]+)@npm:\S+ couldn't be built", re.M),
)


def failure_reason(what: str, log: str, exit_code: int) -> str:
    """Why the install failed, in one line: a dependency's own install script named, else the installer's error."""
    script_of = failed_install_script(log)
    if script_of:
        return (f"the install script of the dependency {script_of} failed (exit {exit_code}): one that downloads "
                "at install (a binary) cannot reach anything but the package mirror; add what it fetches to the "
                "mirror, or drop the dependency")
    return f"{what} failed (exit {exit_code}){install_error(log)}"


def failed_install_script(log: str) -> str:
    """The dependency whose own install script failed, as the package manager named it ("" when none did)."""
    for pattern in _SCRIPT_FAILURE:
        found = pattern.search(log)
        if found:
            return found.group(1)
    return ""


def _install_command(kind: str, npm: str, reg: str) -> str:
    pm = f"{ENV_DIR}/pm/node_modules/.bin"
    if kind == "npm":
        return f"{npm} ci --ignore-scripts --include=dev --include=optional --include=peer"
    if kind == "pnpm":
        return (
            f"{pm}/pnpm install --frozen-lockfile --ignore-scripts --ignore-pnpmfile --registry={reg} "
            f"--store-dir={CACHE}/pnpm --package-import-method=copy --config.manage-package-manager-versions=false "
            "--config.verify-deps-before-run=false --reporter=append-only"
        )
    if kind == "yarn":
        return (
            f"{pm}/yarn install --frozen-lockfile --non-interactive --ignore-scripts --no-default-rc --ignore-engines "
            f"--registry {reg} --cache-folder {CACHE}/yarn --network-timeout 600000"
        )
    return f"{pm}/yarn install --immutable --mode=skip-build"  # Yarn Berry: settings from YARN_* (setup_env)


def install_env(registry: str, node_options: str = "") -> dict[str, str]:
    """The variables the install reads besides the script's flags: the registry, no rc file of the user, no
    version switching, Yarn Berry's settings (environment variables beat .yarnrc.yml)."""
    return {
        "npm_config_registry": registry,
        "npm_config_userconfig": "/tmp/.frogfix-no-user-npmrc",
        "npm_config_globalconfig": "/tmp/.frogfix-no-global-npmrc",
        "npm_config_update_notifier": "false",
        # A mirror on the company's network answers fast or not at all: retry twice, briefly (npm and pnpm).
        "npm_config_fetch_retries": "2",
        "npm_config_fetch_retry_mintimeout": "1000",
        "npm_config_fetch_retry_maxtimeout": "5000",
        "COREPACK_ENABLE_STRICT": "0",
        "COREPACK_ENABLE_AUTO_PIN": "0",
        "YARN_IGNORE_PATH": "1",
        "YARN_NPM_REGISTRY_SERVER": registry.rstrip("/"),
        "YARN_UNSAFE_HTTP_WHITELIST": "127.0.0.1",
        "YARN_NODE_LINKER": "node-modules",
        "YARN_ENABLE_SCRIPTS": "false",
        "YARN_ENABLE_GLOBAL_CACHE": "false",
        "YARN_CACHE_FOLDER": f"{CACHE}/berry",
        "YARN_ENABLE_TELEMETRY": "false",
        "YARN_ENABLE_IMMUTABLE_INSTALLS": "true",
        "YARN_ENABLE_PROGRESS_BARS": "false",
        "YARN_PLUGINS": "",
        "YARN_INSTALL_STATE_PATH": YARN_STATE,
        "CI": "1",
        **({"NODE_OPTIONS": node_options} if node_options else {}),
    }




_ERROR_LINE = re.compile(
    r"^(?:npm (?:ERR!|error) (?!code |errno |A complete log|Log files|\s*$)|ERR_PNPM_\w+|\u2009?ERR_PNPM"
    r"|error (?!Command failed)|\u27a4 YN\d{4}: .*(?:Error|error|failed|not found|Not Found|Unauthorized|denied)"
    r"|Error: )"
)


def install_error(log: str) -> str:
    """The package manager's own first error line, for the one-line reason (": npm error 404 Not Found - GET …")."""
    for line in log.splitlines():
        text = line.strip()
        if _ERROR_LINE.search(text):
            return f": {text}"[:302]
    return ""
