"""The five schemas are a contract with the model's training: names, arguments, types, required."""

from __future__ import annotations

from typing import Any

import pytest

from worker.leaf.tools import TOOL_NAMES, TOOL_SCHEMAS, coerce_arguments, coerce_value, param_type

EXPECTED: dict[str, tuple[dict[str, str], list[str]]] = {
    "Read": ({"file_path": "string", "offset": "integer", "limit": "integer"}, ["file_path"]),
    "Write": ({"file_path": "string", "content": "string"}, ["file_path", "content"]),
    "Edit": (
        {"file_path": "string", "old_string": "string", "new_string": "string", "replace_all": "boolean"},
        ["file_path", "old_string", "new_string"],
    ),
    "Glob": ({"pattern": "string", "path": "string"}, ["pattern"]),
    "Bash": ({"command": "string", "description": "string", "timeout": "number"}, ["command"]),
}


def test_five_tools_in_openai_format() -> None:
    assert [s["function"]["name"] for s in TOOL_SCHEMAS] == list(TOOL_NAMES) == list(EXPECTED)
    for schema in TOOL_SCHEMAS:
        assert schema["type"] == "function"
        function = schema["function"]
        assert set(function) == {"name", "description", "parameters"}
        assert function["description"]
        params = function["parameters"]
        types, required = EXPECTED[function["name"]]
        assert params["type"] == "object"
        assert {k: v["type"] for k, v in params["properties"].items()} == types
        assert params["required"] == required
        assert all(v["description"] for v in params["properties"].values())


@pytest.mark.parametrize(
    ("kind", "raw", "expected"),
    [
        ("integer", "12", 12),
        ("integer", " 7\n", 7),
        ("integer", "3.0", 3),
        ("integer", "3.5", "3.5"),
        ("integer", "ten", "ten"),
        ("number", "30", 30),
        ("number", "2.5", 2.5),
        ("number", "nan", "nan"),
        ("number", "1e400", "1e400"),
        ("boolean", "true", True),
        ("boolean", "False", False),
        ("boolean", "maybe", "maybe"),
        ("string", " keep  \n", " keep  \n"),
        (None, "42", "42"),
    ],
)
def test_coerce_value(kind: str | None, raw: str, expected: Any) -> None:
    assert coerce_value(kind, raw) == expected
    assert type(coerce_value(kind, raw)) is type(expected)


def test_coerce_arguments_by_schema() -> None:
    assert coerce_arguments("Read", {"file_path": "a.py", "offset": "10", "limit": "5"}) == {
        "file_path": "a.py", "offset": 10, "limit": 5,
    }
    edit = {"file_path": "1", "old_string": "2", "new_string": "3", "replace_all": "true"}
    assert coerce_arguments("Edit", edit) == {
        "file_path": "1", "old_string": "2", "new_string": "3", "replace_all": True,
    }
    # The runner accepts timeout_ms although the schema does not offer it.
    assert coerce_arguments("Bash", {"command": "ls", "timeout_ms": "1500"}) == {"command": "ls", "timeout_ms": 1500}
    assert coerce_arguments("Nope", {"x": "1"}) == {"x": "1"}
    assert param_type("Read", "offset") == "integer"
    assert param_type("Read", "nope") is None
