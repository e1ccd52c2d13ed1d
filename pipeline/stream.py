"""The feature pipeline driver: ingest columns, close ticks in telemetry time, emit features.

One code path serves live and replay. Whatever feeds it — the bus worker
(:mod:`pipeline.worker`) with decoded Kafka messages, or replay with recording
windows — calls :meth:`FeaturePipeline.ingest` with column batches in any order and
size, then :meth:`FeaturePipeline.advance` with a watermark: every tick
``[k·cadence, (k+1)·cadence)`` whose end the watermark has passed is folded into window
state *as one batch* and scored. Because a tick is processed whole and rows are put in
canonical order, the features do not depend on how the rows were split or ordered on
the way in: live and replay give identical matrices.

Rows older than the last closed tick arrive too late to change features; they are
counted in :attr:`FeaturePipeline.counts` (``late_rows``), never silently lost.

Operator context (issue 13, docs/pipeline.md "Muted time and repairs"): while a node is
muted (:mod:`pipeline.muted`: a maintenance event, a silence) its parts' baselines are
frozen; a part swapped, or reset or rebooted as a repair (in or just after muted time, or by
gpuops' own command), restarts its baseline at the prior.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from collector.commands import ResultStatus, result_from_event
from collector.operator_events import OperatorEventError, maintenance_window
from pipeline.batch import FeatureBatch
from pipeline.bmc import BmcRows, NodeBmcState, bmc_rows_from_frame
from pipeline.samples import GpuRows, NetRows, XidRows
from pipeline.features import FEATURE_NAMES, PartBaselines, compute_features
from pipeline.recordings import gpu_rows_from_frame, net_rows_from_frame, operator_context_from_frame, xid_rows_from_frame
from pipeline.muted import MutedInterval, MutedTime
from pipeline.ports import NodeXidState, PortWindowState
from pipeline.registry import Keys
from pipeline.ring import Folded
from pipeline.settings import PipelineSettings
from pipeline.state import GpuWindowState


@dataclass
class PipelineCounts:
    """What the pipeline did with its input (exported as metrics by the service)."""

    gpu_rows: int = 0
    net_rows: int = 0
    xid_rows: int = 0
    bmc_rows: int = 0
    late_rows: int = 0
    rejected_rows: int = 0
    ticks: int = 0
    #: parts (GPUs and ports) whose baseline restarted at the prior: reset, reboot or swap
    baseline_restarts: int = 0
    #: parts reset or rebooted outside a repair context: baseline kept (pipeline/muted.py)
    unplanned_resets: int = 0
    #: GPU swaps seen (a new gpu_uuid at a (node, index) that had another)
    gpu_swaps: int = 0
    #: node-ticks muted (maintenance or silence): their parts' baselines were frozen
    muted_node_ticks: int = 0
    #: operator maintenance events taken as muted time
    maintenance_events: int = 0


class FeaturePipeline:
    """Streaming per-GPU features on a telemetry-time scoring cadence (live and replay)."""

    def __init__(self, settings: PipelineSettings | None = None) -> None:
        self.settings = s = settings or PipelineSettings()
        self.keys = Keys(s.expected_nodes, s.expected_gpus, s.expected_ports)
        self.gpu_state = GpuWindowState(s.n_buckets, s.bucket_s, s.expected_gpus)
        self.port_state = PortWindowState(s.n_buckets, s.bucket_s, s.expected_ports)
        self.node_xids = NodeXidState(s.n_buckets, s.bucket_s, s.expected_nodes)
        self.node_bmc = NodeBmcState(s.n_buckets, s.bucket_s, s.expected_nodes)
        self.baselines = PartBaselines(s.expected_gpus, s.expected_ports)
        self.counts = PipelineCounts()
        self.muted = MutedTime()
        self.closed_until = -math.inf  # end of the last tick folded into state
        self._swaps: list[tuple[int, float]] = []  # (slot, ts of the new GPU's first sample), not yet folded
        self._swapped: dict[int, set[int]] = {}    # tick -> GPU slots swapped in it, folded, not yet closed
        self._gpu: list[GpuRows] = []
        self._net: list[NetRows] = []
        self._xid: list[XidRows] = []
        self._bmc: list[BmcRows] = []
        self._pending_min_ts = math.inf

    # ------------------------------------------------------------------ input

    def ingest(self, gpu: GpuRows | None = None, net: NetRows | None = None, xids: XidRows | None = None,
               bmc: BmcRows | None = None) -> None:
        """Queue rows of any ticks, in any order; nothing is computed until :meth:`advance`."""
        for rows, pending, counter in ((gpu, self._gpu, "gpu_rows"), (net, self._net, "net_rows"),
                                       (xids, self._xid, "xid_rows"), (bmc, self._bmc, "bmc_rows")):
            if rows is None or len(rows) == 0:
                continue
            late = rows.ts < self.closed_until
            if late.any():
                self.counts.late_rows += int(late.sum())
                rows = rows.take(np.flatnonzero(~late))
                if len(rows) == 0:
                    continue
            setattr(self.counts, counter, getattr(self.counts, counter) + len(rows))
            pending.append(rows)
            self._pending_min_ts = min(self._pending_min_ts, float(rows.ts.min()))

    def ingest_frames(self, gpu: Any = None, net: Any = None, events: Any = None) -> None:
        """Queue recording DataFrames (columns per collector.schema; see :mod:`pipeline.recordings`)."""
        mg = self.settings.max_gpus_per_node
        rows, bad = gpu_rows_from_frame(gpu, self.keys, mg)
        bmc, bad_bmc = bmc_rows_from_frame(events, self.keys)
        self.counts.rejected_rows += bad + bad_bmc
        self.ingest(rows, net_rows_from_frame(net, self.keys), xid_rows_from_frame(events, self.keys, mg), bmc)
        self.ingest_events(operator_context_from_frame(events))

    def ingest_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Take the operator maintenance events among *events* (records) as muted time, and the
        commands gpuops' agent carried out as repairs (:meth:`MutedTime.add_repair`); others are
        ignored (the bus worker hands in ``Decoded.events``, replay the recording's)."""
        for ev in events:
            result = result_from_event(ev)
            if result is not None:
                if result.status is ResultStatus.SUCCEEDED:
                    self.muted.add_repair(result.node, result.at)
                continue
            try:
                window = maintenance_window(ev)
            except OperatorEventError:
                self.counts.rejected_rows += 1  # the bus path dead-letters these before they get here
                continue
            if window is not None:
                self.mute(window.nodes, window.start, window.end)
                self.counts.maintenance_events += 1

    def mute(self, nodes: Iterable[str] | None, start: float, end: float) -> None:
        """Freeze the baselines of *nodes*' parts (``None``: every node) from *start* to *end*."""
        self.muted.add(nodes, start, end)

    def set_silenced(self, intervals: Iterable[MutedInterval]) -> None:
        """Replace the service's silences (as muted intervals; see :mod:`api.scoring`)."""
        self.muted.replace_service(intervals)

    def replay_window(self, window: Any) -> list[FeatureBatch]:
        """Ingest one :class:`collector.recording.RecordingWindow` and close the ticks it completes."""
        rejected = getattr(window, "rejected", None)
        self.counts.rejected_rows += 0 if rejected is None else len(rejected)
        self.ingest_frames(window.gpu, window.net, window.events)
        return self.advance(window.end)

    def replay(self, windows: Iterable[Any]) -> Iterator[FeatureBatch]:
        """Every :class:`FeatureBatch` of a recording, from ``Recording.iter_windows(...)``."""
        for w in windows:
            yield from self.replay_window(w)
        yield from self.flush()

    # ------------------------------------------------------------------ ticks

    def advance(self, watermark: float) -> list[FeatureBatch]:
        """Close every tick with pending rows that ends at or before *watermark* (telemetry s)."""
        cad = self.settings.cadence_s
        if not math.isfinite(watermark):  # nothing seen on some partition yet
            return []
        last_k = math.floor(watermark / cad + 1e-9) - 1  # last tick whose end <= watermark
        if not math.isfinite(self._pending_min_ts) or math.floor(self._pending_min_ts / cad) > last_k:
            return []
        (gpu, tg), self._gpu = _split_due(self._gpu, GpuRows, cad, last_k)
        (net, tn), self._net = _split_due(self._net, NetRows, cad, last_k)
        (xid, tx), self._xid = _split_due(self._xid, XidRows, cad, last_k)
        (bmc, tb), self._bmc = _split_due(self._bmc, BmcRows, cad, last_k)
        due = np.unique(np.concatenate([tg, tn, tx, tb]))
        # GPU and port rows of every due tick are reduced in one pass; ticks then apply in order
        gpu_f = self.gpu_state.fold(gpu, tg, self._due_swaps((last_k + 1) * cad))
        net_f = self.port_state.fold(net, tn)
        out = [self._close_tick(k, gpu_f, net_f, _rows_of_tick(xid, tx, k), _rows_of_tick(bmc, tb, k))
               for k in due.tolist()]
        self._pending_min_ts = min((float(r.ts.min()) for r in (*self._gpu, *self._net, *self._xid, *self._bmc)),
                                   default=math.inf)
        return out

    def flush(self) -> list[FeatureBatch]:
        """Close every tick that has pending rows (end of a replay, or shutdown)."""
        if not math.isfinite(self._pending_min_ts):
            return []
        newest = max(float(r.ts.max()) for r in (*self._gpu, *self._net, *self._xid, *self._bmc))
        cad = self.settings.cadence_s
        return self.advance((math.floor(newest / cad) + 1) * cad)

    def _due_swaps(self, before: float) -> np.ndarray | None:
        """(slot, ts) of the GPU swaps whose first new sample is in a tick about to close, (2, m)."""
        new = self.keys.uuids.take_swaps()
        self.counts.gpu_swaps += len(new)
        self._swaps += [sw for sw in new if sw[1] >= self.closed_until]  # a late row changes nothing
        if not self._swaps:
            return None
        due = [sw for sw in self._swaps if sw[1] < before]
        self._swaps = [sw for sw in self._swaps if sw[1] >= before]
        cad = self.settings.cadence_s
        for slot, ts in due:  # a swap always restarts, repair context or not
            self._swapped.setdefault(math.floor(ts / cad), set()).add(int(slot))
        return np.array(due, np.float64).reshape(-1, 2).T

    def _restart_repaired(self, k: int, gpus: np.ndarray, ports: np.ndarray, tick_end: float) -> None:
        """Restart the baselines of the parts reset in tick *k* as a repair, and of swapped GPUs.

        A reset outside a repair context (:meth:`MutedTime.nodes_repairing`) keeps the part's
        baseline: the same part, with the history a failing part leaves (counted as
        ``unplanned_resets``)."""
        swapped = np.fromiter(self._swapped.pop(k, ()), np.intp)
        if not (len(gpus) or len(ports) or len(swapped)):
            return
        repairing = self.muted.nodes_repairing(self.keys.nodes, tick_end - self.settings.cadence_s, tick_end)
        if repairing is None:
            repaired_g, repaired_p = _NO_SLOTS, _NO_SLOTS
        else:
            repaired_g = gpus[repairing[self.keys.gpus.slot_node[gpus]]]
            repaired_p = ports[repairing[self.keys.ports.port_node[ports]]]
        restart_g = np.union1d(repaired_g, np.intersect1d(gpus, swapped)).astype(np.intp)
        self.counts.unplanned_resets += len(gpus) - len(restart_g) + len(ports) - len(repaired_p)
        if len(restart_g) or len(repaired_p):
            self.counts.baseline_restarts += self.baselines.restart(restart_g, repaired_p)

    def _close_tick(self, k: int, gpu: Folded | None, net: Folded | None, xid: XidRows, bmc: BmcRows) -> FeatureBatch:
        s = self.settings
        tick_end = (k + 1) * s.cadence_s
        reset_gpus = self.gpu_state.apply(gpu, k) if gpu is not None else _NO_SLOTS
        reset_ports = self.port_state.apply(net, k) if net is not None else _NO_SLOTS
        self._restart_repaired(k, reset_gpus, reset_ports, tick_end)
        muted = self.muted.nodes_muted(self.keys.nodes, tick_end - s.cadence_s, tick_end)
        if muted is not None:
            self.counts.muted_node_ticks += int(muted.sum())
        if len(xid):
            on_gpu = xid.gpu >= 0
            slots = self.keys.gpus.slots_of(xid.node[on_gpu], xid.gpu[on_gpu])
            self.gpu_state.add_xids(slots, xid.ts[on_gpu], xid.code[on_gpu])
            self.node_xids.add(xid.node[~on_gpu], xid.ts[~on_gpu], xid.code[~on_gpu])
        self.node_bmc.add(bmc)
        self.gpu_state.ensure(self.keys.gpus.n)
        self.closed_until = tick_end
        self.muted.prune(tick_end)
        self.counts.ticks += 1
        order = self.keys.gpus.canonical_order()
        slots = order[self.gpu_state.last_seen[order] >= tick_end - s.retain_silent_s]
        if len(slots) == 0:  # only ports or events this tick (or every GPU silent too long): nothing to score
            x = np.zeros((0, len(FEATURE_NAMES)), np.float32)
        else:
            x = compute_features(self.gpu_state, self.port_state, self.node_xids, self.keys.gpus, self.keys.ports,
                                 slots, tick_end, s.n_short_buckets, self.baselines, muted, self.node_bmc,
                                 s.retain_silent_s)
        gpus = self.keys.gpus
        return FeatureBatch(tick_end, self.keys.node_names()[gpus.slot_node[slots]], gpus.slot_gpu[slots].copy(), x)

    # ------------------------------------------------------------------ introspection

    @property
    def state_bytes(self) -> int:
        """Bytes of window state (bounded by the number of GPUs and ports, not by time)."""
        return (self.gpu_state.nbytes + self.port_state.nbytes + self.node_xids.nbytes + self.node_bmc.nbytes
                + self.baselines.nbytes)


_NO_SLOTS = np.zeros(0, np.intp)


def _split_due(parts: list[Any], kind: Any, cad: float, last_k: int) -> tuple[tuple[Any, np.ndarray], list[Any]]:
    """((the rows of ticks up to *last_k*, their ticks), the pending parts of later ticks).

    Parts (one per ingest) are split one by one: a part wholly due or wholly pending is
    used as it is, only a part straddling *last_k* is copied, so a tick's close costs one
    copy of its own rows rather than of everything pending. Row order is that of the
    concatenated parts, as before.
    """
    due, due_t, rest = [], [], []
    for r in parts:
        t = np.floor(r.ts / cad).astype(np.int64)
        if t.max() <= last_k:
            due.append(r)
            due_t.append(t)
        elif t.min() > last_k:
            rest.append(r)
        else:
            d = t <= last_k
            i, j = np.flatnonzero(d), np.flatnonzero(~d)
            due.append(r.take(i))
            due_t.append(t[i])
            rest.append(r.take(j))
    if not due:
        return (kind.empty(), np.zeros(0, np.int64)), rest
    return (kind.concat(due), np.concatenate(due_t)), rest


def _rows_of_tick(rows: Any, tick: np.ndarray, k: int) -> Any:
    """The rows of tick *k* (without a copy when they all are: the usual replay case)."""
    if len(rows) and tick[0] == k and tick[-1] == k and (tick == k).all():
        return rows
    return rows.take(np.flatnonzero(tick == k))
