"""The API's fleet view: latest row per node, state from risk/held/stale, history, and a prepared list body."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import orjson

from api.nodeview import NodeView
from tests.remediation.test_engine import fleet


def test_the_list_body_is_prepared_per_update_and_states_follow_risk_holds_and_silence():
    v = NodeView(history_points=3)
    assert orjson.loads(v.list_body()) == {"nodes": [], "count": 0, "ts": None}
    v.update(fleet(3, 100.0, rule_nodes=[1], p=[0.0, 0.0, 0.5]), {"n00001": {"rule": "XID 79"}})
    body = v.list_body()
    assert [(r["node"], r["state"]) for r in orjson.loads(body)["nodes"]] == [
        ("n00000", "ok"), ("n00001", "at_risk"), ("n00002", "at_risk")]
    assert v.list_body() is body                       # rendered once, not per read
    v.set_held(["n00001"])
    v.mark_stale(["n00000"])
    assert {r["node"]: r["state"] for r in orjson.loads(v.list_body())["nodes"]} == {
        "n00000": "unknown", "n00001": "held", "n00002": "at_risk"}
    for t in (160.0, 220.0, 280.0):
        v.update(fleet(3, t))
    one = v.get("n00001")
    assert [h["ts"] for h in one["history"]] == [160.0, 220.0, 280.0] and one["state"] == "held"
    assert v.get("n00000")["state"] == "ok" and v.get("nope") is None   # it reported again
    v.add_events([{"node": "n00002", "kind": "xid", "xid": 79}, {"kind": "no node"}])
    assert v.get("n00002")["events"] == [{"node": "n00002", "kind": "xid", "xid": 79}]


def test_a_node_s_row_keeps_its_gpu_counts_for_the_hold_page_and_none_from_a_scorer_without_them():
    v = NodeView()
    v.update(fleet(2, 100.0))
    assert (v.get("n00000")["gpus_reading"], v.get("n00000")["gpus_lost"]) == (None, None)
    v.update(replace(fleet(2, 160.0), gpus_reading=np.array([7, 8]), gpus_lost=np.array([1, 0])))
    assert [(v.get(n)["gpus_reading"], v.get(n)["gpus_lost"]) for n in ("n00000", "n00001")] == [(7, 1), (8, 0)]
    assert "gpus_lost" not in orjson.loads(v.list_body())["nodes"][0]     # the list keeps its columns
