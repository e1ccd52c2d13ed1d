"""The ``gpu.scores`` message: one scoring worker's node scores for one tick, with their reasons.

Scoring workers (many, one per partition group) publish; the engine leader and every API
replica consume. A message carries one :class:`~models.node_scores.NodeScores` column-wise
(compact, and decoded straight into arrays), the rule names, and reasons for the nodes
worth one (the worker has the features; the engine does not), so the engine's ``explain``
reads the text the replay would have produced. Versioned like ``collector.wire``: a
consumer refuses a schema or version it does not know with :class:`ScoresFormatError`
(the caller dead-letters it); fields a newer producer adds are ignored.

``cold`` (optional, one flag per node) marks nodes whose window is still filling on the
worker that scored them (they arrived there with no history, e.g. after a rebalance): the
policy lets their predictions alert but never act (docs/scaling.md, "Rebalance"). ``blind``
(optional, a list of signal names per node) names the precursor signals a node does not send
(:mod:`models.coverage`), by name so that a consumer of another version reads the ones it knows.

Feature-row indexes (``row``, ``rule_row``, ``anomaly_row``) mean nothing outside the
worker and travel as the node's own position.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import orjson

from collector.schema import Action, FollowUp

from .base import CLASSES
from .coverage import bits_of, names_of
from .explain import anomaly_phrase, risk_phrase
from .node_scores import NodeScores

_INDEX = {c: i for i, c in enumerate(CLASSES)}
SCHEMA = "gpuops.scores"
VERSION = 1
#: reasons: node -> {"rule" | "model" | "anomaly": text}
Reasons = Mapping[str, Mapping[str, str]]


class ScoresFormatError(ValueError):
    """A ``gpu.scores`` message this version cannot read (permanent: dead-letter it)."""


def encode_scores(ns: NodeScores, reasons: Reasons | None = None, *, worker: str = "",
                  rule_names: list[str] | None = None, extra: Mapping[str, Any] | None = None) -> bytes:
    """One message for one tick of *ns* (``extra``: additive fields, e.g. per-node detail)."""
    rule = ns.rule.astype(int)
    msg: dict[str, Any] = {
        "schema": SCHEMA, "v": VERSION, "ts": float(ns.ts), "worker": worker,
        "node": [str(n) for n in ns.node],
        "p_fail": np.round(ns.p_fail.astype(float), 5).tolist(),
        "fault": [CLASSES[int(f)] for f in ns.fault],
        "gpu": ns.gpu.astype(int).tolist(),
        "rule": rule.tolist(),
        "rule_name": [rule_names[r] if rule_names and r >= 0 else None for r in rule],
        "rule_gpu": ns.rule_gpu.astype(int).tolist(),
        "rule_fault": [CLASSES[int(f)] for f in ns.rule_fault],
        "rule_action": [a.value if a is not None else None for a in ns.rule_action],
        "rule_follow_up": [f.value if f is not None else None for f in ns.rule_follow_up],
        "anomaly": np.round(ns.anomaly.astype(float), 7).tolist(),
        "anomaly_gpu": None if ns.anomaly_gpu is None else ns.anomaly_gpu.astype(int).tolist(),
        "sbe_now": None if ns.sbe_now is None else ns.sbe_now.astype(bool).tolist(),
        "reasons": {k: dict(v) for k, v in (reasons or {}).items()},
    }
    for c in ("cold", "rule_vetoed", "fresh"):  # optional flags: absent when the scorer knows none
        v = getattr(ns, c)
        if v is not None:
            msg[c] = np.asarray(v, bool).tolist()
    for c, nd in (("pcie_per_min", 3), ("sbe_of_peak", 4), ("sbe_growth", 3)):  # NaN (not known) as null
        v = getattr(ns, c)
        if v is not None:
            msg[c] = [None if x != x else x for x in np.round(v.astype(float), nd).tolist()]
    for c in ("gpus_lost", "gpus_reading"):  # optional counts: absent when the scorer knows none
        v = getattr(ns, c)
        if v is not None:
            msg[c] = np.asarray(v, int).tolist()
    if ns.blind is not None:  # the precursor signals each node does not send, by name (models.coverage)
        msg["blind"] = [names_of(int(b)) for b in ns.blind]
    if extra:
        msg.update({k: v for k, v in extra.items() if k not in msg})
    return orjson.dumps(msg)


def decode_scores(raw: bytes | Mapping[str, Any]) -> tuple[NodeScores, dict[str, dict[str, str]], dict[str, Any]]:
    """(scores, reasons, the whole message) from one message; :class:`ScoresFormatError` if unreadable."""
    try:
        m = orjson.loads(raw) if isinstance(raw, (bytes, bytearray, memoryview, str)) else dict(raw)
    except orjson.JSONDecodeError as e:
        raise ScoresFormatError(f"not JSON: {e}") from None
    if not isinstance(m, dict) or m.get("schema") != SCHEMA:
        raise ScoresFormatError(f"not a {SCHEMA} message (schema {m.get('schema') if isinstance(m, dict) else None!r})")
    if m.get("v") != VERSION:
        raise ScoresFormatError(f"{SCHEMA} version {m.get('v')!r} is not supported (this build reads {VERSION})")
    try:
        n = len(m["node"])
        cols = ("p_fail", "fault", "gpu", "rule", "rule_gpu", "rule_fault", "rule_action", "rule_follow_up", "anomaly")
        for c in cols:
            if len(m[c]) != n:
                raise ScoresFormatError(f"column {c!r} has {len(m[c])} values for {n} nodes")
        idx = np.arange(n)
        ns = NodeScores(
            float(m["ts"]), np.array(m["node"], object), np.array(m["p_fail"], float),
            np.array([_INDEX[f] for f in m["fault"]], np.int8), np.array(m["gpu"], int), idx,
            np.array(m["rule"], int), np.array(m["rule_gpu"], int), idx,
            np.array([_INDEX[f] for f in m["rule_fault"]], np.int8),
            np.array([Action(a) if a is not None else None for a in m["rule_action"]], object),
            np.array([FollowUp(f) if f is not None else None for f in m["rule_follow_up"]], object),
            np.array(m["anomaly"], float), idx,
            None if m.get("anomaly_gpu") is None else np.array(m["anomaly_gpu"], int),
            cold=_bools(m.get("cold")), sbe_now=_bools(m.get("sbe_now")),
            pcie_per_min=_floats(m.get("pcie_per_min")), sbe_of_peak=_floats(m.get("sbe_of_peak")),
            rule_vetoed=_bools(m.get("rule_vetoed")), sbe_growth=_floats(m.get("sbe_growth")),
            fresh=_bools(m.get("fresh")),
            gpus_lost=_ints(m.get("gpus_lost")), gpus_reading=_ints(m.get("gpus_reading")),
            blind=_signals(m.get("blind")))
        # optional: absent (an older scorer) is None, never short
        for c in ("cold", "pcie_per_min", "sbe_of_peak", "rule_vetoed", "sbe_growth", "fresh", "gpus_lost",
                  "gpus_reading", "blind"):
            v = getattr(ns, c)
            if v is not None and len(v) != n:
                raise ScoresFormatError(f"column {c!r} has {len(v)} values for {n} nodes")
    except ScoresFormatError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise ScoresFormatError(f"malformed {SCHEMA} message: {type(e).__name__}: {e}") from None
    reasons = m.get("reasons") or {}
    if not isinstance(reasons, dict):
        raise ScoresFormatError("reasons must be a mapping of node -> {source: text}")
    return ns, reasons, m


def explain_from(ns: NodeScores, reasons: Reasons):
    """The policy's ``explain(i, source)`` reading the reasons a worker shipped. A worker explains only the
    nodes worth it on its own policy's reading; another policy (a shadow) may act on one it did not, which
    is then told by its scores."""
    def explain(i: int, source: str) -> str:
        why = reasons.get(str(ns.node[i]), {}).get(source)
        return why if why else _from_scores(ns, i, source)
    return explain


def _from_scores(ns: NodeScores, i: int, source: str) -> str:
    """A reason from the scores alone, for a node the worker did not explain."""
    none = " (the scorer explained no feature of this node)"
    if source == "model":
        return risk_phrase(CLASSES[int(ns.fault[i])], ns.p_fail[i], ns.gpu[i]) + none
    if source == "anomaly":
        return anomaly_phrase(None if ns.anomaly_gpu is None else ns.anomaly_gpu[i], ns.anomaly[i]) + none
    if source == "rule" and ns.rule[i] >= 0:
        fault = ns.rule_fault_class(i)
        where = f"GPU {ns.rule_gpu[i]}" if ns.rule_gpu[i] >= 0 else "the node"
        return f"rule {ns.rule[i]} ({fault.value if fault else 'unknown'}) fired on {where}{none}"
    return f"{source}{none}"


def _bools(values: list | None) -> np.ndarray | None:
    """An optional flag column: None when absent (an older scorer)."""
    return None if values is None else np.array(values, bool)


def _ints(values: list | None) -> np.ndarray | None:
    """An optional count column: None when absent (an older scorer)."""
    return None if values is None else np.array(values, int)


def _signals(values: list | None) -> np.ndarray | None:
    """The optional ``blind`` column (a list of signal names per node) as bit masks: None when absent (an older
    scorer); a name this build does not know is left out (a newer scorer's)."""
    if values is None:
        return None
    if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in values):
        raise ScoresFormatError("blind must hold a list of signal names per node")
    return np.array([bits_of(v) for v in values], np.int64)


def _floats(values: list | None) -> np.ndarray | None:
    """An optional number column: None when absent (an older scorer), null as NaN (not known)."""
    return None if values is None else np.array([np.nan if v is None else v for v in values], float)
