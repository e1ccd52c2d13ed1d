"""Reasons a person can read for one tick's node scores: the replay's and the live scorer's.

:class:`Explainer` is built once per model bundle; :meth:`Explainer.for_tick` gives the
``explain(node index, source)`` callback that :func:`remediation.policy.decide` calls for
the few nodes it decides on. The live scoring workers, which do not run the policy, call
:meth:`Explainer.reasons` for the nodes worth a reason and ship the text with the scores
(``gpu.scores``), so the engine explains from the same features the replay would.
"""

from __future__ import annotations

from typing import Callable, Iterable

from models.base import CLASSES
from models.bundle import ModelBundle
from models.explain import anomaly_phrase, baselines_for, describe, most_deviant, outside_healthy, risk_phrase
from models.node_scores import NodeScores
from pipeline.batch import FeatureBatch

#: explain(node index, source) -> reason; source is "rule", "model" or "anomaly"
Explain = Callable[[int, str], str]
SOURCES = ("rule", "model", "anomaly")


class Explainer:
    """Turns a tick's features and node scores into reasons (see the module docstring)."""

    def __init__(self, bundle: ModelBundle) -> None:
        self.bundle = bundle
        # where explanations take each feature's reference from (the part's own, else the healthy
        # fleet's); each learned detector reads its own inputs (models/inputs.py): explanations index those
        c, a = bundle.classifier, bundle.anomaly
        healthy_q = c.healthy_q if c is not None else None
        self.baselines = baselines_for(c.inputs if c is not None else bundle.feature_names, healthy_q)
        self.anomaly_baselines = None
        if a is not None:  # the classifier's healthy range indexes the anomaly row only when both read the same
            same = c is not None and c.inputs == a.inputs
            self.anomaly_baselines = baselines_for(a.inputs, healthy_q if same else None, a.cols, a.center)

    def for_tick(self, batch: FeatureBatch, ns: NodeScores) -> Explain:
        bundle = self.bundle

        def explain(i: int, source: str) -> str:
            if source == "rule":
                return bundle.rules.reason(int(ns.rule[i]), batch.x[ns.rule_row[i]])
            if source == "model" and bundle.classifier is not None:
                fault = int(ns.fault[i])
                c = bundle.classifier
                why = outside_healthy(c.inputs, c.explain_features.get(fault, []), c.healthy_q,
                                      c.select(batch.x[ns.row[i]]), self.baselines)
                risk = risk_phrase(CLASSES[fault], ns.p_fail[i], ns.gpu[i])
                return f"{risk}: {why}" if why else risk
            if source == "anomaly":
                gpu = int(batch.gpu[ns.anomaly_row[i]])
                why = anomaly_phrase(gpu, ns.anomaly[i])
                a = bundle.anomaly
                if a is None or a.center is None:
                    return why
                row = a.select(batch.x[ns.anomaly_row[i]])
                f = most_deviant(a.center, a.scale, a.cols, row)
                return why if f is None else f"{why}: most off {describe(a.inputs, f, row, self.anomaly_baselines)}"
            return ""

        return explain

    def reasons(self, batch: FeatureBatch, ns: NodeScores, nodes: Iterable[int]) -> dict[str, dict[str, str]]:
        """node name -> {source: reason} for the node indexes given (the ones worth explaining)."""
        explain = self.for_tick(batch, ns)
        out: dict[str, dict[str, str]] = {}
        for i in nodes:
            r = {}
            if ns.rule[i] >= 0:
                r["rule"] = explain(i, "rule")
            r["model"] = explain(i, "model")
            r["anomaly"] = explain(i, "anomaly")
            out[str(ns.node[i])] = {k: v for k, v in r.items() if v}
        return out
