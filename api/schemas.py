"""Request and response bodies of the API, kept apart (``ActionCreate`` in, ``ActionPublic`` out).

Requests refuse what they do not know (``extra="forbid"``) and validate what reaches a
scheduler (node names, GPU indices, non-blank reasons) before any engine call.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from remediation.actions import ActionRecord
from remediation.adapters.base import PermanentAdapterError, validate_node_name
from remediation.config import POLICY_NAME

#: the largest GPU index accepted (8-16 GPUs a node today; leaves room)
MAX_GPU = 255


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ManualKind(str, enum.Enum):
    """What a person may ask for through the API."""

    DRAIN = "drain"
    RESUME = "resume"
    REQUEUE = "requeue"
    RESET = "reset"
    REBOOT = "reboot"


#: a host name, in the OpenAPI document; the validators below check the same with clearer messages
#: (remediation.adapters.base.validate_node_name)
NODE_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$"
#: some character that is not white space
NOT_BLANK = r"\S"


class _ActionCreateBase(_In):
    node: str = Field(..., min_length=1, max_length=253, description="Host name of the node.",
                      json_schema_extra={"pattern": NODE_PATTERN})
    reason: str = Field(..., min_length=1, max_length=1000, description="Why (required, recorded in the audit).",
                        json_schema_extra={"pattern": NOT_BLANK})
    dry_run: bool = Field(True, description="True: the dry-run adapter records it; false: the scheduler acts.")
    force: bool = Field(False, description="Override maintenance and, for a resume, the verification window.")

    @field_validator("node")
    @classmethod
    def _node(cls, v: str) -> str:
        try:
            return validate_node_name(v)
        except PermanentAdapterError as e:
            raise ValueError(str(e)) from None

    @field_validator("reason")
    @classmethod
    def _reason(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("a reason is required (not blank): it is recorded with the action")
        return v.strip()


class NodeActionCreate(_ActionCreateBase):
    """A person's drain, resume, requeue or reboot of a node. ``dry_run`` defaults to true: nothing
    reaches the cluster unless the caller says so."""

    kind: Literal["drain", "resume", "requeue", "reboot"]
    gpu: int | None = Field(None, ge=0, le=MAX_GPU, description="The GPU at fault, if one is.")


class GpuResetCreate(_ActionCreateBase):
    """A person's reset of one GPU (through the node agent). ``dry_run`` defaults to true."""

    kind: Literal["reset"]
    gpu: int = Field(..., ge=0, le=MAX_GPU, description="Index of the GPU to reset.")


#: the body of ``POST /v1/actions``: which fields are required depends on ``kind``
ActionCreate = Annotated[Union[NodeActionCreate, GpuResetCreate], Field(discriminator="kind")]


class Note(_In):
    """An optional note recorded with a decision (approve, reject, cancel, arm, ...)."""

    note: str = Field("", max_length=1000)


class VerdictIn(_In):
    """What a person found on a node gpuops took out on a prediction."""

    verdict: Literal["healthy", "faulty"] = Field(
        ..., description="healthy: the prediction was false (diagnostics clean); faulty: it came true. Counts "
        "against the fleet's false-action budget (docs/engine.md).")
    note: str = Field("", max_length=1000, description="What was found (recorded with the verdict).")


class RequiredNote(_In):
    """A note that must say why (closing the breaker)."""

    note: str = Field(..., min_length=1, max_length=1000, json_schema_extra={"pattern": NOT_BLANK})

    @field_validator("note")
    @classmethod
    def _blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("a note saying why it is safe is required")
        return v


class ReplayCreate(_In):
    """A replay of a recording directory on the server."""

    recording: str = Field(..., min_length=1, max_length=4096, description="Path of a recording directory.")
    compare_policies: dict[Annotated[str, Field(pattern=POLICY_NAME)], dict[str, Any]] = Field(
        default_factory=dict, max_length=8,
        description="More policies decided on the same scores (``gpuops replay --compare-policy``): name -> the "
        "settings that differ from the service's policy, e.g. ``{\"hbm-alert\": {\"actions\": {\"hbm_ecc\": "
        "\"alert\"}}}`` (a mapping setting is merged key by key). The report's ``alternatives`` section puts each "
        "beside the service's policy.")


class TrainCreate(_In):
    """Train a new model bundle from recordings with incidents on the server."""

    recordings: list[str] = Field(..., min_length=1, max_length=64)
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
                             description="Directory name under the model root (default: trained-<time>).")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    val_fraction: float = Field(0.3, ge=0.05, le=0.9)


# ---- answers ------------------------------------------------------------------------------

class ErrorDetail(BaseModel):
    code: str
    message: str
    detail: Any = None


class ErrorBody(BaseModel):
    """Every error: what is wrong, and what to do."""

    error: ErrorDetail


class ActionPublic(BaseModel):
    """An action record as the API shows it."""

    id: str
    node: str
    kind: str
    state: str
    reason: str
    actor: str
    incident_ts: float
    created_at: float
    updated_at: float
    gpu: int | None = None
    fault: str | None = None
    grade: str | None = None
    source: str | None = None
    score: float | None = None
    evidence: dict[str, Any] = {}
    dry_run: bool
    adapter: str
    attempts: int
    error: str | None = None
    result: dict[str, Any] = {}
    blocked_by: str | None = None
    #: gpuops already held the node: the same incident going further, not a new take-out
    escalates: bool = False
    #: a person's verdict on a prediction hold: healthy (it was false) or faulty (it came true)
    verdict: str | None = None

    @classmethod
    def of(cls, rec: ActionRecord) -> "ActionPublic":
        return cls.model_validate(rec.to_dict())


class AuditEvent(BaseModel):
    at: float
    from_state: str | None
    to_state: str
    actor: str
    note: str


class ActionDetail(ActionPublic):
    history: list[AuditEvent]


class ActionList(BaseModel):
    actions: list[ActionPublic]
    count: int
    limit: int
    offset: int


class NodeRow(BaseModel):
    """One node in the fleet list."""

    node: str
    state: str = Field(description="ok, at_risk, held or unknown")
    risk: float
    fault: str | None
    gpu: int
    anomaly: float
    rule: int | None
    ts: float


class NodeList(BaseModel):
    nodes: list[NodeRow]
    count: int
    ts: float | None


class HistoryPoint(BaseModel):
    ts: float
    risk: float
    anomaly: float


class NodeDetail(NodeRow):
    """One node: its latest score with the reasons and features behind it, history, events, actions."""

    reasons: dict[str, Any]
    detail: dict[str, Any]
    history: list[HistoryPoint]
    events: list[dict[str, Any]]
    actions: list[ActionPublic]
    hold: dict[str, Any] | None = Field(
        None, description="While the node is held: the action holding it, who took it out and when, its GPUs then "
        "and now, and waiting_for: what its resume still waits for (min_hold_s, a rule, risk, a GPU without a "
        "reading, the clean time); a person's hold waits for that person (api/holds.py).")
    retry_cap: dict[str, Any] | None = Field(
        None, description="After gpuops acted on a prediction for this node that did not come true (the node came "
        "back healthy): which of its predictions only alert (fault; null: every class, model_retry_per_fault off), "
        "since the action that was wrong (since, action), until when (until; model_retry_window_s after it), and "
        "reason in words. Rules still act. null: nothing capped (api/holds.py).")
    blind_signals: list[str] | None = Field(
        None, description="The precursor signals this node does not send (models/coverage.py: ecc, nvlink, pcie, "
        "throttle, temperature, power, clocks, ib_ports, bmc): faults of their classes are seen here only when they "
        "happen. GET /v1/coverage says what to enable. null: the scorer does not say.")


class SignalCoverage(BaseModel):
    signal: str = Field(description="ecc, nvlink, pcie, throttle, temperature, power, clocks, ib_ports or bmc")
    faults: list[str] = Field(description="The fault classes whose precursor this signal carries.")
    enable: str = Field(description="What to turn on to send it (dcgm-exporter fields; the agent's source).")
    nodes: list[str] = Field(description="Nodes whose latest scores say a GPU being read does not send it.")
    count: int


class Coverage(BaseModel):
    """The precursor signals nodes do not send (GET /v1/coverage)."""

    signals: list[SignalCoverage]
    nodes_known: int = Field(description="Nodes whose scorer said which signals they send.")
    ts: float | None


class EngineStatus(BaseModel):
    armed: bool
    paused: bool
    breaker: dict[str, Any]
    adapter: str
    held: list[str]
    counts: dict[str, int]
    safety: dict[str, Any]
    leader: bool
    acting: bool
    silences: list[str] = Field([], description="Ids of the silences in force now.")
    budget: dict[str, Any] = Field(
        {}, description="The false-action budget: per fault class, the prediction holds that ended healthy "
        "(unconfirmed) and that came true (confirmed) in its window, the fleet's node-days, and the classes it "
        "brakes (their predictions only alert), with why.")


class Breaker(BaseModel):
    open: bool
    state: dict[str, Any]
    history: list[dict[str, Any]]


class ModelInfo(BaseModel):
    name: str
    path: str
    active: bool
    created: str | None = None
    detectors: list[str] = []
    metadata: dict[str, Any] = {}
    error: str | None = None


class ModelList(BaseModel):
    models: list[ModelInfo]
    active: str | None


class ShadowDecisions(BaseModel):
    """What one policy decided since the record started (remediation/shadow.py)."""

    decisions: int
    by_action_and_fault: dict[str, dict[str, int]] = Field(description="action -> fault class -> decisions")
    recent: list[dict[str, Any]] = Field(description="The latest decisions (up to 200), oldest first.")


class ShadowPolicyDecisions(ShadowDecisions):
    policy: dict[str, Any] = Field(description="The shadow policy's settings, in full.")


class ShadowReport(BaseModel):
    """The shadow policies beside the live one: decided on every tick, never carried out."""

    leader: bool = Field(description="Only the leader decides; ask it (a standby's record is empty).")
    since: float | None = Field(description="Telemetry time of the first tick recorded (None: none yet).")
    ticks: int
    live: ShadowDecisions
    shadows: dict[str, ShadowPolicyDecisions] = Field(description="By name (service config shadow_policies); "
                                                      "empty when none is configured.")


class Job(BaseModel):
    """A background job (replay, training)."""

    id: str
    kind: str
    state: str = Field(description="queued, running, succeeded or failed")
    progress: float = Field(ge=0, le=1)
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    actor: str
    params: dict[str, Any] = {}
    error: str | None = None
    result: dict[str, Any] = {}


class JobList(BaseModel):
    jobs: list[Job]


class Health(BaseModel):
    status: str
    detail: str = ""
    uptime_s: float = 0.0
    version: str = ""


class SilenceCreate(_In):
    """A person's silence: exactly one scope (``nodes``, ``selector`` or ``fleet``), what it mutes,
    and a required end (``ends_at`` or ``duration_s``); no longer than the service's max_silence_s."""

    nodes: list[str] | None = Field(None, max_length=10_000, description="Host names of the nodes.")
    selector: dict[str, str] | None = Field(
        None, description="Labels every node in scope has: partition (Slurm partition / node pool), rack, pool.")
    fleet: bool = Field(False, description="True: the whole fleet.")
    mutes: Literal["actions", "alerts", "both"] = Field("both", description="What is muted.")
    starts_at: float | None = Field(None, ge=0, description="Start, s since the epoch (default now).")
    ends_at: float | None = Field(None, ge=0, description="End, s since the epoch (or give duration_s).")
    duration_s: float | None = Field(None, gt=0, description="Length from the start, s (or give ends_at).")
    reason: str = Field(..., min_length=1, max_length=1000, description="What work is going on (required).",
                        json_schema_extra={"pattern": NOT_BLANK})

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: list[str] | None) -> list[str] | None:
        for n in v or ():
            try:
                validate_node_name(n)
            except PermanentAdapterError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("reason")
    @classmethod
    def _reason(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("a reason is required (not blank): say what work is going on")
        return v.strip()


class SilencePublic(BaseModel):
    id: str
    scope: str = Field(description="nodes, selector or fleet")
    nodes: list[str]
    selector: dict[str, str]
    fleet: bool
    mutes: str
    starts_at: float
    ends_at: float
    author: str
    reason: str
    created_at: float
    deleted_at: float | None = None
    deleted_by: str | None = None
    active: bool = Field(description="In force now.")


class SilenceDetail(SilencePublic):
    history: list[dict[str, Any]] = Field(description="Audit events, oldest first: at, event, actor, note.")


class SilenceList(BaseModel):
    silences: list[SilencePublic]
    count: int
