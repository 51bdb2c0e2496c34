"""Three real JavaScript/TypeScript upstream bug fixes (../shared/fixtures/realrepos-js), read in place.

`JsTask` reads a task folder as `Task` does (the model double's `fixed_files` takes either); the
lockfile readers say which (name, version) pairs a lockfile pins, so a test can hold the registry's
log and the installed tree to them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tests.realrepos import ROOT, Task

JS_FIXTURES = ROOT.parent / "shared" / "fixtures" / "realrepos-js"


class JsTask(Task):
    """A realrepos-js task: its task.json names `test_paths`, `base_commit` and `fix_commit`."""

    @classmethod
    def load(cls, folder: Path) -> JsTask:
        data = json.loads((folder / "task.json").read_text())
        return cls(folder.name, folder, {**data, "base": data["base_commit"], "fix": data["fix_commit"]})

    @property
    def test_files(self) -> list[str]:
        return list(self.data["test_paths"])

    @property
    def source_files(self) -> list[str]:
        return list(self.data["source_paths"])

    @property
    def lockfile(self) -> str:
        return str(self.data["lockfile"])


def load_js_tasks(root: Path = JS_FIXTURES) -> list[JsTask]:
    manifest = json.loads((root / "MANIFEST.json").read_text())
    return [JsTask.load(root / entry["task"]) for entry in manifest["tasks"]]


def lockfile_pins(repo: Path, lockfile: str) -> set[tuple[str, str]]:
    """The (name, version) pairs the lockfile pins, read the way each package manager writes it."""
    text = (repo / lockfile).read_text()
    if lockfile in ("package-lock.json", "npm-shrinkwrap.json"):
        pins = set()
        for key, entry in json.loads(text).get("packages", {}).items():
            if "node_modules/" in key and not entry.get("link") and entry.get("version"):
                pins.add((entry.get("name") or key.rsplit("node_modules/", 1)[1], entry["version"]))
        return pins
    if lockfile == "yarn.lock":
        pins, name = set(), None
        for line in text.splitlines():
            if line and not line[0].isspace() and line.rstrip().endswith(":"):
                spec = line.split(",")[0].strip().strip('"').rstrip(":").strip('"')
                name = spec[: spec.rindex("@")] if spec.rindex("@") > 0 else spec
            elif name and (found := re.match(r'^\s+version:?\s+"?([^"\s]+)"?', line)):
                pins.add((name, found.group(1)))
        return pins
    pins, inside = set(), False  # pnpm-lock.yaml: the `packages:` section's keys are name@version
    for line in text.splitlines():
        if line.strip() and not line.startswith(" "):
            inside = line.startswith("packages:")
            continue
        if inside and (found := re.match(r"^  '?(@?[^@'\s]+)@([^'(\s:]+)'?:", line)):
            pins.add((found.group(1), found.group(2)))
    return pins


def installed_packages(checkout: Path) -> set[tuple[str, str]]:
    """(name, version) of every package folder under the environment's node_modules trees."""
    found = set()
    for folder, dirs, names in os.walk(checkout):
        here = Path(folder)
        if "package.json" in names and "node_modules" in here.parts:
            parent = here.parent.name
            if parent == "node_modules" or (parent.startswith("@") and here.parent.parent.name == "node_modules"):
                try:
                    data = json.loads((here / "package.json").read_text())
                except (OSError, ValueError):
                    continue
                if isinstance(data.get("name"), str) and isinstance(data.get("version"), str):
                    found.add((data["name"], data["version"]))
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
    return found
