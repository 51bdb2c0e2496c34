"""How a built environment is laid into a sandbox besides ENV_DIR: the checkout folders it provides.

A Python environment is a virtual environment at ENV_DIR and needs nothing more. A JavaScript one holds
the `node_modules` folders the install made, which Node finds only inside the checkout (beside the code
that imports them), so each is bound read-only over the checkout at its own place. The host writes this
layout beside the environment (never inside what a build wrote), and worker/wiring.py reads it for every
sandbox of the job.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from sandbox.base import DEFAULT_PATH, ENV_DIR

LAYOUT_FILE = "layout.json"
# V8 reserves about 10 GB of address space per WebAssembly memory for its trap handler, which the sandbox's
# per-process address-space limit refuses (vitest's parsers are WebAssembly): Node 20.15+ and 22.2+ can do without.
WASM_WITHOUT_TRAP_HANDLER = "--disable-wasm-trap-handler"
KNOWN_NODE_OPTIONS = ("", WASM_WITHOUT_TRAP_HANDLER)
# The package manager in the job's sandboxes works on the installed tree as the install left it: the mirror's
# Yarn, not a `yarnPath` of the repository's; Berry with node_modules and the install state kept there.
PACKAGE_MANAGER_VARIABLES = {
    "YARN_IGNORE_PATH": "1",
    "YARN_NODE_LINKER": "node-modules",
    "YARN_INSTALL_STATE_PATH": "/workspace/node_modules/.frogfix-yarn-install-state.gz",
    "YARN_ENABLE_GLOBAL_CACHE": "false",
    "YARN_ENABLE_TELEMETRY": "false",
    "COREPACK_ENABLE_STRICT": "0",
}
CHECKOUT_FOLDER = "checkout"  # ENV_DIR/checkout/<folder>/node_modules, for each folder of the checkout
PM_BIN = f"{ENV_DIR}/pm/node_modules/.bin"  # the package manager the install used (pnpm, yarn)
WORKSPACE = "/workspace"
# Folders inside the root node_modules that runners write to (vite bundles its config into .vite-temp, vitest
# keeps results in .vite, babel and eslint caches in .cache): made empty at install, and given a small
# writable tmpfs in each sandbox, so the environment itself stays read-only.
SCRATCH = ("node_modules/.vite-temp", "node_modules/.vite", "node_modules/.cache")
_FOLDER = re.compile(r"\.|(?!\.{1,2}(?:/|$))[A-Za-z0-9@._+-]+(?:/(?!\.{1,2}(?:/|$))[A-Za-z0-9@._+-]+)*")


@dataclass(frozen=True)
class Layout:
    """`links`: checkout folders (relative, "." the root) whose node_modules the environment holds; `path`:
    folders put on PATH after each link's node_modules/.bin."""

    ecosystem: str
    links: tuple[str, ...]
    path: tuple[str, ...] = ()
    node_options: str = ""  # NODE_OPTIONS every sandbox of the job gets (see javascript.node_options)

    def binds(self, environment: Path) -> list[tuple[str, str]]:
        """(host folder, folder relative to the checkout) for each node_modules the environment holds."""
        pairs = []
        for rel in self.links:
            inside = "node_modules" if rel == "." else f"{rel}/node_modules"
            pairs.append((str(environment / CHECKOUT_FOLDER / inside), inside))
        return pairs

    def scratch(self, environment: Path) -> tuple[str, ...]:
        """The runner cache folders the install made empty (a tmpfs needs its mount point)."""
        root = environment / CHECKOUT_FOLDER
        made = [rel for rel in SCRATCH if (root / rel).is_dir() and not (root / rel).is_symlink()]
        return tuple(made) if "." in self.links else ()

    def search_path(self) -> str:
        return ":".join([f"{WORKSPACE}/node_modules/.bin", *self.path, DEFAULT_PATH])

    def variables(self) -> dict[str, str]:
        """The sandbox's variables for this environment: PATH, and NODE_OPTIONS where one is needed."""
        found = {"PATH": self.search_path(), **PACKAGE_MANAGER_VARIABLES}
        if self.node_options:
            found["NODE_OPTIONS"] = self.node_options
        return found


def write_layout(entry: Path, layout: Layout) -> None:
    data = {"ecosystem": layout.ecosystem, "links": list(layout.links), "path": list(layout.path),
            "node_options": layout.node_options}
    (entry / LAYOUT_FILE).write_text(json.dumps(data), encoding="utf-8")


def read_layout(environment: Path) -> Layout | None:
    """The layout written beside `environment` (ENTRY/env), None for a plain one (Python's)."""
    path = environment.parent / LAYOUT_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    links = tuple(str(rel) for rel in data.get("links", []) if isinstance(rel, str) and _FOLDER.fullmatch(rel))
    folders = tuple(str(p) for p in data.get("path", []) if isinstance(p, str) and p.startswith(f"{ENV_DIR}/"))
    options = data.get("node_options")
    known = options if isinstance(options, str) and options in KNOWN_NODE_OPTIONS else ""
    return Layout(str(data.get("ecosystem", "")), links, folders, known)
