"""TEMPORARY shim until the app helper's statuses module is merged."""

from __future__ import annotations

import enum


class AttemptStatus(enum.StrEnum):
    running = "running"
    verified = "verified"
    no_fix = "no_fix"
    failed = "failed"
    rejected = "rejected"
    cancelled = "cancelled"


class ExitReason(enum.StrEnum):
    agent = "agent"
    max_turns = "max_turns"
    max_time = "max_time"
    max_context_len = "max_context_len"
    max_tokens_per_turn = "max_tokens_per_turn"
    llm_query_error = "llm_query_error"
    tool_error = "tool_error"
    cancelled = "cancelled"


INFRA_EXITS = (ExitReason.llm_query_error, ExitReason.tool_error)


class FixStatus(enum.StrEnum):
    fixed = "fixed"
    no_fix = "no_fix"
    failed = "failed"
