"""Leaf: the five-tool agent loop FrogNano was trained on, with its model client and records.

Knows only the Sandbox protocol (`call_tool`) and an OpenAI-compatible model endpoint; it
imports no database, queue or web code, so the worker, `manage.py fix` and `replay` share it.
`issue_text` is the issue as the model reads it (sanitised), which the prompts render.

Room rule (tests/test_import_graph.py): the bottom room; imports no other room of worker/.
"""

from worker.leaf.loop import (
    EXIT_REASONS,
    LeafLimits,
    LeafResult,
    StepRecord,
    ToolCallRecord,
    ToolSandbox,
    UsageTotals,
    run_leaf,
)
from worker.leaf.model import (
    ContextOverflow,
    ModelClient,
    ModelError,
    ModelQueryError,
    ModelReply,
    OpenAIChatModel,
    ReplayModel,
    SamplingParams,
    Usage,
)
from worker.leaf.prompts import render_task, system_prompt
from worker.leaf.tools import TOOL_NAMES, TOOL_SCHEMAS
from worker.leaf.trajectory_writer import HARNESS_VERSION, TRAJECTORY_FORMAT, TrajectoryWriter

__all__ = [
    "EXIT_REASONS",
    "HARNESS_VERSION",
    "TOOL_NAMES",
    "TOOL_SCHEMAS",
    "TRAJECTORY_FORMAT",
    "ContextOverflow",
    "LeafLimits",
    "LeafResult",
    "ModelClient",
    "ModelError",
    "ModelQueryError",
    "ModelReply",
    "OpenAIChatModel",
    "ReplayModel",
    "SamplingParams",
    "StepRecord",
    "ToolCallRecord",
    "ToolSandbox",
    "TrajectoryWriter",
    "Usage",
    "UsageTotals",
    "render_task",
    "run_leaf",
    "system_prompt",
]
