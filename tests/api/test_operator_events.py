"""Operator events (``source=operator``, ``kind=maintenance``): the format is validated, the
pipeline keeps them (and dead-letters a malformed one with its reason), the API shows one on the
timeline of every node it lists, the replay report lists them per node, and the engine turns one
into a silence of actions for its window."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from api.nodeview import NodeView
from api.replay import operator_timeline
from collector.operator_events import OperatorEventError, maintenance_event, maintenance_window
from collector.schema import validate_frame
from collector.wire import TOPIC_EVENTS, TOPIC_TELEMETRY, encode_event
from pipeline.bus import BusMessage
from pipeline.decode import MessageDecoder
from pipeline.registry import Keys
from remediation.actions import ActionKind
from remediation.silences import Mutes
from remediation.store import ActionStore

T0 = 1_760_000_000.0


def _window(**changes):  # noqa: ANN202
    ev = maintenance_event(["gpu-a01", "gpu-a02"], T0, T0 + 7200, "PDU swap, rack a", author="alice")
    return {**ev, **changes}


def test_a_maintenance_event_carries_nodes_start_end_and_reason() -> None:
    w = maintenance_window(_window())
    assert (w.nodes, w.start, w.end, w.reason, w.author) == (("gpu-a01", "gpu-a02"), T0, T0 + 7200,
                                                              "PDU swap, rack a", "alice")
    assert maintenance_window({"source": "kmsg", "kind": "xid"}) is None


@pytest.mark.parametrize("changes, says", [
    ({"nodes": []}, "nodes"), ({"nodes": "gpu-a01"}, "nodes"), ({"nodes": ["bad name"]}, "malformed node"),
    ({"end": T0 - 1}, "after 'start'"), ({"start": "soon"}, "'start'"), ({"reason": " "}, "reason"),
])
def test_a_malformed_maintenance_event_says_what_is_wrong(changes, says) -> None:
    with pytest.raises(OperatorEventError, match=says):
        maintenance_window(_window(**changes))


def _decode(*events) -> object:  # noqa: ANN001
    msgs = [BusMessage(TOPIC_EVENTS, e["node"], encode_event(e), 0, i) for i, e in enumerate(events)]
    return MessageDecoder(Keys(), 8, (TOPIC_TELEMETRY,), (TOPIC_EVENTS,)).decode(msgs)


def test_the_pipeline_keeps_operator_events_and_dead_letters_a_malformed_one() -> None:
    d = _decode(_window(), _window(end=T0 - 1, node="gpu-a03"))
    assert [(e["source"], e["kind"], e["nodes"]) for e in d.events] == [("operator", "maintenance",
                                                                         ["gpu-a01", "gpu-a02"])]
    assert len(d.rejected) == 1 and "'end' must be after 'start'" in d.rejected[0].reason
    assert d.progress[0][2] == T0


def test_the_node_page_shows_a_maintenance_event_on_every_node_it_lists() -> None:
    view = NodeView()
    view.add_events([_window(), {"ts": T0, "node": "gpu-a01", "source": "kmsg", "kind": "xid", "code": 79}])
    assert [e["kind"] for e in view._events["gpu-a01"]] == ["maintenance", "xid"]
    assert [e["reason"] for e in view._events["gpu-a02"]] == ["PDU swap, rack a"]


def test_the_replay_report_lists_operator_events_on_each_nodes_timeline() -> None:
    df = pd.DataFrame([_window(), {"ts": T0, "node": "gpu-a01", "source": "kmsg", "kind": "xid", "code": 79,
                                   "message": "Xid 79"}])
    timeline = operator_timeline(validate_frame(df, "event").valid)
    assert sorted(timeline) == ["gpu-a01", "gpu-a02"]
    assert timeline["gpu-a02"][0]["end"] == T0 + 7200 and "code" not in timeline["gpu-a02"][0]


def test_an_operator_maintenance_event_becomes_one_silence_of_actions_for_its_window(tmp_path: Path) -> None:
    from remediation.adapters.dryrun import DryRunAdapter
    from remediation.engine import Engine

    store = ActionStore(f"sqlite:///{tmp_path / 'a.db'}")
    store.migrate()
    e = Engine(store, DryRunAdapter(), clock=lambda: T0 + 60)
    sil = e.on_operator_event(_window())
    assert sil is not None and sil.nodes == ("gpu-a01", "gpu-a02") and sil.mutes is Mutes.ACTIONS
    assert (sil.starts_at, sil.ends_at, sil.author) == (T0, T0 + 7200, "operator:alice")
    assert e.on_operator_event(_window()).id == sil.id and len(e.silences.list()) == 1   # replayed: one silence
    assert e.silences.match("gpu-a02", None, T0 + 60, ActionKind.DRAIN) is not None
    assert e.on_operator_event({"source": "kmsg", "kind": "xid"}) is None
    assert e.on_operator_event(_window(end=T0 + 30 * 86400)) is None          # longer than max_silence_s: refused
