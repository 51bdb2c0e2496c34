"""Which paths are forge CI configuration: the one home of that list.

A change to CI configuration would run attacker-written jobs with the project's CI variables
before any human looks, so the review rules refuse it by default (`FROGFIX_ALLOW_CI_CHANGES`
turns the refusal into a flag). Besides the fixed files of GitLab, Gitea/Forgejo/GitHub Actions,
Woodpecker, Drone and Jenkins, the files that `.gitlab-ci.yml` pulls in with a local `include:`
are CI configuration too, wherever they live; `local_includes` reads them from the file's text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

GITLAB_CI_FILE = ".gitlab-ci.yml"
# Fixed CI configuration paths (fnmatch patterns, `*` also crosses `/`).
CI_CONFIG_PATTERNS: tuple[str, ...] = (
    GITLAB_CI_FILE,
    ".github/**",  # Actions workflows and the composite actions they use
    ".gitea/**",
    ".forgejo/**",
    ".woodpecker*",
    ".drone.yml",
    "Jenkinsfile",
)
MAX_CI_FILE_BYTES = 256 * 1024  # a larger CI file is not read for includes; its own path is still CI
MAX_INCLUDED_FILES = 64  # local includes followed, in all (nested ones included)


def local_includes(text: bytes) -> list[str]:
    """The local `include:` entries of one GitLab CI file, as repository paths or globs (no leading `/`).

    Local entries are strings without a scheme (`/ci/build.yml`, `ci/*.yml`) and mappings with a
    `local:` key, alone or in a list. Remote, project and template includes are not in the
    repository. A file that is too large or not YAML yields nothing (its own path is CI anyway).
    """
    if len(text) > MAX_CI_FILE_BYTES:
        return []
    try:
        data = yaml.safe_load(text.decode("utf-8", "replace"))
    except (yaml.YAMLError, RecursionError, ValueError):  # deep nesting, bad scalars: not a usable CI file
        return []
    entries = data.get("include") if isinstance(data, dict) else None
    if entries is None:
        return []
    found = []
    for entry in entries if isinstance(entries, list) else [entries]:
        path = _local_path(entry)
        if path:
            found.append(path.lstrip("/"))
    return found


def _local_path(entry: Any) -> str | None:
    if isinstance(entry, str):
        return None if "://" in entry else entry.strip()
    if isinstance(entry, dict) and isinstance(entry.get("local"), str):
        return str(entry["local"]).strip()
    return None


def ci_patterns(read: Callable[[str], bytes | None]) -> tuple[str, ...]:
    """The fixed CI paths plus every file `.gitlab-ci.yml` includes locally, nested includes followed.

    `read(path)` gives a regular file's bytes in one tree, or None. Globs count as patterns and
    are not followed (matching them needs the whole tree); at most MAX_INCLUDED_FILES are read.
    """
    patterns = list(CI_CONFIG_PATTERNS)
    pending, seen = [GITLAB_CI_FILE], {GITLAB_CI_FILE}
    while pending and len(seen) <= MAX_INCLUDED_FILES:
        text = read(pending.pop(0))
        for path in local_includes(text or b""):
            if path in seen:
                continue
            seen.add(path)
            patterns.append(path)
            if not any(ch in path for ch in "*?["):
                pending.append(path)
    return tuple(patterns)
