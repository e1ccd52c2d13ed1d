"""``/v1/models``: the model bundles, their validation metrics, activation and training (admin)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, status

from api.deps import Admin, Ctx, Viewer
from api.errors import ApiError
from api.routes import AUTH_ERRORS, NOT_FOUND
from api.schemas import Job, ModelInfo, ModelList, TrainCreate

router = APIRouter(prefix="/v1/models", tags=["models"], responses=AUTH_ERRORS)
ModelName = Annotated[str, Path(min_length=1, max_length=100)]


def _or_404(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except KeyError as e:
        raise ApiError(404, str(e.args[0]) if e.args else "no such model") from None


@router.get("", response_model=ModelList)
def list_models(ctx: Ctx, _: Viewer) -> ModelList:
    """Every model directory, which one scores now, and how each was trained."""
    models = [ModelInfo.model_validate(m) for m in ctx.models.list()]
    active = next((m.name for m in models if m.active), None)
    return ModelList(models=models, active=active)


@router.post("/train", response_model=Job, status_code=status.HTTP_202_ACCEPTED)
def train(ctx: Ctx, who: Admin, body: TrainCreate) -> Job:
    """Train a new model from recordings with incidents, in the background (admin). It is saved
    under the model root and not activated: compare its metrics, then activate it."""
    return Job.model_validate(ctx.models.train(body.model_dump(), who.actor))


@router.get("/train/{job_id}", response_model=Job, responses=NOT_FOUND)
def training_job(ctx: Ctx, _: Viewer, job_id: Annotated[str, Path(max_length=64)]) -> Job:
    """A training job's state and, when done, the new model's name and metrics."""
    job = ctx.models.job(job_id)
    if job is None:
        raise ApiError(404, f"no training job {job_id!r}")
    return Job.model_validate(job)


@router.get("/{name}/metrics", response_model=dict[str, Any], responses=NOT_FOUND)
def model_metrics(ctx: Ctx, _: Viewer, name: ModelName) -> dict[str, Any]:
    """The validation metrics measured when the model was trained."""
    return _or_404(ctx.models.metrics, name)


@router.post("/{name}/activate", response_model=dict[str, Any], responses=NOT_FOUND)
def activate(ctx: Ctx, who: Admin, name: ModelName) -> dict[str, Any]:
    """Score with this model from now on (admin); refused (422) if it would not load."""
    return _or_404(ctx.models.activate, name, who.actor)
