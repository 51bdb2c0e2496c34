"""Typed endings (issue 38): jobs.ending_kind and jobs.ending_facts, the kind of a job's ending and its typed
facts (app/endings.py), beside the `error` text it always had; finished jobs get theirs from that text, once

The backfill is the one place where a job's stored text is read back into a kind: old rows were written
before the worker said the kind, and this conversion runs once. app/outcome_words.py never parses text.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

import re
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

ENDED = ("failed", "no_fix", "cancelled", "rejected")
LIMIT_EXITS = ("max_turns", "max_time", "max_context_len", "max_tokens_per_turn")
# The texts the worker wrote before endings had kinds (app/outcome_words.py as it read them until 0013).
MODEL = re.compile(r"^(?:\w+: )?(?:model call|model answered|the model (?:could not be used|server aborted))")
MODEL_WAYS = (  # (kind, the failure's words)
    ("model_unreachable", re.compile(r"connection error: (.*)$")),
    ("model_refused", re.compile(r"model call refused: (.*)$")),
    ("model_failing", re.compile(r"(?:attempt\(s\)|retry): (HTTP \d+.*)$")),
    ("model_timeout", re.compile(r"(?:attempt\(s\)|retry): (timed out.*)$")),
)
CAUSE_NOISE = re.compile(
    r"^(?:(?:[A-Za-z_][\w.]*(?:Error|Exception|Timeout|Refused|Failure)\w*: )+)?(?:\[Errno -?\d+\] )?"
)
SANDBOX = re.compile(r"^(?:sandbox failure|the setup sandbox failed)\s*:?\s*")
GIT = re.compile(
    r"^(?:git \S+ |the clone URL|commit [0-9a-f]+ is not in|workspace folder |not a (?:full commit id|valid ref))"
)
KEPT_FAILING = "the forge or git server kept failing:"
FORGE_CALL = re.compile(r"^(?P<forge>GitLab|Gitea) (?P<call>[^:]{1,120}): (?P<rest>.*)$")
FORGE_HTTP = re.compile(r"^HTTP (?P<code>\d{3})\s*(?P<said>.*)$")
GAVE_UP = re.compile(r"\s*\((gave up after [^()]*)\)\s*$")
UNREACHED = re.compile(r"talking to the server|timed out|Connect|Timeout|gave up after", re.I)


def _forge(text: str) -> tuple[str, dict[str, Any]] | None:
    transient = text.startswith(KEPT_FAILING)
    body = text.removeprefix(KEPT_FAILING).strip() if transient else text
    m = FORGE_CALL.match(body)
    if m is None:
        if transient:
            return "forge_unreachable", {"cause": body, "transient": True}
        if re.search(r"\b(?:GitLab|Gitea)\b", body) and re.search(r"configured|redirected|FROGFIX_GIT", body):
            return "forge_setup", {}
        return None
    facts: dict[str, Any] = {"forge": m["forge"], "call": m["call"], "transient": transient}
    rest = m["rest"]
    if (gave_up := GAVE_UP.search(rest)) is not None:
        rest, facts["gave_up"] = rest[: gave_up.start()], gave_up[1]
    http = FORGE_HTTP.match(rest)
    if http is None:
        facts["said"] = rest.replace(" talking to the server", "")
        facts["redirected"] = "redirected" in rest
        unreachable = (transient or UNREACHED.search(rest)) and not facts["redirected"]
        return ("forge_unreachable" if unreachable else "forge_error"), facts
    said = re.sub(r"\s*\(the forge token (?:was rejected|lacks permission)\)", "", http["said"]).strip()
    facts.update(http_status=int(http["code"]), said=said.removeprefix(http["code"]).strip())
    return "forge_error", facts


def _model(text: str) -> tuple[str, dict[str, Any]]:
    for kind, way in MODEL_WAYS:
        if m := way.search(text):
            cause = m[1].strip()
            return kind, {"cause": (CAUSE_NOISE.sub("", cause) or cause) if kind == "model_unreachable" else cause}
    if "ran out of time" in text:
        return "model_out_of_time", {}
    if "aborted the request" in text:
        return "model_aborted", {}
    return "model_error", {"cause": text}


def _config(text: str) -> str:
    detail = text.removeprefix(".frogfix.yml").lstrip(":").strip()
    return "it " + detail if detail.startswith(("is ", "must ")) else detail


def kind_of(status: str, exit_reason: str | None, error: str | None) -> tuple[str, dict[str, Any]]:
    """The kind and facts of an ending stored before 0013, from its status, exit reason and text."""
    text, reason = " ".join((error or "").split()), exit_reason or ""
    if status == "cancelled" or reason == "cancelled":
        return "cancelled", {}
    if status == "rejected":
        return "rejected", {}
    if status == "no_fix" and reason in LIMIT_EXITS:
        return "limits", {}
    forge = _forge(text)
    if MODEL.search(text) or (reason == "llm_query_error" and forge is None):
        return _model(text)
    if reason == "config_error" or text.startswith(".frogfix.yml"):
        return "config_error", {"cause": _config(text)}
    if reason == "environment_error" or text.startswith("environment error:"):
        cause = text.removeprefix("environment error:").strip()
        return ("tests_unstartable" if cause.startswith("the tests could not start") else "environment_error"), {
            "cause": cause}
    if reason == "tool_error" or SANDBOX.match(text):
        return "sandbox_failure", {"cause": SANDBOX.sub("", text, count=1)}
    if forge is not None:
        return forge
    if reason == "git_error" or GIT.match(text):
        return "git_error", {}
    if text.startswith("the job ran past its time limit"):
        return "job_timeout", {}
    if text.startswith("internal error:"):
        return "internal_error", {"cause": text.removeprefix("internal error:").strip()}
    if reason in LIMIT_EXITS:
        return "limits", {}
    if text == "the branch moved while the job ran":
        return "branch_moved", {}
    return ("no_fix" if status == "no_fix" else "unknown"), {}


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("ending_kind", sa.String(32), nullable=True))  # an EndingKind; NULL: not ended
        batch.add_column(sa.Column("ending_facts", sa.JSON(), nullable=True))  # Ending.facts()
    jobs = sa.table(
        "jobs", sa.column("id", sa.Integer), sa.column("status", sa.String), sa.column("exit_reason", sa.String),
        sa.column("error", sa.Text), sa.column("ending_kind", sa.String), sa.column("ending_facts", sa.JSON),
    )
    bind = op.get_bind()
    ended = bind.execute(
        sa.select(jobs.c.id, jobs.c.status, jobs.c.exit_reason, jobs.c.error).where(jobs.c.status.in_(ENDED))
    ).all()
    for job_id, status, exit_reason, error in ended:
        kind, facts = kind_of(status, exit_reason, error)
        facts = {k: v for k, v in facts.items() if v not in ("", None, False)}
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(ending_kind=kind, ending_facts=facts or None))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("ending_facts")
        batch.drop_column("ending_kind")
