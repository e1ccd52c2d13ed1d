"""Vectorised group statistics: median per group, robust z-score against the fleet.

Used for peer deviation (a GPU against the median of its node's GPUs) and node-vs-fleet
robust z-scores (median and MAD over nodes). All groups are done in one sort; no Python
loop per node.
"""

from __future__ import annotations

import numpy as np

#: MAD → standard deviation for a normal distribution.
MAD_TO_SIGMA = 1.4826


def group_median(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Median of the finite *values* of each group ``0..n_groups-1`` (NaN for a group with none)."""
    out = np.full(n_groups, np.nan)
    if len(values) == 0:
        return out
    order = np.lexsort((values, groups))  # NaN sorts last inside each group
    v, g = values[order], groups[order]
    cnt = np.bincount(groups, weights=np.isfinite(values), minlength=n_groups).astype(np.int64)
    start = np.searchsorted(g, np.arange(n_groups))
    has = cnt > 0
    lo = start[has] + (cnt[has] - 1) // 2
    hi = start[has] + cnt[has] // 2
    out[has] = 0.5 * (v[lo] + v[hi])
    return out


def median(values: np.ndarray) -> float:
    """Median of the finite values (NaN when none)."""
    v = np.sort(values[np.isfinite(values)])  # what np.median does, without its overhead
    m = len(v)
    return float(0.5 * (v[(m - 1) // 2] + v[m // 2])) if m else float("nan")


def robust_z(values: np.ndarray, floor: float) -> np.ndarray:
    """(x − median) / max(1.4826·MAD, floor) over the finite values of *values*.

    *floor* (in the values' unit) keeps a fleet where every node reads the same from
    turning a 1-unit difference into an infinite score.
    """
    med = median(values)
    mad = median(np.abs(values - med))
    scale = max(MAD_TO_SIGMA * mad, floor) if np.isfinite(mad) else floor
    return (values - med) / scale


def group_medians(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """:func:`group_median` of every row of *values* (rows × items, the same *groups* for all
    rows): (rows, n_groups). One sort of a (rows, group, largest group) block padded with NaN,
    which sorts last exactly as in :func:`group_median`, so the medians are the same."""
    rows, n = values.shape
    if n == 0:
        return np.full((rows, n_groups), np.nan)
    order = np.argsort(groups, kind="stable")
    g = groups[order]
    size = np.bincount(groups, minlength=n_groups)
    block = np.full((rows, n_groups, int(size.max())), np.nan)
    block[:, g, np.arange(n) - (np.cumsum(size) - size)[g]] = values[:, order]
    cnt = np.isfinite(block).sum(axis=2)
    block.sort(axis=2)
    lo = np.take_along_axis(block, np.maximum(cnt - 1, 0)[..., None] // 2, axis=2)[..., 0]
    hi = np.take_along_axis(block, (cnt // 2)[..., None], axis=2)[..., 0]
    return np.where(cnt > 0, 0.5 * (lo + hi), np.nan)


def row_medians(values: np.ndarray) -> np.ndarray:
    """:func:`median` of every row of a 2-D array (NaN for a row with no finite value)."""
    v = np.sort(np.where(np.isfinite(values), values, np.nan), axis=1)  # NaN (and ±inf masked) last
    m = np.isfinite(values).sum(axis=1)
    rows = np.arange(len(v))
    out = 0.5 * (v[rows, np.maximum(m - 1, 0) // 2] + v[rows, m // 2 - (m == 0)])
    out[m == 0] = np.nan
    return out


def robust_z_rows(values: np.ndarray, floors: np.ndarray) -> np.ndarray:
    """:func:`robust_z` of every row of *values* with its own floor (*floors*, one per row)."""
    med = row_medians(values)
    mad = row_medians(np.abs(values - med[:, None]))
    scale = np.where(np.isfinite(mad), np.maximum(MAD_TO_SIGMA * mad, floors), floors)
    return (values - med[:, None]) / scale[:, None]
