"""``/v1/replays``: replay a recording on the server in the background, poll it, fetch its report (JSON or HTML)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Response, status
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse

from api.context import AppContext

from api.deps import Ctx, Operator, Viewer
from api.errors import ApiError
from api.routes import AUTH_ERRORS, CONFLICT, NOT_FOUND
from api.schemas import ErrorBody, Job, JobList, ReplayCreate

router = APIRouter(prefix="/v1/replays", tags=["replays"], responses=AUTH_ERRORS)
JobId = Annotated[str, PathParam(min_length=1, max_length=64)]


@router.post("", response_model=Job, status_code=status.HTTP_202_ACCEPTED)
def start_replay(ctx: Ctx, who: Operator, body: ReplayCreate, response: Response) -> Job:
    """Start a replay of a recording directory (dry run, telemetry time); poll ``Location``. Alternative
    policies (``compare_policies``) are checked first: one that is not a valid policy is a 422."""
    params = {"compare_policies": body.compare_policies} if body.compare_policies else {}
    job = ctx.replays.start(body.recording, params, who.actor)
    response.headers["Location"] = f"/v1/replays/{job['id']}"
    return Job.model_validate(job)


@router.get("", response_model=JobList)
def list_replays(ctx: Ctx, _: Viewer) -> JobList:
    """Recent replay jobs, newest first."""
    return JobList(jobs=[Job.model_validate(j) for j in ctx.replays.list()])


@router.get("/{job_id}", response_model=Job, responses=NOT_FOUND)
def get_replay(ctx: Ctx, _: Viewer, job_id: JobId) -> Job:
    """A replay's state and progress (0-1 of the recording's telemetry time)."""
    job = ctx.replays.get(job_id)
    if job is None:
        raise ApiError(404, f"no replay job {job_id!r}")
    return Job.model_validate(job)


@router.get("/{job_id}/report", response_class=Response, responses=NOT_FOUND | CONFLICT | {
    200: {"description": "The replay report (spec/recording.md)", "content": {"application/json": {"schema": {"type": "object"}}}}})
def replay_report(ctx: Ctx, _: Viewer, job_id: JobId) -> Response:
    """The replay report of spec/recording.md (the same ``gpuops replay`` writes); 409 until it is done."""
    rep = _report(ctx, job_id)
    return Response(orjson.dumps(rep, default=str, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS),
                    media_type="application/json")


def _report(ctx: AppContext, job_id: str) -> dict[str, Any]:
    job = ctx.replays.get(job_id)
    if job is None:
        raise ApiError(404, f"no replay job {job_id!r}")
    rep = ctx.replays.report(job_id)
    if rep is None:
        raise ApiError(409, f"replay {job_id} is {job['state']}" + (f": {job['error']}" if job.get("error") else
                                                                   "; poll it until it has succeeded"))
    return rep


@router.get("/{job_id}/report.html", response_class=Response, responses=NOT_FOUND | CONFLICT | {
    200: {"description": "The replay report as HTML", "content": {"text/html": {"schema": {"type": "string"}}}},
    501: {"model": ErrorBody, "description": "matplotlib is not installed (pip install gpuops[report])"}})
def replay_report_html(ctx: Ctx, _: Viewer, job_id: JobId) -> HTMLResponse:
    """The replay report as one self-contained HTML page (api/report_html.py, as ``gpuops replay --html``)."""
    rep = _report(ctx, job_id)
    try:
        from api.report_html import write_html_report

        with tempfile.TemporaryDirectory(prefix="gpuops-report-") as d:
            page = write_html_report(rep, Path(d) / "report.html").read_text(encoding="utf-8")
    except ImportError as e:
        raise ApiError(501, f"{e}; the JSON report is at /v1/replays/{job_id}/report") from None
    return HTMLResponse(page)
