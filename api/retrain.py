"""Scheduled retraining: train a new bundle, activate it only if it beats the current one on held-out data.

The job (``scheduler.retrain_enabled``, off by default) asks the model registry to train on
the configured recordings (``retrain_params.recordings``), waits for the job, then replays a
**held-out** recording (``retrain_params.held_out``: one the training never saw, with
``incidents.jsonl``) through the new bundle and through the active one, with the same policy,
and compares the two on :func:`models.evaluation.score_replay`'s metrics. The new bundle is
activated only if it :func:`beats` the current one; either way the verdict and both sets of
numbers are returned (and logged) so a person can see why.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from models.bundle import ModelBundle, default_model_path
from remediation.config import PolicyConfig

log = logging.getLogger(__name__)

#: the numbers the verdict reads, and which way is better
_RECALL = ("recall", "predictive_recall")
_FALSE = "false_actions_per_1k_node_days"


def held_out_metrics(bundle: ModelBundle, recording: str | Path, policy: PolicyConfig) -> dict[str, Any]:
    """The model policy's metrics when *bundle* replays *recording* (which must hold incidents)."""
    from api.replay import Replayer, build_report

    result = Replayer(bundle, policy).run(recording)
    report = build_report(recording, result, {}, policy)
    if "metrics" not in report:
        raise ValueError(f"{recording}: has no incidents.jsonl, so it cannot judge a model")
    return report["metrics"]["model"]


def beats(new: dict[str, Any], current: dict[str, Any]) -> tuple[bool, str]:
    """Whether *new* is better: no more false actions and no lower recall, and better in one of them."""
    def num(m: dict[str, Any], k: str) -> float:
        v = m.get(k)
        return float(v) if v is not None else 0.0

    worse = [k for k in _RECALL if num(new, k) < num(current, k)]
    if num(new, _FALSE) > num(current, _FALSE):
        worse.append(_FALSE)
    better = [k for k in _RECALL if num(new, k) > num(current, k)]
    if num(new, _FALSE) < num(current, _FALSE):
        better.append(_FALSE)
    if worse:
        return False, "worse on " + ", ".join(f"{k} ({num(new, k):.3g} vs {num(current, k):.3g})" for k in worse)
    if not better:
        return False, "no better on held-out data (equal on recall and false actions)"
    return True, "better on " + ", ".join(f"{k} ({num(new, k):.3g} vs {num(current, k):.3g})" for k in better)


def retrain(registry: Any, params: dict[str, Any], policy: PolicyConfig, *, actor: str = "scheduler",
            timeout_s: float = 6 * 3600.0, poll_s: float = 5.0, sleep: Callable[[float], None] = time.sleep,
            monotonic: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Train through *registry*, judge on ``params["held_out"]``, activate if better; the verdict."""
    held_out = params.get("held_out")
    if not held_out or not params.get("recordings"):
        raise ValueError("retraining needs retrain_params.recordings (to train on) and retrain_params.held_out "
                         "(a recording with incidents the training never saw)")
    job = registry.train({k: v for k, v in params.items() if k != "held_out"}, actor)
    deadline = monotonic() + timeout_s
    while job.get("state") not in ("succeeded", "failed"):
        if monotonic() > deadline:
            return {"activated": False, "why": f"training job {job['id']} still running after {timeout_s:.0f} s"}
        sleep(poll_s)
        job = registry.job(job["id"]) or job
    if job["state"] == "failed":
        return {"activated": False, "why": f"training failed: {job.get('error')}"}
    name = job["result"]["name"]
    active = registry.active()
    current_path = registry.path(active) if active else default_model_path()
    new_m = held_out_metrics(ModelBundle.load(registry.path(name)), held_out, policy)
    cur_m = held_out_metrics(ModelBundle.load(current_path), held_out, policy)
    ok, why = beats(new_m, cur_m)
    out = {"model": name, "current": str(current_path), "activated": ok, "why": why,
           "held_out": str(held_out), "new": {k: new_m.get(k) for k in (*_RECALL, _FALSE)},
           "current_metrics": {k: cur_m.get(k) for k in (*_RECALL, _FALSE)}}
    if ok:
        registry.activate(name, actor)
    log.warning("retraining: %s %s (%s)", name, "activated" if ok else "kept inactive", why)
    return out
