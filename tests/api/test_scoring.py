"""The live scoring worker on the in-process bus: one gpu.scores message per tick, published
before the offsets move, cold nodes marked and never acted on, bad input dead-lettered."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from api.scoring import ScoringWorker
from collector.schema import Action, FaultClass, Grade
from collector.wire import TOPIC_DEADLETTER, TOPIC_SCORES, TOPIC_TELEMETRY
from models.bundle import ModelBundle, default_model_path
from models.node_scores import NodeScores
from models.score_wire import decode_scores, explain_from
from pipeline.bus import InProcessBus
from pipeline.settings import PipelineSettings
from remediation.config import PolicyConfig
from remediation.policy import NodeState, PolicyState, decide
from tests.pipeline.synth import Fleet, gpu_frame, net_frame, telemetry_messages

SETTINGS = PipelineSettings(cadence_s=10, bucket_s=10, short_window_s=10, long_window_s=30, allowed_lateness_s=0)
POLICY = PolicyConfig()


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return ModelBundle.load(default_model_path())


class RecordingBus(InProcessBus):
    """The in-process bus, logging the order of produces and commits (our own boundary)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.calls: list[str] = []

    def produce(self, topic, key, value) -> None:
        self.calls.append(f"produce:{topic}")
        super().produce(topic, key, value)

    def commit(self, offsets=None) -> None:
        self.calls.append("commit")
        super().commit(offsets)


def feed(bus: InProcessBus, fleet: Fleet) -> int:
    msgs = telemetry_messages(gpu_frame(fleet), net_frame(fleet), fleet.interval_s)
    for node, raw in msgs:
        bus.produce(TOPIC_TELEMETRY, node, raw)
    return len(msgs)


def run_all(worker: ScoringWorker, bus: InProcessBus) -> None:
    while any(bus.backlog().values()):
        worker.run_once()


def test_each_closed_tick_is_published_once_before_its_offsets_are_committed(bundle) -> None:
    bus = RecordingBus(partitions=2)
    feed(bus, Fleet(nodes=3, gpus=4, samples=30, interval_s=2.0))
    worker = ScoringWorker(bus, bundle, SETTINGS, POLICY, worker_id="w1", clock=lambda: 0.0)
    run_all(worker, bus)
    msgs = bus.messages(TOPIC_SCORES)
    ticks = [decode_scores(m.value)[0].ts for m in msgs]
    assert len(ticks) == len(set(ticks)) == worker.counters.ticks >= 5
    assert all(m.key == "w1" for m in msgs)
    # every commit comes after the produce of the tick whose closing let it move
    first_commit = bus.calls.index("commit")
    assert bus.calls[first_commit - 1] == f"produce:{TOPIC_SCORES}"
    assert worker.counters.samples == 3 * 4 * 30 and worker.counters.deadlettered == 0


def test_a_node_new_to_the_worker_is_cold_for_the_warmup_then_warm(bundle) -> None:
    bus = InProcessBus(partitions=2)
    fleet = Fleet(nodes=2, gpus=4, samples=40, interval_s=2.0)
    feed(bus, fleet)
    worker = ScoringWorker(bus, bundle, SETTINGS, POLICY, worker_id="w1", warmup_s=30)
    run_all(worker, bus)
    by_tick = [decode_scores(m.value) for m in bus.messages(TOPIC_SCORES)]
    t0 = by_tick[0][0].ts
    for ns, _, msg in by_tick:
        assert msg["cold"] == [ns.ts - t0 < 30] * 2
        if ns.ts - t0 < 30:
            assert not ns.anomaly.any()  # a young window's strangeness is not shipped


def test_a_cold_node_prediction_alerts_but_never_acts() -> None:
    def scores(ts: float, cold: bool) -> NodeScores:
        i = np.zeros(1, int)
        return NodeScores(ts, np.array(["gpu-node-001"], object), np.array([0.99]), np.array([1], np.int8), i, i,
                          np.array([-1]), np.array([-1]), i, np.zeros(1, np.int8), np.array([None], object),
                          np.array([None], object), np.array([0.0]), i, i, np.array([cold]))

    cfg = POLICY.model_copy(update={"model_warmup_s": 0})
    for cold, want_action in ((True, False), (False, True)):
        state, actions, alerts = PolicyState(), [], []
        for k in range(40):  # 40 min of p = 0.99: well past every sustain time
            ns = scores(60.0 * k, cold)
            d, state = decide(ns, state, ns.ts, cfg, explain_from(ns, {}))
            actions += [x for x in d if x.action is not Action.ALERT]
            alerts += [x for x in d if x.action is Action.ALERT]
        assert bool(actions) is want_action
        if cold:
            assert alerts and "new scoring worker" in alerts[0].reason


def test_a_held_node_that_turns_cold_is_neither_escalated_nor_resumed() -> None:
    i = np.zeros(1, int)
    ns = NodeScores(0.0, np.array(["n1"], object), np.array([0.0]), np.array([0], np.int8), i, i, np.array([-1]),
                    np.array([-1]), i, np.zeros(1, np.int8), np.array([None], object), np.array([None], object),
                    np.array([0.0]), i, i, np.array([True]))
    held = NodeState(held_since=-1e6, held_grade=Grade.PREDICTED, held_fault=FaultClass.HBM_ECC)
    state = PolicyState(nodes={"n1": held}, first_seen={"n1": -1e6})
    for k in range(100):
        d, state = decide(ns, state, 60.0 * k, POLICY, explain_from(ns, {}))
        assert d == []
    assert state.nodes["n1"] == held


def test_nodes_of_a_partition_the_worker_lost_are_not_published(bundle) -> None:
    class HalfBus(InProcessBus):
        owned = {0, 1}

        def _assigned(self):
            return [(t, p) for t, p in super()._assigned() if p in self.owned]

    bus = HalfBus(partitions=2)
    feed(bus, Fleet(nodes=6, gpus=2, samples=40, interval_s=2.0))
    worker = ScoringWorker(bus, bundle, SETTINGS.model_copy(update={"poll_max_records": 30}), POLICY, worker_id="w1")
    while worker.counters.ticks < 2:
        worker.run_once()
    assert len({n for m in bus.messages(TOPIC_SCORES) for n in decode_scores(m.value)[0].node}) == 6
    HalfBus.owned = {0}  # partition 1 revoked: its nodes now belong to another worker
    before = worker.counters.ticks
    run_all(worker, bus)
    worker.drain()
    assert worker.counters.ticks > before
    last = decode_scores(bus.messages(TOPIC_SCORES)[-1].value)[0]
    assert set(last.node) == {n for n in (f"gpu-node-{k:03d}" for k in range(6)) if bus.partition_for(n) == 0}
    assert set(worker.first_seen) == set(last.node)


def test_a_broken_message_is_dead_lettered_and_the_worker_goes_on(bundle) -> None:
    bus = InProcessBus(partitions=1)
    bus.produce(TOPIC_TELEMETRY, "gpu-node-000", b"{not json")
    feed(bus, Fleet(nodes=1, gpus=2, samples=20, interval_s=2.0))
    worker = ScoringWorker(bus, bundle, SETTINGS, POLICY, worker_id="w1")
    stop = threading.Event()
    worker.on_published = lambda ns, raw: stop.set() if worker.counters.ticks >= 2 else None
    t = threading.Thread(target=worker.run, args=(stop,))
    t.start()
    t.join(timeout=60)
    assert not t.is_alive()
    assert worker.counters.deadlettered == 1 and len(bus.messages(TOPIC_DEADLETTER)) == 1
    assert worker.counters.ticks >= 2 and worker.counters.errors == 0


def test_a_model_activated_at_run_time_scores_from_the_next_tick_and_one_of_other_features_is_refused():
    rules = ModelBundle.rules_only()
    w = ScoringWorker(InProcessBus(), ModelBundle.load(default_model_path()), PipelineSettings(), PolicyConfig(),
                      worker_id="w-swap")
    assert w.bundle.classifier is not None
    w.use_bundle(rules)
    assert w.bundle is rules and w.bundle.classifier is None
    with pytest.raises(ValueError, match="other features"):
        w.use_bundle(ModelBundle.rules_only(list(rules.feature_names) + ["a_feature_this_pipeline_lacks"]))
    assert w.bundle is rules
