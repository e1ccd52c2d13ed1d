"""Why a node gpuops holds is not back in service yet, in the words of the policy's resume rule.

``GET /v1/nodes/{name}`` (``hold``) and ``gpuops node`` show it, so on-call need not work out
from the docs why a drained node stays drained. A node gpuops took out is resumed once it has
been out ``min_hold_s`` and clean for ``resume_after_s``: no rule firing, its risk under
``clear_threshold``, and (``resume_needs_every_gpu``) every GPU it had reading again
(:func:`remediation.policy.decide`). Every replica can tell what the latest scores say; how
long the node has been clean is the policy's memory, which only the engine leader keeps. A node
only a person took out is theirs: gpuops never resumes it.

``retry_cap`` says the other thing on-call asks of a node gpuops only alerts on: after a
prediction that did not come true, the node's next predictions (of that class, with
``model_retry_per_fault``) only alert for ``model_retry_window_s``; from the node's records, as
a restart rebuilds it (:func:`remediation.recovery.retry_caps`), so every replica says the same.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from remediation.actions import CARRIED_OUT, ENGINE_ACTOR, ActionKind, ActionRecord
from remediation.config import PolicyConfig
from remediation.policy import NodeState, gpu_missing
from remediation.recovery import held_fields, holds_of, retry_caps


def hold_status(records: Sequence[ActionRecord], row: Mapping[str, Any] | None, cfg: PolicyConfig,
                state: NodeState | None) -> dict[str, Any] | None:
    """The hold of one node from its *records* (newest first, as the store lists them) and its latest
    scores *row* (the fleet view's); None when nothing holds it. *state*: the policy's memory of the
    node on the engine leader, None elsewhere."""
    oldest_first = sorted(records, key=lambda r: r.created_at)
    hold = next(iter(holds_of(oldest_first).values()), None)
    if hold is None:
        return None
    ours = next(iter(holds_of(oldest_first, ENGINE_ACTOR).values()), None)
    out: dict[str, Any] = {"action": hold.id, "kind": hold.kind.value, "actor": hold.actor, "reason": hold.reason,
                           "gpus_reading": row.get("gpus_reading") if row else None,
                           "gpus_lost": row.get("gpus_lost") if row else None}
    if ours is None:
        out.update(since=hold.incident_ts, fault=hold.fault, gpus_when_taken_out=None, clean_since=None,
                   waiting_for=[f"a person: taken out by {hold.actor}, and gpuops never resumes a person's hold "
                                "(resume it with force once the work is done)"])
        return out
    fields = held_fields(ours)
    since = state.held_since if state is not None and state.held_since is not None else fields["held_since"]
    gpus = state.held_gpus if state is not None and state.held_gpus is not None else fields["held_gpus"]
    clean = state.healthy_since if state is not None else None
    out.update(since=since, fault=ours.fault, gpus_when_taken_out=gpus, clean_since=clean,
               waiting_for=_waits(row, cfg, since, gpus, clean, leader=state is not None))
    return out


def _waits(row: Mapping[str, Any] | None, cfg: PolicyConfig, since: float, gpus: int | None, clean: float | None,
           leader: bool) -> list[str]:
    """What the resume rule still waits for, one phrase each (empty: it is due at the next tick)."""
    if row is None:
        return ["scores: none of this node since this replica started"]
    now = float(row["ts"])
    out = []
    if now - since < cfg.min_hold_s:
        out.append(f"min_hold_s: out {(now - since) / 60:.0f} of {cfg.min_hold_s / 60:.0f} min")
    dirty = []
    if row.get("rule") is not None:
        dirty.append("a rule still fires: " + str((row.get("reasons") or {}).get("rule", f"rule {row['rule']}")))
    if row["risk"] >= cfg.clear_threshold:
        dirty.append(f"risk {row['risk']:.2f}, not under clear_threshold {cfg.clear_threshold:g}")
    lost, reading = row.get("gpus_lost") or 0, row.get("gpus_reading")
    if cfg.resume_needs_every_gpu and gpu_missing(lost, reading, gpus):
        dirty.append(f"{lost} GPU(s) without a reading for retain_silent_s (off the bus, or pulled): every GPU it "
                     "reported from must read again; after removing one for good, resume it with force" if lost else
                     f"{reading} of the {gpus} GPUs it had when taken out read now: every one must read again")
    if dirty:
        return out + dirty
    if not leader:
        return out + ["clean now: how long is the engine leader's to say (its GET /v1/nodes/NAME)"]
    if clean is None or now - clean < cfg.resume_after_s:
        done = 0.0 if clean is None else (now - clean) / 60
        out.append(f"clean for {done:.0f} of resume_after_s {cfg.resume_after_s / 60:.0f} min")
    return out


def retry_cap(records: Sequence[ActionRecord], now: float, cfg: PolicyConfig) -> dict[str, Any] | None:
    """The retry cap on one node from its *records* (any order): which predictions only alert (``fault``; None:
    every class), since the prediction action that did not come true (``since``, ``action``) and ``until`` when;
    None when nothing is capped at telemetry time *now*. A node still held on that prediction is not capped yet
    (its hold is what ``hold`` shows): the cap is for after it comes back healthy."""
    oldest_first = sorted(records, key=lambda r: r.created_at)
    cap = next(iter(retry_caps(oldest_first).values()), None)
    if cap is None or cfg.model_retry_window_s <= 0 or (cfg.model_retry_per_fault and cap["predicted_fault"] is None):
        return None                     # (per class, a prediction of no known class caps none, as in the policy)
    since = float(cap["predicted_action_at"])
    until = since + cfg.model_retry_window_s
    if now >= until or not any(r.kind is ActionKind.RESUME and r.state in CARRIED_OUT and r.incident_ts >= since
                               for r in oldest_first):
        return None
    fault = cap["predicted_fault"].value if cfg.model_retry_per_fault and cap["predicted_fault"] else None
    action = next((r.id for r in reversed(oldest_first) if r.incident_ts == since and r.source == "model"), None)
    what = f"predictions of {fault}" if fault else "predictions of every class"
    wrong = cap["predicted_fault"].value if cap["predicted_fault"] else "a fault"
    return {"fault": fault, "since": since, "until": until, "action": action,
            "reason": f"{what} only alert for {(until - now) / 3600:.1f} h more: gpuops acted on a prediction of "
                      f"{wrong} {(now - since) / 3600:.1f} h ago that did not come true, so a person decides (rules "
                      "still act)"}
