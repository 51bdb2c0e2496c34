"""The JSON API for operators: jobs, behind `Authorization: Bearer <FROGFIX_ADMIN_TOKEN>`."""

from __future__ import annotations

import hmac
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Query

from app import jobs
from app.db import session_scope
from app.settings import get_settings

StatusName = Literal[
    "queued", "running", "verifying", "publishing", "done", "no_fix", "failed", "cancelled", "rejected"
]


def require_admin(authorization: Annotated[str | None, Header()] = None) -> None:
    expected = get_settings().admin_token.get_secret_value()
    if not expected:
        raise HTTPException(
            401, "the API is closed: FROGFIX_ADMIN_TOKEN is not set", headers={"WWW-Authenticate": "Bearer"}
        )
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})


router = APIRouter(prefix="/api", tags=["jobs"], dependencies=[Depends(require_admin)])


@router.get("/jobs", summary="List jobs, newest first")
def list_jobs(
    limit: Annotated[int, Query(ge=1, le=5000)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
    status: StatusName | None = None,
    forge: Literal["gitlab", "gitea"] | None = None,
    project: Annotated[str | None, Query(max_length=255)] = None,
) -> dict[str, Any]:
    with session_scope() as session:
        items, total = jobs.list_jobs(session, jobs.JobFilter(status, forge, project), limit, offset)
        return {"items": [j.to_dict() for j in items], "total": total}


@router.get("/jobs/{job_id}", summary="One job with its timeline")
def get_job(job_id: int) -> dict[str, Any]:
    with session_scope() as session:
        try:
            job = jobs.get_job(session, job_id)
        except jobs.UnknownJob as exc:
            raise HTTPException(404, str(exc)) from exc
        data = job.to_dict()
        data["body"] = job.body
        data["events"] = [e.to_dict() for e in jobs.job_events(session, job_id)]
        return data
