"""The agent's side of a command: verify it, check the GPU is idle, carry it out, answer.

:class:`CommandHandler` takes the raw bytes of one ``gpu.commands`` message and never
raises: every outcome is a :class:`~collector.commands.CommandResult` (or ``None`` when
nothing may be answered), logged and counted in :meth:`CommandHandler.stats`.

Which refusals are answered on ``gpu.events`` (so the engine is not left waiting):
only those of a command whose signature was valid — the engine's own — for this node,
with a readable id: ``expired``, ``not_yet_valid``, ``unknown_verb``, ``bad_gpu`` and a
signed but ``malformed`` body. Not answered: ``unsigned``, ``bad_signature`` and an
unreadable envelope (anyone could have written them; answering would let a stranger
write results under any id), ``foreign_node`` (that node answers for itself) and
``replayed`` (the first delivery was answered already; a second answer could contradict
it). Those are logged and counted only.

The GPU is reset only when NVML lists no compute process on it (else the result is
``failed`` with ``busy``). The check and the reset are not atomic: a job could start in
between. The engine sends resets to drained, idle nodes, and ``nvidia-smi --gpu-reset``
refuses a GPU that is in use by itself, which comes back as ``reset_failed``.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable, Mapping, Protocol

from collector.commands import (COMMAND_ID_RE, Command, CommandRejected, CommandResult, RejectReason,
                                ReplayGuard, ResultStatus, Verb, check_key, verify)

log = logging.getLogger(__name__)

_ANSWERED = frozenset({RejectReason.EXPIRED, RejectReason.NOT_YET_VALID, RejectReason.UNKNOWN_VERB,
                       RejectReason.BAD_GPU, RejectReason.MALFORMED})


class GpuOps(Protocol):
    """What a command may do to this node's GPUs (real: :class:`collector.gpu_reset.NvmlGpuOps`)."""

    def gpu_count(self) -> int:
        """How many GPUs the node has (indexes 0 .. count-1)."""
        ...

    def compute_processes(self, gpu: int) -> list[int]:
        """PIDs of the compute processes on GPU *gpu*."""
        ...

    def reset(self, gpu: int) -> None:
        """Reset GPU *gpu*; raise when it was not reset."""
        ...


class WallClock(Protocol):
    def time(self) -> float: ...


class CommandHandler:
    """Verifies and carries out the commands for *node*, answering through *publish_result*."""

    def __init__(self, node: str, key: bytes, gpu_ops: GpuOps, clock: WallClock,
                 publish_result: Callable[[CommandResult], None], *, max_skew_s: float = 30.0,
                 replay: ReplayGuard | None = None) -> None:
        self.node = node
        self._key = check_key(key)
        self.gpu_ops = gpu_ops
        self.clock = clock
        self.publish_result = publish_result
        self.max_skew_s = max_skew_s
        self.replay = replay or ReplayGuard()
        #: outcome → count: ``succeeded``, ``failed:<code>``, ``rejected:<reason>``, ``error``
        self.outcomes: Counter[str] = Counter()

    def handle(self, raw: bytes) -> CommandResult | None:
        """Carry out the command in *raw* if it is valid; its result, or ``None`` when unanswered."""
        try:
            return self._handle(raw)
        except Exception:  # noqa: BLE001 - classify, log and continue: one message must not stop the loop
            self.outcomes["error"] += 1
            log.exception("command handling failed unexpectedly (a bug); message of %d bytes dropped",
                          len(raw) if isinstance(raw, (bytes, bytearray)) else -1)
            return None

    def stats(self) -> dict[str, Any]:
        """Counters for the agent's health record."""
        return {"outcomes": dict(self.outcomes), "remembered": len(self.replay), "evicted": self.replay.evicted}

    # ------------------------------------------------------------------ steps

    def _handle(self, raw: bytes) -> CommandResult | None:
        try:
            count: int | None = self.gpu_ops.gpu_count()
        except Exception as e:  # noqa: BLE001 - the GPU check below reports NVML trouble for the command
            log.debug("cannot count GPUs: %s", e)
            count = None
        before = self.replay.evicted
        try:
            command = verify(raw, self._key, node=self.node, now=self.clock.time(), max_skew_s=self.max_skew_s,
                             replay=self.replay, gpu_count=count)
        except CommandRejected as e:
            return self._rejected(e)
        if self.replay.evicted > before:
            log.warning("replay memory full (%d commands): forgot the one expiring soonest", self.replay.max_entries)
        log.info("command %s accepted: %s GPU %d on %s (%s)", command.id, command.verb, command.gpu,
                 command.node, command.reason[:200])
        if command.verb == Verb.GPU_RESET.value:
            return self._finish(command, *self._reset(command.gpu))
        raise AssertionError(f"verify() accepted verb {command.verb!r} with no handler")  # pragma: no cover

    def _reset(self, gpu: int) -> tuple[ResultStatus, str]:
        try:
            pids = self.gpu_ops.compute_processes(gpu)
        except Exception as e:  # noqa: BLE001 - NVML trouble fails this command, not the agent
            return ResultStatus.FAILED, f"gpu_check_failed: cannot tell whether GPU {gpu} is idle: {e}"
        if pids:
            shown = ", ".join(map(str, pids[:10])) + (" …" if len(pids) > 10 else "")
            return ResultStatus.FAILED, (f"busy: {len(pids)} compute process(es) on GPU {gpu} (pids {shown}); "
                                         f"not reset")
        try:
            self.gpu_ops.reset(gpu)
        except Exception as e:  # noqa: BLE001 - a failed reset is a result, not a crash
            return ResultStatus.FAILED, f"reset_failed: {e}"
        return ResultStatus.SUCCEEDED, f"reset: GPU {gpu} reset"

    def _finish(self, command: Command, status: ResultStatus, detail: str) -> CommandResult:
        result = CommandResult(command_id=command.id, node=self.node, gpu=command.gpu, status=status,
                               detail=detail, at=self.clock.time())
        key = status.value if status is ResultStatus.SUCCEEDED else f"{status.value}:{result.code}"
        self.outcomes[key] += 1
        (log.info if status is ResultStatus.SUCCEEDED else log.warning)(
            "command %s %s: %s", command.id, status.value, detail)
        self._publish(result)
        return result

    def _rejected(self, e: CommandRejected) -> CommandResult | None:
        key = f"rejected:{e.reason.value}"
        self.outcomes[key] += 1
        n = self.outcomes[key]
        fields: Mapping[str, Any] = e.command or {}
        cid = fields.get("id")
        answer = (e.command is not None and e.reason in _ANSWERED and isinstance(cid, str)
                  and COMMAND_ID_RE.match(cid) is not None and fields.get("node") == self.node)
        if n % 60 == 1:  # first time, then every 60th: a flood of forgeries must not flood the log
            log.warning("command rejected (%s, %d so far)%s: %s; %s", e.reason.value, n,
                        f" id {cid}" if isinstance(cid, str) else "", e,
                        "answered on the events topic" if answer else "not answered")
        if not answer:
            return None
        gpu = fields.get("gpu")
        result = CommandResult(command_id=cid, node=self.node,
                               gpu=gpu if isinstance(gpu, int) and not isinstance(gpu, bool) and 0 <= gpu < 2**15
                               else None, status=ResultStatus.REJECTED, detail=str(e), at=self.clock.time())
        self._publish(result)
        return result

    def _publish(self, result: CommandResult) -> None:
        try:
            self.publish_result(result)
        except Exception:  # noqa: BLE001 - the outcome stands; losing its answer is logged
            log.exception("could not queue the result of command %s", result.command_id)
