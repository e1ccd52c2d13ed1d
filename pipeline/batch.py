"""Output of the pipeline: one :class:`FeatureBatch` per scoring tick.

Rows are GPUs in a canonical order (node name, then GPU index), so a live stream and
a replay of the same telemetry produce the same matrix row for row. Models score the
per-GPU matrix, or the per-node one from :meth:`FeatureBatch.by_node`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pipeline.features import FEATURE_NAMES


@dataclass
class FeatureBatch:
    """Features of every GPU scored at one tick.

    ``x[i]`` holds the features of GPU ``gpu[i]`` on node ``node[i]`` at telemetry time
    ``ts`` (the tick end); columns are :data:`pipeline.features.FEATURE_NAMES`.
    """

    ts: float
    node: np.ndarray            # object array of node names (R,)
    gpu: np.ndarray             # int16 (R,)
    x: np.ndarray               # float32 (R, len(names))
    names: tuple[str, ...] = field(default=FEATURE_NAMES)

    def __len__(self) -> int:
        return len(self.gpu)

    def column(self, name: str) -> np.ndarray:
        """One feature column by name."""
        return self.x[:, self.names.index(name)]

    def to_frame(self) -> pd.DataFrame:
        """A DataFrame view (ts, node, gpu, features…) for notebooks, tests and training sets."""
        df = pd.DataFrame(self.x, columns=list(self.names))
        df.insert(0, "gpu", self.gpu)
        df.insert(0, "node", self.node)
        df.insert(0, "ts", self.ts)
        return df

    def by_node(self) -> "NodeFeatureBatch":
        """Per-node matrix: the largest value over the node's GPUs for every column (NaN ignored).

        The max is the worst GPU's value only where larger is worse (rates, counts, throttle
        fractions, the ``*_deficit_vs_peers`` / ``*_excess_vs_peers`` columns). For gauge
        means and slopes (``sm_clock_mhz_mean_*``, ``util_gpu_mean_*``), ``samples_short`` and
        the fleet z-scores, lower can be worse, and the max is simply the highest GPU's value.
        Node-level columns (``net_*``, ``node_*``) are equal on every GPU of a node, so the max
        is the node's own value for those.
        """
        if len(self) == 0:
            return NodeFeatureBatch(self.ts, np.zeros(0, object), np.zeros((0, len(self.names)), np.float32), self.names)
        # rows are grouped by node already (canonical order)
        starts = np.flatnonzero(np.r_[True, self.node[1:] != self.node[:-1]])
        with np.errstate(invalid="ignore"):
            x = np.fmax.reduceat(self.x, starts, axis=0)
        return NodeFeatureBatch(self.ts, self.node[starts], x, self.names)


@dataclass
class NodeFeatureBatch:
    """Features per node at one tick: ``x[i]`` belongs to ``node[i]``."""

    ts: float
    node: np.ndarray            # object array (N,)
    x: np.ndarray               # float32 (N, len(names))
    names: tuple[str, ...] = field(default=FEATURE_NAMES)

    def __len__(self) -> int:
        return len(self.node)

    def column(self, name: str) -> np.ndarray:
        return self.x[:, self.names.index(name)]
