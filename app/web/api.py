"""The JSON API for operators: jobs, behind `Authorization: Bearer <FROGFIX_ADMIN_TOKEN>` or a dashboard session."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request

from app.answers import AttestationBundleAnswer, JobAnswer, JobDetailAnswer, JobListAnswer
from app.attestations import store as attestations
from app.db import session_scope
from app.jobs import read_model, records
from app.settings import get_settings
from app.statuses import JobStatus
from app.web.params import JobId, Offset, ProjectFilter
from app.web.security import bearer_problem


def require_admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """The admin bearer token, or an operator signed in to the dashboard (set by app/web/security.py)."""
    if getattr(request.state, "operator", None):
        return
    problem = bearer_problem(authorization, get_settings())
    if problem is not None:
        raise HTTPException(401, problem, headers={"WWW-Authenticate": "Bearer"})


router = APIRouter(prefix="/api", tags=["jobs"], dependencies=[Depends(require_admin)])


@router.get("/jobs", summary="List jobs, newest first", response_model=JobListAnswer)
def list_jobs(
    limit: Annotated[int, Query(ge=1, le=5000)] = 50,
    offset: Offset = 0,
    status: JobStatus | None = None,  # an unknown status is a 422
    forge: Literal["gitlab", "gitea", "local"] | None = None,
    project: ProjectFilter = None,
) -> JobListAnswer:
    with session_scope() as session:
        flt = records.JobFilter(status.value if status else None, forge, project)
        items, total = records.list_jobs(session, flt, limit, offset)
        return JobListAnswer(items=[JobAnswer.of(j) for j in items], total=total)


@router.get(
    "/jobs/{job_id}", summary="One job with its timeline, attempts and its MR's thread of rounds",
    response_model=JobDetailAnswer,
)
def get_job(job_id: JobId) -> JobDetailAnswer:
    """`attempts` each with its `tests` and `evidence`; `tests`, `evidence` and `patch` are the chosen
    attempt's (else the latest's). `thread` is null for a job that opened no MR; else round 0 and its
    rounds, and the requests (comments, reviews, CI results) this job took, those waiting and those
    turned down."""
    with session_scope() as session:
        try:
            return read_model.job_detail(session, job_id)
        except records.UnknownJob as exc:
            raise HTTPException(404, str(exc)) from exc


@router.get(
    "/jobs/{job_id}/attestations", summary="The job's signed statements, with its patches and trajectories",
    response_model=AttestationBundleAnswer,
)
def get_attestations(job_id: JobId) -> AttestationBundleAnswer:
    """A bundle for `manage.py verify`: each change FrogFix published for the job in its DSSE envelope (an
    in-toto statement), the patch and trajectory it covers, and the stretch of the append-only log that
    holds them. Empty `attestations` when the job published nothing signed."""
    with session_scope() as session:
        try:
            records.get_job(session, job_id)
        except records.UnknownJob as exc:
            raise HTTPException(404, str(exc)) from exc
    return AttestationBundleAnswer.model_validate(attestations.bundle(get_settings().data_dir, job_id))
