"""Which paths are forge CI configuration: the one home of that list.

A change to CI configuration would run attacker-written jobs with the project's CI variables
before any human looks, so the review rules refuse it by default (`FROGFIX_ALLOW_CI_CHANGES`
turns the refusal into a flag). Besides the fixed files of GitLab, Gitea/Forgejo/GitHub Actions,
Woodpecker, Drone and Jenkins, the files that `.gitlab-ci.yml` pulls in with a local `include:`
(its own, or a child pipeline's under a job's `trigger:`) are CI configuration too, wherever
they live; `local_includes` reads them from the file's text. This fails closed: when a CI file
exists but cannot be read (not YAML, too large, too many includes), every YAML file counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from app.patches import shown_path

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
MAX_CI_FILE_BYTES = 256 * 1024  # a larger CI file is not read for includes: every YAML file then counts
MAX_INCLUDED_FILES = 64  # local includes followed, in all (nested ones included)
# What counts as CI configuration when a CI file cannot be read: every file GitLab could include.
ANY_YAML_FILE: tuple[str, ...] = ("*.[yY][mM][lL]", "*.[yY][aA][mM][lL]")


class CiUnreadable(ValueError):
    """A CI file exists but its includes cannot be known; the message says why."""


@dataclass(frozen=True)
class CiPaths:
    """The CI configuration of one tree or two: patterns, and why a CI file could not be read, if so."""

    patterns: tuple[str, ...] = CI_CONFIG_PATTERNS
    unread: str | None = None  # set: every YAML file counts as CI configuration too (ANY_YAML_FILE)

    def __add__(self, other: CiPaths) -> CiPaths:
        unread = "; ".join(why for why in (self.unread, other.unread) if why) or None
        return CiPaths(tuple(dict.fromkeys([*self.patterns, *other.patterns])), unread)


class _CiLoader(yaml.SafeLoader):
    """Safe loading, but a tag it does not know (GitLab's `!reference`, any `!custom`) builds the plain
    sequence, mapping or scalar under it instead of failing the whole file."""


def _untagged(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_CiLoader.add_constructor(None, _untagged)


def local_includes(text: bytes) -> list[str]:
    """The local `include:` entries of one GitLab CI file, as repository paths or globs (no leading `/`).

    Read from the top-level `include:` and from every job's `trigger: include:` (child pipelines).
    Local entries are strings without a scheme (`/ci/build.yml`, `ci/*.yml`) and mappings with a
    `local:` key, alone or in a list. Remote, project and template includes are not in the
    repository. Raises CiUnreadable when the file is too large or not YAML.
    """
    if len(text) > MAX_CI_FILE_BYTES:
        raise CiUnreadable(f"larger than {MAX_CI_FILE_BYTES} bytes")
    try:
        data = yaml.load(text.decode("utf-8", "replace"), Loader=_CiLoader)  # a SafeLoader subclass
    except (yaml.YAMLError, RecursionError, ValueError, TypeError) as exc:  # deep nesting, bad keys or scalars
        raise CiUnreadable(f"not YAML: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}") from None
    found = []
    for entries in _include_lists(data):
        for entry in entries if isinstance(entries, list) else [entries]:
            path = _local_path(entry)
            if path:
                found.append(path.lstrip("/"))
    return found


def _include_lists(data: Any) -> Iterator[Any]:
    """The top-level `include:` value, then each job's `trigger: include:` value."""
    if not isinstance(data, dict):
        return
    if data.get("include") is not None:
        yield data["include"]
    for job in data.values():
        trigger = job.get("trigger") if isinstance(job, dict) else None
        if isinstance(trigger, dict) and trigger.get("include") is not None:
            yield trigger["include"]


def _local_path(entry: Any) -> str | None:
    if isinstance(entry, str):
        return None if "://" in entry else entry.strip()
    if isinstance(entry, dict) and isinstance(entry.get("local"), str):
        return str(entry["local"]).strip()
    return None


def ci_paths(read: Callable[[str], bytes | None], tree: str) -> CiPaths:
    """The fixed CI paths plus every file `.gitlab-ci.yml` of `tree` includes locally, nested ones followed.

    `read(path)` gives a file's bytes in that tree, None when there is none, and raises
    CiUnreadable when it is there but is no regular file or is over MAX_CI_FILE_BYTES. Globs count
    as patterns and are not followed (matching them needs the whole tree). A CI or included file
    that cannot be read, or more than MAX_INCLUDED_FILES includes, fail closed (`unread` says why).
    """
    patterns = list(CI_CONFIG_PATTERNS)
    pending, seen = [GITLAB_CI_FILE], {GITLAB_CI_FILE}
    try:
        while pending:
            path = pending.pop(0)
            for included in local_includes(read(path) or b""):
                if included in seen:
                    continue
                seen.add(included)
                if len(seen) > MAX_INCLUDED_FILES + 1:
                    raise CiUnreadable(f"more than {MAX_INCLUDED_FILES} local includes")
                patterns.append(included)
                if not any(ch in included for ch in "*?["):
                    pending.append(included)
    except CiUnreadable as exc:
        what = GITLAB_CI_FILE if path == GITLAB_CI_FILE else f"{GITLAB_CI_FILE}'s include {shown_path(path)}"
        return CiPaths(tuple(patterns), f"the {tree} tree's {what} cannot be read for its includes ({exc})")
    return CiPaths(tuple(patterns))
