"""`.frogfix.yml` read by its typed models: a problem named by key, line and column; docs held to the models."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

import worker.attempts.frogfix_yml
from worker.attempts.frogfix_yml import EnvironmentSection, FrogfixFile
from worker.attempts.repo_config import RepoConfig, RepoConfigError, load_repo_config
from worker.environment.declared import Overrides

ROOT = Path(__file__).resolve().parent.parent


def _error(tmp_path: Path, text: str) -> str:
    (tmp_path / ".frogfix.yml").write_text(text)
    with pytest.raises(RepoConfigError) as caught:
        load_repo_config(tmp_path)
    return str(caught.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (  # an unknown key inside environment: its path, where the key stands, the key it likely meant
            "test_command: make check\nenvironment:\n  extras: [tests]\n  pakages: ['pytest<9']\n",
            ".frogfix.yml: unknown key environment.pakages (line 4 column 3); did you mean environment.packages?",
        ),
        (  # nothing close: the keys of that level, from the model
            "environment:\n  wheels: [x]\n",
            ".frogfix.yml: unknown key environment.wheels (line 2 column 3);"
            " known keys: extras, groups, packages, project, requirements",
        ),
        (  # a wrong type: what it must be, what was found, where the value stands
            "image: registry.example/python:3.12\ntest_timeout: [900]\n",
            ".frogfix.yml: test_timeout must be a number of seconds between 1 and 10800, not a list of 1 item"
            " (line 2 column 15)",
        ),
        (  # one bad item of a list: the item's own line and column
            "environment:\n  groups:\n    - test\n    - true\n",
            ".frogfix.yml: environment.groups must be a list of strings, not a list with true (true/false)"
            " (line 4 column 7)",
        ),
        (  # a value rule a validator enforces
            "environment:\n  requirements: [requirements/test.txt, ../secrets.txt]\n",
            ".frogfix.yml: environment.requirements names a path outside the repository: '../secrets.txt'"
            " (line 2 column 41)",
        ),
        (  # a number out of range is the type's own words
            "test_timeout: 86400\n",
            ".frogfix.yml: test_timeout must be a number of seconds between 1 and 10800, not the number 86400"
            " (line 1 column 15)",
        ),
        (  # the file itself is not a mapping
            "just some words\n",
            ".frogfix.yml must be a mapping of keys to values, not the text 'just some words' (line 1 column 1)",
        ),
    ],
)
def test_a_problem_names_its_key_line_and_column(tmp_path: Path, text: str, message: str) -> None:
    assert _error(tmp_path, text) == message


def test_of_several_problems_the_first_in_the_file_is_named(tmp_path: Path) -> None:
    text = "image: 3\nenvironment:\n  project: maybe\ntest_comand: x\n"
    first = ".frogfix.yml: image must be a non-empty string, not the number 3 (line 1 column 8)"
    assert _error(tmp_path, text) == first
    text = "test_timeout: 60\ntest_timeout: soon\n"  # a repeated key: the last one counts, and is the one named
    assert _error(tmp_path, text).endswith("not the text 'soon' (line 2 column 15)")


def test_a_yaml_syntax_error_says_what_and_where(tmp_path: Path) -> None:
    assert _error(tmp_path, "test_command: make\n  check: now\n") == (
        ".frogfix.yml is not valid YAML: mapping values are not allowed here, line 2 column 8"
    )
    assert _error(tmp_path, "protected_paths: [db/**\n") == (
        ".frogfix.yml is not valid YAML: expected ',' or ']', but got '<stream end>', line 2 column 1"
    )


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing configured yet\n", "---\n"])
def test_an_empty_file_is_every_default(tmp_path: Path, text: str) -> None:
    (tmp_path / ".frogfix.yml").write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    config = load_repo_config(tmp_path)
    assert config == RepoConfig(test_command="python3 -m pytest -q", test_command_source="detected: pytest.ini found")
    assert config.test_timeout == FrogfixFile().test_timeout == 900.0


def test_values_are_read_as_before(tmp_path: Path) -> None:
    (tmp_path / ".frogfix.yml").write_text(
        "test_command: '  make check  '\ntest_timeout: 60\nprotected_paths: [db/**]\n"
        "environment:\n  extras: [tests]\n  requirements: []\n  project: false\n"
    )
    config = load_repo_config(tmp_path)
    assert (config.test_command, config.test_command_source) == ("make check", ".frogfix.yml")
    assert config.test_timeout == 60.0 and isinstance(config.test_timeout, float)
    assert config.protected_paths == ("db/**",)
    assert config.environment == Overrides(extras=("tests",), requirements=(), project=False)


def _documented_blocks() -> list[tuple[str, dict[str, Any]]]:
    """Every `.frogfix.yml` example the docs show: docs/ENVIRONMENTS.md's YAML blocks and the module's docstring."""
    guide = (ROOT / "docs" / "ENVIRONMENTS.md").read_text(encoding="utf-8")
    blocks = [
        (f"docs/ENVIRONMENTS.md block {n}", textwrap.dedent(body))
        for n, (_, body) in enumerate(re.findall(r"^( *)```yaml\n(.*?)^\1```", guide, re.M | re.S), 1)
    ]
    docstring = worker.attempts.frogfix_yml.__doc__ or ""
    example = docstring.partition("All keys are optional:\n\n")[2].partition("\n\n")[0]
    blocks.append(("worker/attempts/frogfix_yml.py docstring", textwrap.dedent(example)))
    return [(where, yaml.safe_load(text)) for where, text in blocks]


def test_every_key_the_docs_show_is_a_field_of_the_model_and_every_field_is_shown() -> None:
    blocks = _documented_blocks()
    assert len(blocks) == 3
    shown: set[str] = set()
    for where, block in blocks:
        assert isinstance(block, dict) and block, where
        assert set(block) <= set(FrogfixFile.model_fields), (where, set(block) - set(FrogfixFile.model_fields))
        environment = block.get("environment") or {}
        assert set(environment) <= set(EnvironmentSection.model_fields), where
        FrogfixFile.model_validate(block)  # and every value shown is one the file may hold
        shown |= set(block) | {f"environment.{key}" for key in environment}
    fields = set(FrogfixFile.model_fields) | {f"environment.{key}" for key in EnvironmentSection.model_fields}
    assert shown == fields
