"""The five Leaf tool schemas, and schema-driven typing of arguments that arrived as text.

FrogNano was trained against exactly these tool names, argument names, types and required
fields (LEAF.md); changing any of them changes what the model sees, so they are constants.
The descriptions are short and ours. Execution lives in the sandbox runner, not here.
"""

from __future__ import annotations

import json
from typing import Any, Final

TOOL_NAMES: Final = ("Read", "Write", "Edit", "Glob", "Bash")


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def _prop(kind: str, description: str) -> dict[str, str]:
    return {"type": kind, "description": description}


TOOL_SCHEMAS: Final[list[dict[str, Any]]] = [
    _tool(
        "Read",
        "Read a text file and return its lines, numbered.",
        {
            "file_path": _prop("string", "File to read, relative to the repository root or absolute."),
            "offset": _prop("integer", "1-based line to start from (optional)."),
            "limit": _prop("integer", "Maximum number of lines to return (optional)."),
        },
        ["file_path"],
    ),
    _tool(
        "Write",
        "Write a whole file, creating missing parent folders.",
        {
            "file_path": _prop("string", "File to write."),
            "content": _prop("string", "The complete new content of the file."),
        },
        ["file_path", "content"],
    ),
    _tool(
        "Edit",
        "Replace an exact piece of text in a file.",
        {
            "file_path": _prop("string", "File to edit."),
            "old_string": _prop("string", "The exact text to replace."),
            "new_string": _prop("string", "The text to put in its place."),
            "replace_all": _prop("boolean", "Replace every occurrence rather than exactly one."),
        },
        ["file_path", "old_string", "new_string"],
    ),
    _tool(
        "Glob",
        "List files matching a glob pattern.",
        {
            "pattern": _prop("string", "Glob pattern; ** matches folders recursively, e.g. **/*.py."),
            "path": _prop("string", "Folder to search from (optional)."),
        },
        ["pattern"],
    ),
    _tool(
        "Bash",
        "Run a shell command in the repository.",
        {
            "command": _prop("string", "The command to run."),
            "description": _prop("string", "A few words on what the command is for."),
            "timeout": _prop("number", "Timeout in seconds (optional)."),
        },
        ["command"],
    ),
]

# Arguments the runner accepts without the schema offering them (LEAF.md: Bash `timeout_ms`).
_UNLISTED_TYPES: Final[dict[str, dict[str, str]]] = {"Bash": {"timeout_ms": "number"}}

_PARAM_TYPES: Final[dict[str, dict[str, str]]] = {
    schema["function"]["name"]: {
        **{key: prop["type"] for key, prop in schema["function"]["parameters"]["properties"].items()},
        **_UNLISTED_TYPES.get(schema["function"]["name"], {}),
    }
    for schema in TOOL_SCHEMAS
}

_TRUE: Final = frozenset({"true", "yes", "1"})
_FALSE: Final = frozenset({"false", "no", "0"})


def param_type(tool: str, param: str) -> str | None:
    """The JSON-schema type of one argument, or None when the tool or argument is not known."""
    return _PARAM_TYPES.get(tool, {}).get(param)


def coerce_value(kind: str | None, raw: str) -> Any:
    """Turn raw parameter text into the schema's type; text that does not fit stays text.

    Leaving a misfit as a string (rather than failing here) lets the tool itself answer with
    its usual `<ExceptionName>: <message>`, which is what the model was trained to read.
    """
    text = raw.strip()
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            number = _as_float(text)
            return int(number) if number is not None and number.is_integer() else raw
    if kind == "number":
        try:
            return int(text)
        except ValueError:
            number = _as_float(text)
            return raw if number is None else number
    if kind == "boolean":
        lowered = text.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        return raw
    if kind in ("object", "array"):
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            return raw
    return raw


def _as_float(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if number == number and abs(number) != float("inf") else None


def coerce_arguments(tool: str, raw: dict[str, str]) -> dict[str, Any]:
    """Type every argument of a text-parsed call by the tool's schema (unknown ones stay text)."""
    types = _PARAM_TYPES.get(tool, {})
    return {key: coerce_value(types.get(key), value) for key, value in raw.items()}
