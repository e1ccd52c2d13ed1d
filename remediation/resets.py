"""GPU resets through the node agent: sending the signed command, and taking its answer.

A reset is the one action no scheduler carries out: the engine sends a signed, expiring
command to the node's agent (:class:`CommandChannel`, over ``gpu.commands``; docs/agent.md)
and the answer arrives later and elsewhere, on ``gpu.events``
(:meth:`~remediation.engine.Engine.on_command_result`). So a reset stays ``executing``
— ``awaiting`` the agent — until its result comes, and fails for a person when none comes
within ``reset_timeout_s`` (never sent twice on a timeout: a person checks the GPU). The
same channel carries a ``drain_reset``'s follow-up once its node is idle. Kept apart from
:mod:`remediation.execution` because this half-duplex exchange, its missing-channel
refusals and its timeout are what the scheduler adapters never need.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from .actions import ENGINE_ACTOR, ActionKind, ActionRecord, ActionState, scheduler_reason
from .adapters.base import AdapterError

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)


class CommandChannel(Protocol):
    """Sends a signed GPU reset to a node agent (remediation/adapters/agent_commands.py)."""

    def send_reset(self, action_id: str, node: str, gpu: int, reason: str, now: float) -> Any: ...


class NoChannel(AdapterError):
    """A reset that cannot be sent (permanent)."""


def send(engine: Engine, rec: ActionRecord, reason: str) -> dict[str, Any]:
    """Send *rec*'s reset to the agent (or record it, dry run); the result the action waits on."""
    if rec.dry_run:
        return {"reset": "dry-run: a signed reset would go to the node agent"}
    if engine.commands is None:
        raise NoChannel(f"{rec.node}: a GPU reset needs the node agent's command channel "
                        "(commands: in the service config); the node stays drained for a person")
    if rec.gpu is None:
        raise NoChannel(f"{rec.node}: the reset names no GPU; the node stays drained for a person")
    engine.commands.send_reset(rec.id, rec.node, rec.gpu, reason, engine.clock())
    return {"awaiting": "the node agent's reset result", "command_sent_at": engine.clock()}


def expire(engine: Engine, rec: ActionRecord, now: float) -> int:
    """A reset awaiting its agent: failed for a person once ``reset_timeout_s`` has passed (1), else 0."""
    sent = float(rec.result.get("command_sent_at") or rec.updated_at)
    if now - sent <= engine.safety.reset_timeout_s:
        return 0
    engine._unhold(rec.node)
    engine._move(rec, ActionState.FAILED, ENGINE_ACTOR,
                 f"no result from the node agent within {engine.safety.reset_timeout_s:.0f} s "
                 "(not sent again: a person checks the GPU)", error="reset timed out")
    return 1


def follow_up(engine: Engine, rec: ActionRecord) -> None:
    """A ``drain_reset`` whose node is idle: its GPU reset goes to the agent, or why not is recorded."""
    if rec.dry_run or engine.commands is None or rec.gpu is None:
        why = ("dry-run" if rec.dry_run else "no command channel" if engine.commands is None else "no GPU named")
        engine._save(rec, f"node idle: reset {'recorded' if rec.dry_run else 'left to a person'} ({why})",
                     result={**rec.result, "follow_up_state": "dry-run" if rec.dry_run else "skipped",
                             "follow_up_detail": why})
        return
    engine.commands.send_reset(rec.id, rec.node, rec.gpu, scheduler_reason(rec.kind, rec.fault, rec.id),
                               engine.clock())
    engine._save(rec, "node idle: GPU reset sent to the agent", result={**rec.result, "follow_up_state": "sent"})


def on_result(engine: Engine, action: str, status: str, detail: str) -> ActionRecord | None:
    """The node agent's answer to a reset (gpu.events): records it on its action."""
    with engine._lock:
        rec = engine.store.get(action)
        if rec is None:
            log.warning("command result for unknown action %s (%s): ignored", action, status)
            return None
        if rec.kind is ActionKind.RESET and rec.state is ActionState.EXECUTING:
            if status == "succeeded":
                return engine._move(rec, ActionState.SUCCEEDED, ENGINE_ACTOR, "agent: " + detail,
                                    result={**rec.result, "reset": detail or "succeeded", "awaiting": None})
            return engine._move(rec, ActionState.FAILED, ENGINE_ACTOR, f"agent {status}: {detail}",
                                error=f"{status}: {detail}")
        if rec.kind is ActionKind.DRAIN_RESET:
            return engine._save(rec, f"follow-up reset {status}: {detail}",
                                result={**rec.result, "follow_up_state": status, "follow_up_detail": detail})
        log.info("command result for %s in state %s: recorded only in the log", action, rec.state.value)
        return rec
