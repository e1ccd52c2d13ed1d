"""Compiled evaluation of the trained tree ensembles: the same numbers as scikit-learn.

Scoring every GPU every tick is a quarter of a replay's CPU, and almost all of it is tree
traversal: scikit-learn walks one tree at a time, one row at a time, taking a
data-dependent branch at every node (~40 ns per tree and row here, mostly
mispredicted branches). Two kernels, compiled once per machine by numba (cached beside
this file), give bit-for-bit the same outputs:

* :class:`BoostedTrees` (gradient boosting, every tree ≤ 32 leaves) uses QuickScorer
  (Lucchese et al., SIGIR 2015): for a block of rows held feature-major, *every* split
  of a tree is tested with branch-free, vectorised compares, each false test clears
  the bits of the leaves it rules out, and the exit leaf is the lowest bit left.
* :class:`IsolationTrees` (deep isolation trees) walks a block of 64 rows, held
  feature-major so every load of a level stays in L1, down one tree
  level by level, with children stored side by side so ``next = left + went_right``
  has no branch, and many independent rows in flight hide the memory latency. Each
  node is one 8-byte record (its left child and feature packed in one int32, then its
  threshold), so a step touches one cache line, not three, and a tree's walk stops
  once every row of the block is on a leaf. On the shipped forest's real rows, most of
  which end on shallow leaves, scikit-learn 1.9's row-at-a-time walk is now ~15 %
  faster (bench/results/scoring.md); on rows spread over the forest this walk is.

Thresholds become float32 rounded *down*: for a float32 value ``x`` and a float64
threshold ``t``, ``x > t`` exactly when ``x > t32`` — so the comparisons are the ones
scikit-learn makes and the sums are added in its order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
from scipy.special import expit

#: rows per block of the boosted-trees kernel: a feature's row of the block (1 KiB) and the
#: block's leaf bits stay in L1 while all the splits on it are tested (256 rows took 0.76x
#: the CPU of 4,096 on the shipped classifier: bench/results/scoring.md)
BLOCK_ROWS = 256
_ALL = np.uint32(0xFFFFFFFF)
#: index of the lowest set bit of every 16-bit value
_CTZ16 = np.array([((v & -v).bit_length() - 1) if v else 0 for v in range(1 << 16)], np.int8)


def _threshold32(t: np.ndarray) -> np.ndarray:
    """Largest float32 ≤ each float64 threshold (``x > t`` ⇔ ``x > t32`` for float32 ``x``)."""
    t32 = t.astype(np.float32)
    up = t32.astype(np.float64) > t
    t32[up] = np.nextafter(t32[up], np.float32(-np.inf))
    return t32


# ---------------------------------------------------------------- gradient boosting


@numba.njit(nogil=True, cache=True)
def _quickscorer(x, feat, thr, mask, mright, tree_start, tree_out, leaf_val, leaf_start, ctz16, out):  # pragma: no cover
    n, n_feat = x.shape
    block = min(n, BLOCK_ROWS)
    xt = np.empty((n_feat, block), np.float32)
    bits = np.empty(block, np.uint32)
    for s in range(0, n, block):
        m = min(n, s + block) - s
        for i in range(m):
            for f in range(n_feat):
                xt[f, i] = x[s + i, f]
        for t in range(tree_start.shape[0] - 1):
            bits[:m] = 0xFFFFFFFF
            for j in range(tree_start[t], tree_start[t + 1]):
                row = xt[feat[j]]
                th = thr[j]
                mk = mask[j]
                mr = mright[j]
                for i in range(m):
                    v = row[i]
                    right = (v > th) | (mr & (v != v))
                    bits[i] = bits[i] & (mk if right else np.uint32(0xFFFFFFFF))
            base = leaf_start[t]
            k = tree_out[t]
            for i in range(m):
                b = bits[i]
                lo = b & 0xFFFF
                idx = ctz16[lo] if lo != 0 else 16 + ctz16[b >> 16]
                out[s + i, k] += leaf_val[base + idx]


@dataclass
class BoostedTrees:
    """A fitted ``HistGradientBoosting*`` model's trees as QuickScorer tables."""

    n_outputs: int
    baseline: np.ndarray     # (K,) raw score before any tree
    feat: np.ndarray         # per split: feature index
    thr: np.ndarray          # per split: float32 threshold (rounded down)
    mask: np.ndarray         # per split: leaf bits kept when the row goes right
    mright: np.ndarray       # per split: missing values go right
    tree_start: np.ndarray   # (T+1,) first split of each tree
    tree_out: np.ndarray     # (T,) output (class) each tree adds to
    leaf_val: np.ndarray     # leaf values, left to right within each tree
    leaf_start: np.ndarray   # (T+1,) first leaf of each tree

    @classmethod
    def from_sklearn(cls, model) -> "BoostedTrees":
        """Tables for a fitted HistGradientBoostingClassifier/Regressor (numeric features)."""
        if getattr(model, "is_categorical_", None) is not None and np.any(model.is_categorical_):
            raise ValueError("categorical features are not supported")
        feat, thr, mask, mright, tree_start, tree_out, leaf_val, leaf_start = [], [], [], [], [0], [], [], [0]
        for predictors in model._predictors:
            for k, pred in enumerate(predictors):
                f, t, mk, mr, leaves = _quickscorer_tree(pred.nodes)
                feat += f
                thr += t
                mask += mk
                mright += mr
                tree_start.append(len(feat))
                tree_out.append(k)
                leaf_val += leaves
                leaf_start.append(len(leaf_val))
        return cls(len(model._predictors[0]), np.asarray(model._baseline_prediction, np.float64).ravel(),
                   np.array(feat, np.int32), _threshold32(np.array(thr, np.float64)),
                   np.array(mask, np.uint32), np.array(mright, np.bool_), np.array(tree_start, np.int64),
                   np.array(tree_out, np.int64), np.array(leaf_val, np.float64), np.array(leaf_start, np.int64))

    def raw(self, x: np.ndarray) -> np.ndarray:
        """Raw scores (n, K): exactly ``model._raw_predict(x)`` for float32 *x*."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((len(x), self.n_outputs))
        out[:] = self.baseline
        if len(x):
            _quickscorer(x, self.feat, self.thr, self.mask, self.mright, self.tree_start, self.tree_out,
                         self.leaf_val, self.leaf_start, _CTZ16, out)
        return out

    def proba_binary(self, x: np.ndarray) -> np.ndarray:
        """P(class 1) of a binary classifier: ``predict_proba(x)[:, 1]``."""
        return expit(self.raw(x)[:, 0])

    def predict_class(self, x: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """``predict(x)`` of a classifier with these ``classes_``."""
        raw = self.raw(x)
        if self.n_outputs == 1:
            return classes[(expit(raw[:, 0]) > 0.5).astype(int)]
        return classes[np.argmax(raw, axis=1)]


def _quickscorer_tree(nodes: np.ndarray) -> tuple[list, list, list, list, list]:
    """One tree's splits (feature, threshold, leaf mask, missing-right) and its leaf values
    numbered left to right."""
    leaf = nodes["is_leaf"].astype(bool)
    left, right = nodes["left"].astype(int), nodes["right"].astype(int)
    leaves: list[int] = []
    splits: list[tuple[int, list[int]]] = []

    def walk(o: int) -> list[int]:
        if leaf[o]:
            leaves.append(o)
            return [len(leaves) - 1]
        lo = walk(left[o])
        hi = walk(right[o])
        splits.append((o, lo))
        return lo + hi

    walk(0)
    if len(leaves) > 32:
        raise ValueError(f"a tree has {len(leaves)} leaves; the compiled scorer handles at most 32")
    f, t, mk, mr = [], [], [], []
    for o, left_leaves in splits:
        keep = 0xFFFFFFFF
        for j in left_leaves:
            keep &= ~(1 << j)
        f.append(int(nodes["feature_idx"][o]))
        t.append(float(nodes["num_threshold"][o]))
        mk.append(keep & 0xFFFFFFFF)
        mr.append(not bool(nodes["missing_go_to_left"][o]))
    return f, t, mk, mr, [float(nodes["value"][o]) for o in leaves]


# ---------------------------------------------------------------- isolation forest


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _walk_levels(x, node, node_thr, shift, leaf_val, depth, root, out):  # pragma: no cover
    n, n_feat = x.shape
    block = 64
    xt = np.empty(n_feat * block, np.float32)  # the block feature-major: a level's loads stay in L1
    k = np.empty(block, np.int32)
    k_next = np.empty(block, np.int32)
    fmask = np.int32((1 << shift) - 1)
    for s in range(0, n, block):
        m = min(n, s + block) - s
        for i in range(m):
            for f in range(n_feat):
                xt[f * block + i] = x[s + i, f]
        for t in range(root.shape[0]):
            r = root[t]
            for i in range(m):
                k[i] = r
            for _ in range(depth[t]):
                moved = np.int32(0)
                for i in range(m):
                    kk = k[i]
                    lf = node[2 * kk]  # left child << shift | feature; the threshold is the next int32
                    nk = (lf >> shift) + np.int32(xt[(lf & fmask) * block + i] > node_thr[2 * kk + 1])
                    k_next[i] = nk
                    moved |= nk ^ kk
                k, k_next = k_next, k
                if moved == 0:  # every row of the block is at a leaf (a split always moves a row)
                    break
            for i in range(m):
                out[s + i] += leaf_val[k[i]]


@dataclass
class IsolationTrees:
    """A fitted ``IsolationForest``'s trees, children side by side, leaves looping on themselves."""

    #: per node, two int32: its left child (right child = left + 1; a leaf points at itself)
    #: shifted left by *shift* bits, or-ed with its feature index (into the forest's input
    #: columns); then the bits of its float32 threshold, rounded down (+inf at leaves)
    node: np.ndarray
    shift: int
    leaf_val: np.ndarray  # per node: path length credited at a leaf (depth + c(n) - 1)
    depth: np.ndarray     # (T,) levels to walk in each tree
    root: np.ndarray      # (T,) root node of each tree
    denominator: float    # trees x c(max_samples)

    @classmethod
    def from_sklearn(cls, forest) -> "IsolationTrees":
        from sklearn.ensemble._iforest import _average_path_length

        feat, thr, left, leaf_val, depth, root = [], [], [], [], [], []
        off = 0
        for est, cols, dpl, apl in zip(forest.estimators_, forest.estimators_features_,
                                       forest._decision_path_lengths, forest._average_path_length_per_tree):
            tr = est.tree_
            cl, cr = tr.children_left, tr.children_right
            order, new = [0], {0: 0}
            for o in order:  # breadth first: the children of a split get consecutive ids
                if cl[o] != -1:
                    for c in (cl[o], cr[o]):
                        new[int(c)] = len(order)
                        order.append(int(c))
            old = np.array(order)
            is_leaf = cl[old] == -1
            f = np.asarray(cols)[np.where(is_leaf, 0, tr.feature[old])]
            lk = np.where(is_leaf, np.arange(len(old)), [new.get(int(c), 0) for c in cl[old]]) + off
            feat.append(f)
            thr.append(np.where(is_leaf, np.inf, tr.threshold[old]))
            left.append(lk)
            leaf_val.append(dpl[old] + apl[old] - 1.0)  # sklearn's sum, element by element
            depth.append(int(tr.max_depth))
            root.append(off)
            off += len(old)
        feat32, thr32, left32 = (np.concatenate(feat).astype(np.int32), _threshold32(np.concatenate(thr)),
                                 np.concatenate(left).astype(np.int32))
        shift = max(int(forest.n_features_in_) - 1, 1).bit_length()
        if off >= 1 << (31 - shift):
            raise ValueError(f"{off} nodes of {forest.n_features_in_} features do not pack in 31 bits")
        node = np.empty(2 * off, np.int32)
        node[0::2] = (left32 << shift) | feat32
        node[1::2] = thr32.view(np.int32)
        return cls(node, shift, np.concatenate(leaf_val).astype(np.float64),
                   np.array(depth, np.int32), np.array(root, np.int32),
                   float(len(forest.estimators_) * _average_path_length([forest._max_samples])[0]))

    def score_samples(self, x: np.ndarray) -> np.ndarray:
        """Exactly ``forest.score_samples(x)`` (higher is more normal)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        depths = np.zeros(len(x))
        if len(x):
            _walk_levels(x, self.node, self.node.view(np.float32), self.shift, self.leaf_val, self.depth,
                         self.root, depths)
        if self.denominator == 0:
            return -np.ones(len(x))
        return -(2 ** (-np.divide(depths, self.denominator)))
