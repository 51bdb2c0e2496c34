"""`.frogfix.yml`, read by typed models: the one home of its keys, their types, rules and defaults.

All keys are optional:

    test_command: python -m pytest -q      # how to run the tests (no network in the sandbox)
    setup_command: make generated-files    # with FROGFIX_PIP_INDEX_URL: once per job, in the setup phase,
                                           # after the project's own install, offline; without a mirror:
                                           # before each test run, without network
    environment:                           # what to install where detection guesses wrong (each key replaces
      extras: [tests]                      # what was detected for it; see worker/environment/declared.py)
      groups: [test]
      requirements: [requirements/test.txt]
      packages: ["pytest<9"]
      project: true
    image: registry.example/python:3.12     # sandbox image (Kubernetes backend)
    protected_paths: ["migrations/**"]      # paths the bot may not change
    test_timeout: 900                       # seconds
    instructions: |                         # guidance for the agent, beside the AGENTS.md files
      Run the tests with `make check`.

A file that cannot be used is a RepoConfigError naming the first problem in the file: the key's
path, what is wrong and what was found, the YAML line and column, and for an unknown key the key
it most likely meant (from the models' own field names).
"""

from __future__ import annotations

import difflib
import itertools
from pathlib import Path
from typing import Annotated, Any, get_args

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from worker.environment.declared import EXTRA_NAME, Overrides

CONFIG_FILE = ".frogfix.yml"
MAX_CONFIG_BYTES = 64 * 1024
DEFAULT_TEST_TIMEOUT = 900.0
MIN_TEST_TIMEOUT, MAX_TEST_TIMEOUT = 1, 10_800  # seconds
AGENTS_FILE = "AGENTS.md"  # the repository's guidance files, which `instructions` adds to
MAX_INSTRUCTIONS_CHARS = 4_000  # longer guidance belongs in an AGENTS.md file


class RepoConfigError(ValueError):
    """`.frogfix.yml` exists but cannot be used; the message says what to fix, `problem` the same without the
    file's name (the job's ending words it: "the repository's .frogfix.yml is not usable: {problem}")."""

    def __init__(self, message: str, *, problem: str | None = None) -> None:
        super().__init__(message)
        self.problem = problem or message


def config_problem(problem: str) -> RepoConfigError:
    """`.frogfix.yml: {problem}`."""
    return RepoConfigError(f"{CONFIG_FILE}: {problem}", problem=problem)


def config_state(state: str) -> RepoConfigError:
    """`.frogfix.yml {state}` ("is not valid YAML: ..."), whose problem reads "it {state}"."""
    return RepoConfigError(f"{CONFIG_FILE} {state}", problem=f"it {state}")


_RULE = "frogfix_rule"  # the pydantic error type of a value rule below; its message follows the key's path


def _rule(text: str) -> PydanticCustomError:
    """A broken value rule, in words that follow the key's path: "environment.packages takes ..."."""
    return PydanticCustomError(_RULE, "{rule}", {"rule": text})


def _a_name(name: str) -> str:
    if not EXTRA_NAME.fullmatch(name):
        raise _rule(f"has a name that is not one: {name[:80]!r}")
    return name


def _inside(path: str) -> str:
    if path.startswith(("/", "-")) or ".." in path.split("/"):
        raise _rule(f"names a path outside the repository: {path[:80]!r}")
    return path


def _no_option(requirement: str) -> str:
    if requirement.startswith("-") or "\n" in requirement:
        raise _rule("takes requirement strings, not installer options")
    return requirement


def _short_guidance(text: str) -> str:
    if len(text) > MAX_INSTRUCTIONS_CHARS:
        raise _rule(
            f"must be at most {MAX_INSTRUCTIONS_CHARS} characters (it has {len(text)});"
            f" longer guidance belongs in {AGENTS_FILE}"
        )
    return text


# Each field's description is what its value must be: the error messages say "<key> must be <description>".
_Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
_Name = Annotated[str, StringConstraints(min_length=1), AfterValidator(_a_name)]  # an extra's or a group's, unstripped
_TEXT = "a non-empty string"
_STRINGS = "a list of strings"
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


class EnvironmentSection(BaseModel):
    """`environment:`, what to install where detection guesses wrong (worker/environment/declared.py `Overrides`)."""

    model_config = _STRICT
    extras: list[_Name] | None = Field(default=None, description=_STRINGS)
    groups: list[_Name] | None = Field(default=None, description=_STRINGS)
    requirements: list[Annotated[_Text, AfterValidator(_inside)]] | None = Field(default=None, description=_STRINGS)
    packages: list[Annotated[_Text, AfterValidator(_no_option)]] | None = Field(default=None, description=_STRINGS)
    project: bool | None = Field(default=None, description="true or false")

    def overrides(self) -> Overrides:
        def given(names: list[str] | None) -> tuple[str, ...] | None:
            return None if names is None else tuple(names)

        return Overrides(
            extras=given(self.extras),
            groups=given(self.groups),
            requirements=given(self.requirements),
            packages=tuple(self.packages or ()),
            project=self.project,
        )


class FrogfixFile(BaseModel):
    """`.frogfix.yml`: the one home of its keys, their types, rules and defaults (docs/ENVIRONMENTS.md shows them)."""

    model_config = _STRICT
    test_command: _Text | None = Field(default=None, description=_TEXT)
    setup_command: _Text | None = Field(default=None, description=_TEXT)
    image: _Text | None = Field(default=None, description=_TEXT)
    protected_paths: list[Annotated[str, StringConstraints(min_length=1)]] | None = Field(
        default=None, description="a list of path patterns"
    )
    test_timeout: float = Field(
        default=DEFAULT_TEST_TIMEOUT,
        ge=MIN_TEST_TIMEOUT,
        le=MAX_TEST_TIMEOUT,
        description=f"a number of seconds between {MIN_TEST_TIMEOUT} and {MAX_TEST_TIMEOUT}",
    )
    instructions: Annotated[_Text, AfterValidator(_short_guidance)] | None = Field(default=None, description=_TEXT)
    environment: EnvironmentSection | None = Field(
        default=None, description=f"a mapping ({', '.join(sorted(EnvironmentSection.model_fields))})"
    )


def _kind(value: Any) -> str:
    """What a `.frogfix.yml` value is, for an error message that says what was found."""
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return f"{str(value).lower()} (true/false)"
    if isinstance(value, int | float):
        return f"the number {value:g}" if isinstance(value, float) else f"the number {value}"
    if isinstance(value, str):
        return "an empty string" if not value.strip() else f"the text {value[:60]!r}"
    if isinstance(value, list):
        return f"a list of {len(value)} item" + ("" if len(value) == 1 else "s")
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: what is wrong and where ("mapping values are not allowed here, line 2 column 9")."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    return f"{problem}, line {mark.line + 1} column {mark.column + 1}" if mark is not None else str(problem)


def read_frogfix_yml(path: Path) -> FrogfixFile:
    """The file as `FrogfixFile`: every default when there is none (a symlink counts as none) or it holds nothing."""
    if not path.is_file() or path.is_symlink():
        return FrogfixFile()
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise config_state(f"is larger than {MAX_CONFIG_BYTES // 1024} KiB ({size} bytes)")
    try:
        root, data = _parsed(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise config_state(f"is not valid YAML: {_yaml_problem(exc)}") from exc
    except UnicodeDecodeError as exc:
        raise config_state(f"is not UTF-8 text (byte {exc.start})") from exc
    if root is None or data is None:  # empty, comments only, or a bare `---`
        return FrogfixFile()
    try:
        return FrogfixFile.model_validate(data)
    except ValidationError as exc:
        raise _first_problem(exc, root) from exc


def _parsed(text: str) -> tuple[yaml.Node | None, Any]:
    """The YAML's nodes (where each value stands, for the messages) and the values built from them."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        return root, None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()


_UNKNOWN_KEY = frozenset({"extra_forbidden", "invalid_key"})  # pydantic's error types for a key no model has


def _first_problem(error: ValidationError, root: yaml.Node) -> RepoConfigError:
    """The problem met first reading the file, in words: the key's path, what is wrong, its line and column."""
    found: list[tuple[tuple[int, int], RepoConfigError]] = []
    for detail in error.errors():
        mark = _node_at(root, detail["loc"], key=detail["type"] in _UNKNOWN_KEY).start_mark
        found.append(((mark.line, mark.column), _problem(detail, f" (line {mark.line + 1} column {mark.column + 1})")))
    return min(found, key=lambda item: item[0])[1]


def _problem(detail: ErrorDetails, where: str) -> RepoConfigError:
    """One of pydantic's errors as FrogFix says it: "<key> must be <its field's description>, not <what was found>"."""
    loc = detail["loc"]
    if detail["type"] in _UNKNOWN_KEY:
        parents = [str(part) for part in loc[:-1]]
        prefix = "".join(f"{part}." for part in parents)
        known = sorted(_section(parents).model_fields)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        hint = f"; did you mean {prefix}{close[0]}?" if close else f"; known keys: {', '.join(known)}"
        return config_problem(f"unknown key {prefix}{loc[-1]}{where}{hint}")
    names = [str(part) for part in itertools.takewhile(lambda part: isinstance(part, str), loc)]
    if detail["type"] == _RULE:
        return config_problem(f"{'.'.join(names)} {detail['msg']}{where}")
    found = _kind(detail["input"]) if len(names) == len(loc) else f"a list with {_kind(detail['input'])}"
    if not names:
        return config_state(f"must be a mapping of keys to values, not {found}{where}")
    wanted = _section(names[:-1]).model_fields[names[-1]].description
    return config_problem(f"{'.'.join(names)} must be {wanted}, not {found}{where}")


def _section(names: list[str]) -> type[BaseModel]:
    """The model holding the keys under the path `names`: FrogfixFile at the top, EnvironmentSection below it."""
    model: type[BaseModel] = FrogfixFile
    for name in names:
        held = get_args(model.model_fields[name].annotation)
        model = next(kind for kind in held if isinstance(kind, type) and issubclass(kind, BaseModel))
    return model


def _node_at(root: yaml.Node, loc: tuple[int | str, ...], *, key: bool) -> yaml.Node:
    """The node at `loc` (for an unknown key, the key's own node), else the deepest one on the way to it."""
    node = root
    for depth, part in enumerate(loc, 1):
        if isinstance(node, yaml.MappingNode):
            pairs = (pair for pair in reversed(node.value) if isinstance(pair[0], yaml.ScalarNode))
            pair = next((pair for pair in pairs if pair[0].value == str(part)), None)  # the last one wins, as in YAML
            if pair is None:
                return node
            node = pair[0] if key and depth == len(loc) else pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            return node
    return node
