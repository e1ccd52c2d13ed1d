"""``/v1/replays``: replay a recording on the server in the background, poll it, fetch its report."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Path, Response, status

from api.deps import Ctx, Operator, Viewer
from api.errors import ApiError
from api.routes import AUTH_ERRORS, CONFLICT, NOT_FOUND
from api.schemas import Job, JobList, ReplayCreate

router = APIRouter(prefix="/v1/replays", tags=["replays"], responses=AUTH_ERRORS)
JobId = Annotated[str, Path(min_length=1, max_length=64)]


@router.post("", response_model=Job, status_code=status.HTTP_202_ACCEPTED)
def start_replay(ctx: Ctx, who: Operator, body: ReplayCreate, response: Response) -> Job:
    """Start a replay of a recording directory (dry run, telemetry time); poll ``Location``."""
    job = ctx.replays.start(body.recording, {}, who.actor)
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
    job = ctx.replays.get(job_id)
    if job is None:
        raise ApiError(404, f"no replay job {job_id!r}")
    rep = ctx.replays.report(job_id)
    if rep is None:
        raise ApiError(409, f"replay {job_id} is {job['state']}" + (f": {job['error']}" if job.get("error") else
                                                                   "; poll it until it has succeeded"))
    return Response(orjson.dumps(rep, default=str, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS),
                    media_type="application/json")
