"""From per-GPU feature rows to per-node scores: the models' output (topic ``gpu.scores``).

:func:`score_batches` scores any number of pipeline ticks with one call per detector
(rows stacked, then split back), so live (one tick at a time) and replay (many ticks
at once, for speed) run the same code and get the same numbers. :func:`aggregate`
reduces a tick's GPU rows to one :class:`NodeScores` row per node: the worst GPU's
failure probability and fault class, the highest-priority rule that fired, the most
anomalous GPU, and which feature row to explain each from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from collector.schema import FaultClass
from pipeline.batch import FeatureBatch

from .base import CLASSES
from .bundle import ModelBundle, ScoreBatch
from .coverage import blind_bits, names_of
from .rules import RulesDetector


@dataclass
class NodeScores:
    """Scores of every node that reported in one tick (arrays of length N)."""

    ts: float
    node: np.ndarray        # node names (object)
    p_fail: np.ndarray      # max calibrated failure probability over the node's GPUs
    fault: np.ndarray       # fault class index of that GPU (models.base.CLASSES)
    gpu: np.ndarray         # GPU index with the highest p_fail
    row: np.ndarray         # its row in the tick's feature matrix
    rule: np.ndarray        # highest-priority rule that fired on any GPU, -1 if none
    rule_gpu: np.ndarray    # the GPU that rule fired on; -1 when the rule acts on the whole node
    rule_row: np.ndarray
    rule_fault: np.ndarray  # that rule's fault class index
    rule_action: np.ndarray  # that rule's Action (object; None where no rule fired)
    rule_follow_up: np.ndarray  # that rule's FollowUp (object; None where none or no rule fired)
    anomaly: np.ndarray     # max anomaly level over the node's GPUs
    anomaly_row: np.ndarray
    anomaly_gpu: np.ndarray | None = None  # GPU index of the most anomalous GPU (None: not known)
    #: per node: its window is still filling on the worker that scored it (a node that just arrived there,
    #: e.g. after a rebalance): its prediction may alert but never act (None: every node is warm)
    cold: np.ndarray | None = None
    #: whether the GPU with the highest p_fail logged corrected ECC errors in the short window; True also where
    #: its counter is missing (unknown is not quiet); None: not known for any node
    sbe_now: np.ndarray | None = None
    #: PCIe replays per minute of the GPU with the highest p_fail, short window (NaN: its counter is
    #: missing, or no sample of it fell in the window); None: not known for any node
    #: (PolicyConfig.pcie_warn_per_min)
    pcie_per_min: np.ndarray | None = None
    #: the 10-minute SBE rate of the GPU with the highest p_fail over its own peak of the last 2 h (1: no error in
    #: that time; NaN: not known this tick); under PolicyConfig.hbm_storm_ratio a storm is falling. None: not known
    #: for any node
    sbe_of_peak: np.ndarray | None = None
    #: per node: an acting rule's condition holds on it but a veto stops the rule (a shared cause, such as
    #: another node braking too). Not a reason for a new action; evidence still present on a node gpuops
    #: holds (PolicyConfig.vetoed_rule_keeps_hold). None: not known for any node
    rule_vetoed: np.ndarray | None = None
    #: the 10-minute SBE rate of the GPU with the highest p_fail over its own rate of the hour before (floored at 1
    #: per hour; pipeline.storms); under PolicyConfig.hbm_steady_growth a storm holds its rate. NaN: not known this
    #: tick; None: not known for any node
    sbe_growth: np.ndarray | None = None
    #: per node: whether the GPU with the highest p_fail has a sample in this tick's short window (True where that is
    #: not known). A tick without one is silence, not a reading: under PolicyConfig.stale_tick_keeps_prediction its
    #: probability does not end a prediction. None: every node is fresh
    fresh: np.ndarray | None = None
    #: per node: how many of its GPUs had a reading once but none for the pipeline's retain_silent_s (a GPU off the
    #: bus); under PolicyConfig.resume_needs_every_gpu a held node is not resumed while any is. None: not known
    gpus_lost: np.ndarray | None = None
    #: per node: how many of its GPUs have a reading within retain_silent_s; a node gpuops takes out must have as many
    #: again before it is resumed (PolicyConfig.resume_needs_every_gpu). None: not known
    gpus_reading: np.ndarray | None = None
    #: per node: a bit per precursor signal (models.coverage.SIGNALS) that a GPU of it being read does not send, so
    #: its faults of that class are seen only when they happen (an exporter's counters file). No decision reads it.
    #: None: not known
    blind: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.node)

    def is_cold(self, i: int) -> bool:
        """Whether node *i* was scored from a window still filling (see ``cold``)."""
        return self.cold is not None and bool(self.cold[i])

    def has_vetoed_rule(self, i: int) -> bool:
        """Whether an acting rule's condition holds on node *i* but a veto stops it (see ``rule_vetoed``)."""
        return self.rule_vetoed is not None and bool(self.rule_vetoed[i])

    def is_fresh(self, i: int) -> bool:
        """Whether node *i*'s most likely GPU was read in this tick's short window (see ``fresh``)."""
        return self.fresh is None or bool(self.fresh[i])

    def lost_gpus(self, i: int) -> int:
        """How many GPUs of node *i* are lost (see ``gpus_lost``; 0 when not known)."""
        return 0 if self.gpus_lost is None else int(self.gpus_lost[i])

    def reading_gpus(self, i: int) -> int | None:
        """How many GPUs of node *i* have a reading (see ``gpus_reading``; None when not known)."""
        return None if self.gpus_reading is None else int(self.gpus_reading[i])

    def blind_signals(self, i: int) -> list[str]:
        """The precursor signals node *i* does not send (see ``blind``; empty when none or not known)."""
        return [] if self.blind is None else names_of(int(self.blind[i]))

    def fault_class(self, i: int) -> FaultClass | None:
        """The model's fault class for node *i* (None when the models name none)."""
        return FaultClass(CLASSES[int(self.fault[i])]) if self.fault[i] > 0 else None

    def rule_fault_class(self, i: int) -> FaultClass | None:
        return FaultClass(CLASSES[int(self.rule_fault[i])]) if self.rule_fault[i] > 0 else None


#: the feature behind ``NodeScores.sbe_now``: corrected ECC errors in the short window
SBE_NOW = "ecc_sbe_per_h_short"
#: the feature behind ``NodeScores.pcie_per_min``: PCIe replays per minute in the short window
PCIE_NOW = "pcie_replay_per_min_short"
#: the feature behind ``NodeScores.sbe_of_peak`` (pipeline.storms)
SBE_OF_PEAK = "ecc_sbe_10m_of_peak"
#: the feature behind ``NodeScores.sbe_growth`` (pipeline.storms)
SBE_GROWTH = "ecc_sbe_10m_growth"
#: the feature behind ``NodeScores.fresh``: the GPU's samples in the short window
SAMPLES_NOW = "samples_short"
#: the feature behind ``NodeScores.gpus_lost`` (the same on every row of a node)
GPUS_LOST = "node_gpus_lost"
#: the feature behind ``NodeScores.gpus_reading`` (the same on every row of a node)
GPUS_READING = "node_gpus_reading"


def score_batches(bundle: ModelBundle, batches: Sequence[FeatureBatch]) -> list[ScoreBatch]:
    """Score many ticks with one call per detector; returns one :class:`ScoreBatch` per tick."""
    if not batches:
        return []
    sizes = [len(b) for b in batches]
    x = np.concatenate([b.x for b in batches]) if len(batches) > 1 else batches[0].x
    scores = bundle.score(x)
    bounds = np.cumsum([0] + sizes)
    return [scores.take(np.arange(bounds[i], bounds[i + 1])) for i in range(len(batches))]


def _argmax_per_group(values: np.ndarray, group: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Row index of the largest value in each group (rows grouped contiguously)."""
    order = np.lexsort((-values, group))
    return order[starts]


def aggregate(batch: FeatureBatch, scores: ScoreBatch, rules: RulesDetector) -> NodeScores:
    """Per-node view of one tick (rows of *batch* are grouped by node, canonical order)."""
    n = len(batch)
    if n == 0:
        e, i = np.zeros(0), np.zeros(0, int)
        return NodeScores(batch.ts, np.zeros(0, object), e, i, i, i, i, i, i, i, np.zeros(0, object),
                          np.zeros(0, object), e, i, i)
    node = batch.node
    starts = np.flatnonzero(np.r_[True, node[1:] != node[:-1]])
    group = np.cumsum(np.r_[False, node[1:] != node[:-1]])
    p = np.nan_to_num(scores.p_fail.astype(np.float64), nan=0.0)
    row = _argmax_per_group(p, group, starts)
    rule_key = np.where(scores.rule >= 0, scores.rule, 10_000).astype(np.int64)
    rule_row = _argmax_per_group(-rule_key, group, starts)
    rule = scores.rule[rule_row].astype(np.int32)
    an = np.nan_to_num(scores.anomaly.astype(np.float64), nan=0.0)
    an_row = _argmax_per_group(an, group, starts)
    actions = np.array([r.action for r in rules.rules] + [None], dtype=object)
    follow_ups = np.array([r.follow_up for r in rules.rules] + [None], dtype=object)
    on_node = np.array([r.on_node for r in rules.rules] + [False])
    rule_gpu = np.where(on_node[rule], -1, batch.gpu[rule_row]).astype(int)  # evidence naming no GPU: the node
    sbe = ~(batch.column(SBE_NOW)[row] <= 0) if SBE_NOW in batch.names else None  # NaN (no counter): True
    pcie = batch.column(PCIE_NOW)[row].astype(np.float64) if PCIE_NOW in batch.names else None
    storm = batch.column(SBE_OF_PEAK)[row].astype(np.float64) if SBE_OF_PEAK in batch.names else None
    growth = batch.column(SBE_GROWTH)[row].astype(np.float64) if SBE_GROWTH in batch.names else None
    fresh = ~(batch.column(SAMPLES_NOW)[row] <= 0) if SAMPLES_NOW in batch.names else None  # NaN (not known): True
    lost = np.nan_to_num(batch.column(GPUS_LOST)[starts]).astype(int) if GPUS_LOST in batch.names else None
    reading = np.nan_to_num(batch.column(GPUS_READING)[starts]).astype(int) if GPUS_READING in batch.names else None
    blind = blind_bits(batch, starts)
    vetoed = None
    if scores.rule_vetoed is not None:
        acting = np.array([r.action.acts for r in rules.rules] + [False])
        vetoed = np.maximum.reduceat(acting[scores.rule_vetoed].astype(np.int8), starts) > 0
    return NodeScores(batch.ts, node[starts], p[row], scores.fault[row], batch.gpu[row].astype(int), row,
                      rule, rule_gpu, rule_row, scores.rule_fault[rule_row],
                      actions[rule], follow_ups[rule], an[an_row], an_row, batch.gpu[an_row].astype(int), sbe_now=sbe,
                      pcie_per_min=pcie, sbe_of_peak=storm, rule_vetoed=vetoed, sbe_growth=growth,
                      fresh=fresh, gpus_lost=lost, gpus_reading=reading, blind=blind)
