"""``gpuops replay --trace NODE[:GPU]``: every tick's scores and features of some GPUs, as CSV.

Why gpuops acted on a node, or did not, is spread over a replay: the failure probability the
model gave each tick, the rule that fired (or held, and was vetoed by a shared cause), the
anomaly level, and the features behind all three. The report keeps the decisions; a trace keeps
every tick of the parts asked for, so a missed incident or a false drain can be read minute by
minute (docs/replay.md).

The CSV is written as the replay goes (memory does not grow with the recording), one row per
GPU and tick: ``ts``, ``time`` (UTC), ``node``, ``gpu``, ``p_fail``, ``fault`` (the classifier's
class), ``rule`` / ``rule_fault`` (the rule that fired, empty if none), ``rule_vetoed``, ``anomaly``,
``decision`` (what the model policy did on that tick for the node or that GPU, empty if nothing),
then the features (all of :data:`pipeline.features.FEATURE_NAMES`, or those asked for).
"""

from __future__ import annotations

import csv
import datetime as dt
import difflib
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable, Sequence

import numpy as np

from models.base import CLASSES
from models.bundle import ScoreBatch
from pipeline.batch import FeatureBatch
from pipeline.features import FEATURE_NAMES
from remediation.policy import Decision

HEAD = ("ts", "time", "node", "gpu", "p_fail", "fault", "rule", "rule_fault", "rule_vetoed", "anomaly", "decision")


@dataclass(frozen=True)
class TraceTarget:
    """A node, or one GPU of it (``gpu`` None: every GPU of the node)."""

    node: str
    gpu: int | None = None

    @classmethod
    def parse(cls, text: str) -> "TraceTarget":
        """``NODE`` or ``NODE:GPU`` (GPU a non-negative index)."""
        node, sep, gpu = text.strip().rpartition(":")
        if not sep:
            node = gpu
        if not node:
            raise ValueError(f"--trace {text!r}: expected NODE or NODE:GPU (e.g. gpu-node-007:3)")
        if not sep:
            return cls(node)
        if not gpu.isdigit():
            raise ValueError(f"--trace {text!r}: the GPU after ':' must be an index (0, 1, ...), got {gpu!r}")
        return cls(node, int(gpu))


def feature_columns(names: Sequence[str] | None) -> list[str]:
    """The features a trace writes: *names* in the order given (all when None or empty); a name the
    pipeline does not compute is a ``ValueError`` that suggests the nearest ones."""
    if not names:
        return list(FEATURE_NAMES)
    unknown = [n for n in names if n not in FEATURE_NAMES]
    if unknown:
        hints = {n: difflib.get_close_matches(n, FEATURE_NAMES, n=3, cutoff=0.5) for n in unknown}
        said = "; ".join(f"{n!r}" + (f" (did you mean {', '.join(h)}?)" if h else "") for n, h in hints.items())
        raise ValueError(f"--trace-features: not a feature gpuops computes: {said}. "
                         "`python -m pipeline.features` lists them all")
    return list(dict.fromkeys(names))


class Tracer:
    """Writes the traced parts' rows to the CSV *path* as :class:`api.replay.Replayer` scores each tick.

    Every argument is checked before the file is opened (a bad one leaves no file behind)."""

    def __init__(self, targets: Iterable[TraceTarget], path: Path, features: Sequence[str] | None = None,
                 rule_names: Sequence[str] = ()) -> None:
        self.targets = list(dict.fromkeys(targets))
        if not self.targets:
            raise ValueError("a trace needs at least one NODE or NODE:GPU")
        self.features = feature_columns(features)
        if not path.parent.is_dir():
            raise ValueError(f"--trace-out {path}: folder {path.parent} does not exist")
        self._cols = np.array([FEATURE_NAMES.index(f) for f in self.features], np.intp)
        self._nodes = {t.node for t in self.targets}
        self._whole = {t.node for t in self.targets if t.gpu is None}
        self._gpus = {(t.node, t.gpu) for t in self.targets if t.gpu is not None}
        self.rule_names = tuple(rule_names)
        self.seen: set[TraceTarget] = set()
        self._scored: list[str] | None = None
        self.rows = 0
        self._out: IO[str] = path.open("w", newline="")
        self._w = csv.writer(self._out, lineterminator="\n")
        self._w.writerow(HEAD + tuple(self.features))

    def __call__(self, batch: FeatureBatch, scores: ScoreBatch, decisions: Sequence[Decision] = ()) -> None:
        """One scored tick, with the model policy's decisions on it."""
        if self._scored is None:  # the nodes of the first tick: enough to show what a mistyped name could be
            self._scored = sorted(set(batch.node.tolist()))
        on_node = np.isin(batch.node, list(self._nodes))
        if not on_node.any():
            return
        did: dict[tuple[str, int | None], list[str]] = defaultdict(list)
        for d in decisions:
            if d.node in self._nodes:
                did[(d.node, d.gpu)].append(f"{d.action.value} ({d.source}, {d.grade.value}): {d.reason}")
        stamp = dt.datetime.fromtimestamp(batch.ts, dt.timezone.utc).isoformat(timespec="seconds")
        for i in np.flatnonzero(on_node):
            node, gpu = str(batch.node[i]), int(batch.gpu[i])
            if node not in self._whole and (node, gpu) not in self._gpus:
                continue
            self.seen.add(TraceTarget(node) if node in self._whole else TraceTarget(node, gpu))
            if (node, gpu) in self._gpus:
                self.seen.add(TraceTarget(node, gpu))
            r = int(scores.rule[i])
            v = -1 if scores.rule_vetoed is None else int(scores.rule_vetoed[i])
            decision = "; ".join(did.get((node, None), []) + did.get((node, gpu), []))
            self._w.writerow((f"{batch.ts:.17g}", stamp, node, gpu, _num(scores.p_fail[i]),
                              CLASSES[int(scores.fault[i])], self._rule(r),
                              CLASSES[int(scores.rule_fault[i])] if r >= 0 else "", self._rule(v),
                              _num(scores.anomaly[i]), decision, *(_num(x) for x in batch.x[i, self._cols])))
            self.rows += 1

    @property
    def nodes(self) -> list[str]:
        """The nodes of the first scored tick, sorted (to say what a mistyped name could have been)."""
        return self._scored or []

    def close(self) -> None:
        self._out.close()

    def missing(self) -> list[TraceTarget]:
        """Targets no scored row matched (a node or GPU the recording does not have, or never scored)."""
        return [t for t in self.targets if t not in self.seen]

    def _rule(self, i: int) -> str:
        if i < 0:
            return ""
        return self.rule_names[i] if i < len(self.rule_names) else str(i)


def _num(v: float) -> str:
    """A value as CSV text: 7 significant digits (the features are float32), empty when unknown."""
    v = float(v)
    return "" if math.isnan(v) else f"{v:.7g}"
