"""The gpu.scores message: a tick of node scores survives the round trip, and what cannot be read says why."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from collector.schema import Action, FollowUp
from models.base import class_index
from models.node_scores import NodeScores
from models.score_wire import ScoresFormatError, decode_scores, encode_scores, explain_from


def tick() -> NodeScores:
    idx = np.arange(3)
    return NodeScores(1234.5, np.array(["a", "b", "c"], object), np.array([0.1, 0.95, 0.0]),
                      np.array([class_index("nvlink"), class_index("hbm_ecc"), 0], np.int8), np.array([1, 7, 0]), idx,
                      np.array([-1, 2, -1]), np.array([-1, 7, -1]), idx, np.array([0, class_index("hbm_ecc"), 0], np.int8),
                      np.array([None, Action.DRAIN, None], object),
                      np.array([None, FollowUp.RESET_WHEN_IDLE, None], object), np.array([0.5, 0.99999, 0.2]), idx,
                      np.array([3, 7, 0]), sbe_now=np.array([False, True, False]),
                      rule_vetoed=np.array([True, False, False]))


def test_a_tick_of_scores_and_its_reasons_survive_the_round_trip():
    ns = tick()
    raw = encode_scores(ns, {"b": {"rule": "row remap pending"}}, worker="w1", rule_names=["x", "y", "remap"])
    back, reasons, msg = decode_scores(raw)
    for f in ("node", "p_fail", "fault", "gpu", "rule", "rule_gpu", "rule_fault", "rule_action", "rule_follow_up",
              "anomaly", "anomaly_gpu", "sbe_now", "rule_vetoed"):
        assert list(getattr(back, f)) == list(getattr(ns, f)), f
    assert back.ts == 1234.5 and msg["worker"] == "w1" and msg["rule_name"] == [None, "remap", None]
    explain = explain_from(back, reasons)
    assert explain(1, "rule") == "row remap pending"
    # a node the worker did not explain (a shadow policy may act on it) is told by its scores
    assert explain(0, "model") == "nvlink failure risk 10% on GPU 1 (the scorer explained no feature of this node)"
    assert explain(1, "anomaly").startswith("anomaly on GPU 7 (stranger than 99.999% of healthy GPUs)")
    assert explain(1, "model").startswith("hbm_ecc failure risk 95% on GPU 7")


@pytest.mark.parametrize("raw, message", [
    (b"{", "not JSON"),
    (b'{"schema": "other"}', "not a gpuops.scores"),
    (orjson.dumps({"schema": "gpuops.scores", "v": 99}), "version 99"),
    (orjson.dumps({"schema": "gpuops.scores", "v": 1, "ts": 1, "node": ["a"], "p_fail": []}), "p_fail"),
    (orjson.dumps({"schema": "gpuops.scores", "v": 1, "ts": 1}), "malformed"),
])
def test_an_unreadable_scores_message_says_why(raw, message):
    with pytest.raises(ScoresFormatError, match=message):
        decode_scores(raw)


def test_scores_from_a_scorer_that_knows_no_vetoes_read_as_none_and_a_short_column_is_refused():
    from dataclasses import replace

    back, _, _ = decode_scores(encode_scores(replace(tick(), rule_vetoed=None)))
    assert back.rule_vetoed is None and not back.has_vetoed_rule(0)
    msg = orjson.loads(encode_scores(tick()))
    msg["rule_vetoed"] = [True]
    with pytest.raises(ScoresFormatError, match="rule_vetoed"):
        decode_scores(orjson.dumps(msg))


def test_the_predicted_gpus_pcie_rate_survives_the_round_trip_with_a_missing_counter_as_nan():
    from dataclasses import replace

    ns = replace(tick(), pcie_per_min=np.array([3.9, np.nan, 40.0]))
    back, _, msg = decode_scores(encode_scores(ns))
    assert msg["pcie_per_min"] == [3.9, None, 40.0]
    assert back.pcie_per_min[0] == 3.9 and np.isnan(back.pcie_per_min[1]) and back.pcie_per_min[2] == 40.0
    assert decode_scores(encode_scores(tick()))[0].pcie_per_min is None  # a scorer that sends none: no gate


def test_whether_the_predicted_gpu_was_read_survives_the_round_trip():
    from dataclasses import replace

    back, _, msg = decode_scores(encode_scores(replace(tick(), fresh=np.array([True, False, True]))))
    assert msg["fresh"] == [True, False, True] and back.fresh.tolist() == [True, False, True]
    older = decode_scores(encode_scores(tick()))[0]       # a scorer that sends none: every node fresh
    assert older.fresh is None and older.is_fresh(1)
    msg["fresh"] = [True]
    with pytest.raises(ScoresFormatError, match="fresh"):
        decode_scores(orjson.dumps(msg))


def test_how_many_gpus_a_node_has_lost_and_reading_survives_the_round_trip():
    from dataclasses import replace

    sent = replace(tick(), gpus_lost=np.array([0, 2, 0]), gpus_reading=np.array([8, 6, 4]))
    back, _, msg = decode_scores(encode_scores(sent))
    assert msg["gpus_lost"] == [0, 2, 0] and back.gpus_lost.tolist() == [0, 2, 0] and back.lost_gpus(1) == 2
    assert msg["gpus_reading"] == [8, 6, 4] and back.reading_gpus(2) == 4
    older = decode_scores(encode_scores(tick()))[0]       # a scorer that sends none: nothing known
    assert older.gpus_lost is None and older.lost_gpus(1) == 0 and older.reading_gpus(1) is None
    for c in ("gpus_lost", "gpus_reading"):
        short = dict(msg, **{c: [0]})
        with pytest.raises(ScoresFormatError, match=c):
            decode_scores(orjson.dumps(short))


@pytest.mark.parametrize("column, sent, wire", [
    ("sbe_of_peak", [0.41234, np.nan, 1.0], [0.4123, None, 1.0]),   # the storm's rate against its peak
    ("sbe_growth", [1.23456, np.nan, 30.0], [1.235, None, 30.0]),    # ... against its own hour before
])
def test_the_predicted_gpus_storm_readings_survive_the_round_trip_with_unknown_as_nan(column, sent, wire):
    from dataclasses import replace

    ns = replace(tick(), **{column: np.array(sent)})
    back, _, msg = decode_scores(encode_scores(ns))
    assert msg[column] == wire
    got = getattr(back, column)
    assert got[0] == wire[0] and np.isnan(got[1]) and got[2] == wire[2]
    assert getattr(decode_scores(encode_scores(tick()))[0], column) is None  # an older scorer sends none
    msg[column] = [1.0]
    with pytest.raises(ScoresFormatError, match=column):
        decode_scores(orjson.dumps(msg))


def test_the_signals_a_node_does_not_send_travel_by_name_and_unknown_names_are_left_out():
    from dataclasses import replace

    from models.coverage import bits_of

    sent = replace(tick(), blind=np.array([0, bits_of(["ecc", "nvlink"]), bits_of(["ib_ports"])]))
    back, _, msg = decode_scores(encode_scores(sent))
    assert msg["blind"] == [[], ["ecc", "nvlink"], ["ib_ports"]]
    assert [back.blind_signals(i) for i in range(3)] == [[], ["ecc", "nvlink"], ["ib_ports"]]
    newer = dict(msg, blind=[[], ["ecc", "laser_alignment"], []])   # a newer scorer's signal: the known ones read
    assert decode_scores(orjson.dumps(newer))[0].blind_signals(1) == ["ecc"]
    assert decode_scores(encode_scores(tick()))[0].blind is None      # an older scorer says nothing
    for bad in ([[]], [[], "ecc", []]):
        with pytest.raises(ScoresFormatError, match="blind"):
            decode_scores(orjson.dumps(dict(msg, blind=bad)))
