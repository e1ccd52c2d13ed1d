"""Vectorised group statistics: median per group, robust z-score against the fleet.

Used for peer deviation (a GPU against the median of its node's GPUs) and node-vs-fleet
robust z-scores (median and MAD over nodes). Several gauges are done at once, rows of a
2-D array, each statistic in one sort; no Python loop per node or gauge.

A median is over the finite values only (NaN when there are none): the mean of the two
middle values of the sorted finite values, ``0.5 * (v[(m - 1) // 2] + v[m // 2])``.
"""

from __future__ import annotations

import numpy as np

#: MAD → standard deviation for a normal distribution.
MAD_TO_SIGMA = 1.4826


def group_medians(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Median of the finite values of each group ``0..n_groups-1``, for every row of *values*
    (rows × items; the same *groups* for all rows): (rows, n_groups), NaN for a group with no
    finite value. One sort of a (row, group, largest group) block padded with NaN (NaN sorts
    last, after ±inf, so the finite values of a group are its first ``m``, in order)."""
    rows, n = values.shape
    if n == 0:
        return np.full((rows, n_groups), np.nan)
    order = np.argsort(groups, kind="stable")
    g = groups[order]
    size = np.bincount(groups, minlength=n_groups)
    block = np.full((rows, n_groups, int(size.max())), np.nan)
    block[:, g, np.arange(n) - (np.cumsum(size) - size)[g]] = values[:, order]
    m = np.isfinite(block).sum(axis=2)
    block.sort(axis=2)
    lo = np.take_along_axis(block, np.maximum(m - 1, 0)[..., None] // 2, axis=2)[..., 0]
    hi = np.take_along_axis(block, (m // 2)[..., None], axis=2)[..., 0]
    return np.where(m > 0, 0.5 * (lo + hi), np.nan)


def row_medians(values: np.ndarray) -> np.ndarray:
    """Median of the finite values of every row of a 2-D array (NaN for a row with none)."""
    v = np.sort(np.where(np.isfinite(values), values, np.nan), axis=1)  # finite first, in order
    m = np.isfinite(values).sum(axis=1)
    rows = np.arange(len(v))
    out = 0.5 * (v[rows, np.maximum(m - 1, 0) // 2] + v[rows, m // 2 - (m == 0)])
    out[m == 0] = np.nan
    return out


def robust_z_rows(values: np.ndarray, floors: np.ndarray) -> np.ndarray:
    """(x − median) / max(1.4826·MAD, floor) over the finite values of each row of *values*,
    with the row's own *floor* (one per row, in the values' unit): the floor keeps a fleet
    where every node reads the same from turning a 1-unit difference into an infinite score."""
    med = row_medians(values)
    mad = row_medians(np.abs(values - med[:, None]))
    scale = np.where(np.isfinite(mad), np.maximum(MAD_TO_SIGMA * mad, floors), floors)
    return (values - med[:, None]) / scale[:, None]
