"""How a job ended, typed: the kind of ending and its detail, made where the job ends and kept with it.

The worker makes an `Ending` where a job or its attempt ends (worker/job/job_context.py `ending_of` for the
exceptions a run meets, JobEnded, `fix`); the job row keeps its kind and typed facts (`jobs.ending_kind`,
`jobs.ending_facts`) beside the `error` text it always had, `fix --json` and the local record keep
`to_dict()`, and app/outcome_words.py words it from its kind, never from its text.

Standard library and app/statuses.py only (a vocabulary module, like statuses.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any

from app.statuses import ExitReason, FixStatus, JobStatus


class EndingKind(StrEnum):
    """Every way a job ends that is not a success: the `jobs.ending_kind` column."""

    model_unreachable = "model_unreachable"  # no connection to the model server
    model_timeout = "model_timeout"  # it did not answer within a call's time
    model_out_of_time = "model_out_of_time"  # the job's time ran out while calling it
    model_refused = "model_refused"  # it refused the call (a 4xx other than 429)
    model_failing = "model_failing"  # it kept failing (5xx, 429) after the retries
    model_aborted = "model_aborted"  # it aborted the request (finish_reason abort)
    model_error = "model_error"  # any other model failure: a nonsense answer, a client bug
    sandbox_failure = "sandbox_failure"
    environment_error = "environment_error"  # the test environment could not be built
    tests_unstartable = "tests_unstartable"  # built (or none needed), yet the tests cannot start
    config_error = "config_error"  # the repository's .frogfix.yml
    git_error = "git_error"
    forge_error = "forge_error"  # the forge answered no (facts: forge, call, http_status, said)
    forge_unreachable = "forge_unreachable"  # the forge or the git server could not be reached reliably
    forge_setup = "forge_setup"  # FrogFix's forge settings (no token, no URL)
    job_timeout = "job_timeout"  # the job ran past FROGFIX_JOB_TIMEOUT_SECONDS
    limits = "limits"  # the agent reached a limit (its exit reason says which)
    cancelled = "cancelled"  # on request, a closed issue, a removed label
    stopped = "stopped"  # `fix` interrupted (Ctrl-C, SIGTERM) or stopped by a bug
    branch_moved = "branch_moved"  # someone pushed to the bot's branch while the job ran
    rejected = "rejected"  # the trigger was refused (not allowed, confidential, would replace work)
    refused = "refused"  # a review rule refused the patch
    tampered = "tampered"  # the patch's test results were forged
    no_fix = "no_fix"  # the agent ended without a fix the tests prove
    attestation_missing = "attestation_missing"  # FROGFIX_REQUIRE_ATTESTATION, and no key could sign
    internal_error = "internal_error"  # a bug in FrogFix
    worker_lost = "worker_lost"  # the worker running it stopped answering too often
    unknown = "unknown"  # a failure stored without a kind


CANCELLED_ON_REQUEST = "cancelled on request"  # a cancel's detail: the dashboard, `manage.py cancel`, `/frogfix stop`
MODEL_KINDS = frozenset(kind for kind in EndingKind if kind.value.startswith("model_"))
# The kinds an exit reason alone tells, for a record kept before endings had kinds (a local job's file).
_BY_EXIT: dict[str, EndingKind] = {
    ExitReason.llm_query_error: EndingKind.model_error,
    ExitReason.tool_error: EndingKind.sandbox_failure,
    ExitReason.config_error: EndingKind.config_error,
    ExitReason.environment_error: EndingKind.environment_error,
    ExitReason.git_error: EndingKind.git_error,
    ExitReason.cancelled: EndingKind.cancelled,
    ExitReason.max_turns: EndingKind.limits,
    ExitReason.max_time: EndingKind.limits,
    ExitReason.max_context_len: EndingKind.limits,
    ExitReason.max_tokens_per_turn: EndingKind.limits,
}
_BY_STATUS: dict[str, EndingKind] = {
    JobStatus.cancelled: EndingKind.cancelled,
    JobStatus.rejected: EndingKind.rejected,
    JobStatus.no_fix: EndingKind.no_fix,
    FixStatus.tampered: EndingKind.tampered,
    FixStatus.environment_error: EndingKind.environment_error,
}


@dataclass(frozen=True)
class Ending:
    """A job's ending: its kind, the text shown today (`detail`, the job's `error`) and typed facts.

    `cause`: a model failure's own words ("Connection refused", "HTTP 503: down"); `forge`, `call`,
    `http_status`, `said`, `gave_up`: a forge's answer (which forge, what FrogFix asked, the HTTP status,
    the forge's words, the retries' tail); `transient`: worth retrying later."""

    kind: EndingKind
    detail: str = ""
    cause: str = ""
    forge: str = ""
    call: str = ""
    http_status: int | None = None
    said: str = ""
    gave_up: str = ""
    transient: bool = False
    redirected: bool = False

    def facts(self) -> dict[str, Any]:
        """The typed facts beside kind and detail, only those set (`jobs.ending_facts`)."""
        return {k: v for k, v in asdict(self).items() if k not in ("kind", "detail") and v not in ("", None, False)}

    def to_dict(self) -> dict[str, Any]:
        """`{"kind": ..., "detail": ..., **facts}`: `fix --json`'s and the API's `ending`."""
        return {"kind": self.kind.value, "detail": self.detail, **self.facts()}

    def but(self, detail: str) -> Ending:
        """The same ending with its detail as shown (redacted, or worded by the stage that ends the job)."""
        return Ending(**{**self.__dict__, "detail": detail})

    def redacted(self, redact: Callable[[str], str]) -> Ending:
        """The same ending with every text passed through `redact` (a job's secrets never reach its row)."""
        texts = {k: redact(v) for k, v in self.__dict__.items() if isinstance(v, str) and v and k != "kind"}
        return Ending(**{**self.__dict__, **texts})

    @classmethod
    def from_dict(cls, data: Any) -> Ending | None:
        """An ending as `to_dict` wrote it; None for none or an unknown kind."""
        if not isinstance(data, dict) or data.get("kind") not in EndingKind.__members__:
            return None
        known = {f.name for f in fields(cls)} - {"kind"}
        values = {k: v for k, v in data.items() if k in known}
        if not isinstance(values.get("http_status"), int | None):
            values.pop("http_status")
        return cls(EndingKind(data["kind"]), **values)

    @classmethod
    def kept(cls, data: Any, detail: str | None, *, status: str, exit_reason: str | None) -> Ending:
        """An ending as `to_dict` wrote it (`fix --json`, a local record, the API), its text beside it; one
        written before endings were typed, from its status or exit reason (see `stored`)."""
        facts = data if isinstance(data, dict) else {}
        return cls.stored(facts.get("kind"), detail, facts, status=status, exit_reason=exit_reason)

    @classmethod
    def stored(
        cls, kind: str | None, detail: str | None, facts: Any = None, *, status: str = "",
        exit_reason: str | None = None,
    ) -> Ending:
        """A job's ending from what it stores (kind, error text, facts); for one stored without a kind (a local
        record older than endings), the kind its status or exit reason alone tells, its text as the detail."""
        data = {**(facts if isinstance(facts, dict) else {}), "kind": kind, "detail": detail or ""}
        found = cls.from_dict(data)
        if found is not None:
            return found
        guess = _BY_STATUS.get(status) or _BY_EXIT.get(exit_reason or "") or EndingKind.unknown
        return cls(guess, detail or "")


def ending_for_status(status: str, detail: str = "") -> Ending:
    """The ending a status alone says (rejected, cancelled, no fix); a failure of no stated kind is unknown."""
    return Ending(_BY_STATUS.get(status, EndingKind.unknown), detail)
