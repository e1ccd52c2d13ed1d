"""Policy configuration: thresholds and per-fault actions, as validated YAML.

Every knob says its unit and why its default. Load with :func:`load_policy_config`;
an invalid file fails at start-up with every problem listed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from collector.schema import Action, FaultClass

#: What to do, per fault class, when the model predicts it (rules carry their own action).
DEFAULT_ACTIONS: dict[FaultClass, Action] = {
    FaultClass.HBM_ECC: Action.RESET,       # a reset activates pending row remaps (RMA after remap failure)
    FaultClass.GPU_OFF_BUS: Action.DRAIN,
    FaultClass.NVLINK: Action.DRAIN,
    FaultClass.PCIE: Action.DRAIN,
    FaultClass.THERMAL: Action.DRAIN,
    FaultClass.POWER: Action.DRAIN,
    FaultClass.IB_LINK: Action.DRAIN,
    FaultClass.FAIL_SLOW: Action.DRAIN,     # soft: drain lets the running job finish
    FaultClass.APP_ERROR: Action.NONE,      # the job's own fault: never touch the node
}


class PolicyConfigError(ValueError):
    """An invalid policy file (permanent: fix the file)."""


class PolicyConfig(BaseModel):
    """Thresholds of :func:`remediation.policy.decide`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    act_threshold: float = Field(
        0.7, gt=0, le=1,
        description="Calibrated failure probability (0-1) at which the model's prediction becomes an "
        "action. 0.7: a false drain costs a node for hours, so act only when failure is likelier than not "
        "by a margin; replay on held-out seeds shows where recall and false actions balance.")
    act_threshold_by_fault: dict[FaultClass, float] = Field(
        default_factory=dict, description="Per-fault overrides of act_threshold (0-1).")
    act_ticks: int = Field(
        3, ge=1, le=60,
        description="Consecutive scoring ticks the probability must stay above the threshold. 3 ticks "
        "(3 min at the default cadence) rejects the one- or two-minute spikes a single PCIe replay or a "
        "job's clock change gives, and costs two minutes of lead (on tuning replays: 7 false actions -> 2 "
        "in 512 node-days, one predictive catch fewer in 164).")
    model_warmup_s: float = Field(
        1800.0, ge=0,
        description="A prediction acts on a node only once gpuops has seen it this long, s: before the long "
        "window has filled, slopes, spreads and fleet deviations come from a few samples (service start, a "
        "node that just joined). Rules act at once; predictions meanwhile only alert. Default: the "
        "pipeline's long window, 30 min.")
    alert_threshold: float = Field(
        0.3, gt=0, le=1, description="Probability (0-1) at which a person is told, with no change to the node.")
    anomaly_alert: float = Field(
        0.9999, gt=0, le=1,
        description="Anomaly level (fraction of healthy GPUs less strange, 0-1) that raises an alert. "
        "1e-4 of healthy GPU-ticks is ~1 alert per 10 k GPU-minutes: rare enough to read.")
    alert_interval_s: float = Field(
        3600.0, ge=0, description="At most one alert per node per this many seconds (avoid paging storms).")
    min_hold_s: float = Field(
        3600.0, ge=0,
        description="A node drained or reset by gpuops stays out this long at least, s, before it may be "
        "resumed: long enough for a reset/reboot and a health check.")
    resume_after_s: float = Field(
        1800.0, ge=0, description="...and only after its scores stayed below clear_threshold this long, s.")
    clear_threshold: float = Field(
        0.1, ge=0, le=1, description="Probability (0-1) under which a held node counts as healthy again.")
    model_retry_window_s: float = Field(
        86400.0, ge=0,
        description="After gpuops acted on a node on a *prediction* and the node came back healthy, further "
        "predictions for it within this many seconds only alert: the prediction was wrong once (a confounder "
        "such as a steady low SBE rate), so a person decides. Rules on hard evidence still act. 24 h.")
    actions: dict[FaultClass, Action] = Field(default_factory=lambda: dict(DEFAULT_ACTIONS),
                                              description="Action per predicted fault class.")
    use_model: bool = Field(True, description="False: rules only (the reactive baseline).")

    @model_validator(mode="after")
    def _consistent(self) -> "PolicyConfig":
        if self.alert_threshold > self.act_threshold:
            raise ValueError("alert_threshold must not exceed act_threshold (alert before you act)")
        if self.clear_threshold >= self.alert_threshold:
            raise ValueError("clear_threshold must be below alert_threshold")
        for f, a in self.actions.items():
            if a in (Action.RESUME,):
                raise ValueError(f"'{a.value}' is not a remedy for {f.value}")
        return self

    def threshold_for(self, fault: FaultClass) -> float:
        return self.act_threshold_by_fault.get(fault, self.act_threshold)

    def action_for(self, fault: FaultClass) -> Action:
        return self.actions.get(fault, DEFAULT_ACTIONS[fault])


def load_policy_config(path: str | Path | None) -> PolicyConfig:
    """Read a policy YAML file (``None``: defaults); invalid files raise :class:`PolicyConfigError`."""
    if path is None:
        return PolicyConfig()
    try:
        raw: Any = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise PolicyConfigError(f"{path}: cannot read policy: {e}") from None
    if not isinstance(raw, dict):
        raise PolicyConfigError(f"{path}: policy must be a mapping of settings")
    raw = raw.get("policy", raw)
    try:
        return PolicyConfig(**raw)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'policy'}: {err['msg']}" for err in e.errors())
        raise PolicyConfigError(f"{path}: {problems}") from None
