"""POST /webhooks/gitlab and /webhooks/gitea: verify, dedupe, record, commit, then enqueue.

They answer fast and never 4xx an event that is valid but irrelevant (GitLab disables a
hook after repeated 4xx answers); a 500 is never the answer to any input.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from app.db import session_scope
from app.forge.gitea_webhook import parse_gitea
from app.forge.gitlab_webhook import parse_gitlab
from app.forge.webhook import WebhookError, WebhookEvent, WebhookMalformed
from app.jobs.intake import IntakeResult, answer_member, record_delivery, record_malformed, tell_refused
from app.jobs.transitions import enqueue_failed
from app.logs import get_logger
from app.queue import send_attest_merge, send_run_job, send_triage
from app.settings import get_settings

router = APIRouter(tags=["webhooks"])
log = get_logger("frogfix.webhooks")


class BodyTooLarge(Exception):
    pass


async def read_limited(request: Request, limit: int) -> bytes:
    """The raw body, refusing anything over `limit` bytes before reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _answer(status: int, **body: Any) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def intake(forge: str, parse: Callable[[], WebhookEvent]) -> JSONResponse:
    """Parse (pure), then one transaction for the delivery and job, then enqueue after the commit."""
    event = _parse(forge, parse)
    if isinstance(event, JSONResponse):
        return event
    with structlog.contextvars.bound_contextvars(delivery_id=event.delivery_id, forge=forge):
        try:
            with session_scope() as session:  # a short read: a `/frogfix` answer's author asked of the forge
                member = answer_member(session, event)  # before the delivery's transaction, which holds no lock
            with session_scope() as session:
                result = record_delivery(session, event, member)
        except SQLAlchemyError as exc:
            log.error("webhook_db_error", error=f"{type(exc).__name__}: {exc}"[:500])
            return _answer(503, error="the database is unavailable; the forge will retry this delivery")
        if result.tell_refused is not None:
            try:
                result = tell_refused(session_scope, result)
            except SQLAlchemyError:
                log.exception("refusal_memory_not_forgotten", job_id=result.job_id)
        enqueued = _send(result)
        log.info(
            "webhook",
            outcome=result.outcome,
            reason=result.reason,
            job_id=result.job_id,
            request_id=result.request_id,
            intent=event.intent,
            project=event.project,
            issue=event.issue,
            enqueued=enqueued,
        )
    status = 202 if result.outcome in ("job_created", "round_request", "job_requeued") else 200
    extra = {} if result.request_id is None else {"request_id": result.request_id}
    return _answer(
        status, outcome=result.outcome, reason=result.reason, job_id=result.job_id, delivery_id=event.delivery_id,
        **extra,
    )


def _parse(forge: str, parse: Callable[[], WebhookEvent]) -> WebhookEvent | JSONResponse:
    """The delivery's event, or the answer refusing it (a malformed one with a delivery id is recorded)."""
    try:
        return parse()
    except WebhookMalformed as exc:
        log.info("webhook_refused", forge=forge, status=exc.status, error=str(exc), delivery_id=exc.delivery_id)
        if exc.delivery_id:
            try:
                with session_scope() as session:
                    record_malformed(session, forge, exc.delivery_id, exc.event or "", str(exc))
            except SQLAlchemyError:
                log.exception("record_malformed_failed", forge=forge)
        return _answer(exc.status, error=str(exc))
    except WebhookError as exc:
        log.info("webhook_refused", forge=forge, status=exc.status, error=str(exc))
        return _answer(exc.status, error=str(exc))
    except Exception as exc:  # a parser bug must not become a 500 for the sender
        log.exception("webhook_parse_bug", forge=forge)
        return _answer(400, error=f"could not parse this delivery ({type(exc).__name__})")


def _send(result: IntakeResult) -> bool:
    """After the commit: the triage of a round request, or the job's run; whether it was sent. A job whose
    send failed is stamped so (the sweep sends it after the requeue delay either way)."""
    enqueued = False
    if result.request_id is not None:  # pending until triaged: the sweep sends it again if this fails
        enqueued = send_triage(result.request_id)
    if result.merge is not None and result.job_id is not None:  # not sent again if the broker is down
        enqueued = send_attest_merge(result.job_id, result.merge)
    if result.enqueue and result.job_id is not None:
        enqueued = send_run_job(result.job_id)
        if not enqueued:
            try:
                with session_scope() as session:
                    enqueue_failed(session, result.job_id)
            except SQLAlchemyError:  # the stamp stays; the sweep sends it after the requeue delay
                log.exception("enqueue_failed_not_recorded", job_id=result.job_id)
    return enqueued


async def _receive(request: Request, forge: str, parse: Callable[[bytes], WebhookEvent]) -> JSONResponse:
    limit = get_settings().max_webhook_bytes
    try:
        body = await read_limited(request, limit)
    except BodyTooLarge:
        log.info("webhook_refused", forge=forge, status=413)
        return _answer(413, error=f"body larger than {limit} bytes")
    return await run_in_threadpool(intake, forge, lambda: parse(body))


@router.post("/webhooks/gitlab", summary="GitLab issue webhook")
async def gitlab_webhook(request: Request) -> JSONResponse:
    s = get_settings()
    headers = dict(request.headers)
    return await _receive(
        request,
        "gitlab",
        lambda body: parse_gitlab(
            headers,
            body,
            secret=s.gitlab_webhook_secret.get_secret_value(),
            signing_token=s.gitlab_signing_token.get_secret_value(),
            trigger_label=s.trigger_label,
            allow_confidential=s.gitlab_allow_confidential,
            now=time.time(),
        ),
    )


@router.post("/webhooks/gitea", summary="Gitea / Forgejo issue webhook")
async def gitea_webhook(request: Request) -> JSONResponse:
    s = get_settings()
    headers = dict(request.headers)
    return await _receive(
        request,
        "gitea",
        lambda body: parse_gitea(
            headers,
            body,
            secret=s.gitea_webhook_secret.get_secret_value(),
            trigger_label=s.trigger_label,
        ),
    )
