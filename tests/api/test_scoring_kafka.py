"""Scoring workers on a real Kafka broker: scale-out and rebalance in one consumer group, and a
broker restarted in the middle of scoring (issue 10, Tests).

The fleet is healthy (no fault counter moves) except where a test injects a fault, and the
engine that reads ``gpu.scores`` runs with ``model_warmup_s = 0``: only the workers' ``cold``
flag stands between a moved node's young window and an action.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from api.scoring import ScoringWorker
from collector.schema import GPU_COUNTERS
from collector.wire import TelemetryMessage, encode_telemetry_as
from models.bundle import ModelBundle, default_model_path
from models.score_wire import decode_scores, explain_from
from pipeline.kafka_bus import KafkaBus
from pipeline.settings import PipelineSettings
from pipeline.worker import StreamTopics
from remediation.actions import ActionKind
from remediation.adapters.dryrun import DryRunAdapter
from remediation.config import PolicyConfig
from remediation.engine import Engine
from remediation.store import ActionStore
from tests.helpers import wait_until

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]
SETTINGS = PipelineSettings(cadence_s=10, bucket_s=10, short_window_s=10, long_window_s=60, allowed_lateness_s=0,
                            poll_timeout_s=0.2, poll_max_records=200)
WARMUP_S = 60.0
POLICY = PolicyConfig(model_warmup_s=0)  # the engine trusts every window: only `cold` protects moved nodes
T0 = 1_767_225_600.0
GPUS = 4


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return ModelBundle.load(default_model_path())


def fleet_messages(nodes: int, k0: int, k1: int, interval_s: float = 2.0, fmt: str = "json",
                   dbe_from: tuple[int, int] | None = None) -> list[tuple[str, bytes]]:
    """Healthy samples k0..k1-1 of every node; ``dbe_from=(node, k)``: that node's GPU 0 reports
    double-bit ECC errors from sample k on (a fatal fault: the rules reset it)."""
    out = []
    for k in range(k0, k1):
        ts = T0 + k * interval_s
        for i in range(nodes):
            gpu = {"ts": [ts] * GPUS, "gpu": list(range(GPUS)), "util_gpu": [80.0 + (k + g) % 5 for g in range(GPUS)],
                   "temp_gpu_c": [55.0 + (i + g) % 4 for g in range(GPUS)], "power_w": [400.0] * GPUS,
                   "sm_clock_mhz": [1980.0] * GPUS, "throttle_reasons": [0] * GPUS}
            gpu.update({c: [0] * GPUS for c in GPU_COUNTERS})
            if dbe_from and dbe_from[0] == i and k >= dbe_from[1]:
                gpu["ecc_dbe_vol"] = [k - dbe_from[1] + 1] + [0] * (GPUS - 1)
            out.append((f"gpu-node-{i:03d}", encode_telemetry_as(TelemetryMessage(f"gpu-node-{i:03d}", ts, gpu), fmt)))
    return out


def produce(bootstrap: str, topic: str, msgs: list[tuple[str, bytes]]) -> None:
    bus = KafkaBus(bootstrap, f"producer-{uuid.uuid4().hex[:6]}", ())
    try:
        for node, raw in msgs:
            bus.produce(topic, node, raw)
        bus.flush()
    finally:
        bus.close()


class Scores:
    """Everything published to the scores topic, read by a plain consumer (as the engine leader does)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bus = KafkaBus(bootstrap, f"engine-{uuid.uuid4().hex[:6]}", (topic,))
        self.messages: list[tuple] = []  # (NodeScores, reasons, message)

    def read(self) -> list[tuple]:
        for m in self.bus.poll(1000, 0.2):
            self.messages.append(decode_scores(m.value))
        return self.messages

    def scored(self) -> dict[tuple[float, str], int]:
        """(tick, node) -> how many messages scored it."""
        out: dict[tuple[float, str], int] = {}
        for ns, _, _ in self.messages:
            for n in ns.node:
                out[(ns.ts, str(n))] = out.get((ns.ts, str(n)), 0) + 1
        return out


def engine() -> Engine:
    store = ActionStore("sqlite://")
    store.migrate()
    e = Engine(store, DryRunAdapter(), policy=POLICY, clock=lambda: 0.0)
    e.start()
    return e


def run_in_thread(worker: ScoringWorker) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    t = threading.Thread(target=worker.run, args=(stop,), daemon=True, name=worker.worker_id)
    t.start()
    return t, stop


def test_two_workers_split_the_partitions_and_one_takes_over_without_a_false_action(
        kafka_bootstrap: str, kafka_topic: str, kafka_admin, bundle: ModelBundle) -> None:
    from kafka.admin import NewTopic

    topics = StreamTopics(telemetry=kafka_topic, events=f"{kafka_topic}.events", deadletter=f"{kafka_topic}.dlq")
    scores_topic = f"{kafka_topic}.scores"
    kafka_admin.create_topics([NewTopic(scores_topic, num_partitions=1, replication_factor=1)])
    group = f"scoring-{uuid.uuid4().hex[:6]}"
    nodes = 12
    workers = [ScoringWorker(KafkaBus(kafka_bootstrap, group, (kafka_topic,)), bundle, SETTINGS, POLICY,
                             worker_id=f"w{i}", scores_topic=scores_topic, topics=topics, warmup_s=WARMUP_S)
               for i in (1, 2)]
    threads = [run_in_thread(w) for w in workers]
    scores = Scores(kafka_bootstrap, scores_topic)
    try:
        def split() -> bool:  # the group has settled: each worker holds 2 of the 4 partitions
            return all(len(w.bus.inner._consumer.assignment()) == 2 for w in workers)

        wait_until(split, timeout_s=60, message="the group split the partitions")
        produce(kafka_bootstrap, kafka_topic, fleet_messages(nodes, 0, 60))  # 2 min of telemetry
        wait_until(lambda: all(w.counters.ticks >= 3 for w in workers), timeout_s=90,
                   message="both workers scoring")
        owned = [set(w.bus.partition_of) for w in workers]
        assert owned[0] and owned[1] and not owned[0] & owned[1]  # the group split the nodes
        assert {p for w in workers for p in w.bus.inner.backlog()} == {(kafka_topic, p) for p in range(4)}

        t_kill = time.monotonic()
        threads[1][1].set()  # worker 2 stops (leaves the group; its open ticks stay uncommitted)
        threads[1][0].join(timeout=30)
        moved = owned[1]
        # live telemetry keeps coming while the group rebalances; here it comes once w1 holds every
        # partition (a backlog that w1 read on its own partitions first would be late for the moved ones)
        wait_until(lambda: len(workers[0].bus.inner._consumer.assignment()) == 4, timeout_s=60,
                   message="worker 1 took over every partition")
        produce(kafka_bootstrap, kafka_topic, fleet_messages(nodes, 60, 150))  # 3 more minutes

        def warm_again() -> bool:
            scores.read()
            last = [x for x in scores.messages if x[2]["worker"] == "w1"]
            return bool(last) and len(last[-1][0]) == nodes and not last[-1][0].cold.any()

        try:
            wait_until(warm_again, timeout_s=120, message="worker 1 scores every node, warm again")
        except AssertionError as e:
            last = [(m["worker"], ns.ts - T0, len(ns), int(ns.cold.sum())) for ns, _, m in scores.messages[-3:]]
            raise AssertionError(f"{e}: {workers[0].counters}, last scores {last}, w1 owns "
                                 f"{workers[0].bus.inner.backlog()}, w2 alive {threads[1][0].is_alive()}, "
                                 f"next {workers[0].bus.next_offset}") from None
        takeover_s = time.monotonic() - t_kill
    finally:
        for t, stop in threads:
            stop.set()
            t.join(timeout=30)
        scores.bus.close()

    # the blind period: telemetry time during which the moved nodes were scored cold by w1
    w1 = [(ns, m) for ns, _, m in scores.messages if m["worker"] == "w1"]
    cold_ticks = sorted({ns.ts for ns, _ in w1 for i, n in enumerate(ns.node) if str(n) in moved and ns.cold[i]})
    assert cold_ticks, "the moved nodes arrived at w1 cold"
    blind_s = cold_ticks[-1] - cold_ticks[0] + SETTINGS.cadence_s
    assert blind_s == pytest.approx(WARMUP_S, abs=SETTINGS.cadence_s)
    print(f"\nrebalance: takeover + warm again in {takeover_s:.1f} s wall; blind period {blind_s:.0f} s of telemetry "
          f"({len(moved)} moved nodes)")

    # every tick of every node that stayed was scored; a moved node from its first tick at w1 on (the
    # tick w2 had open when it stopped reaches w1 after w1 closed it for its own nodes: part of the blind period)
    scored = scores.scored()
    ticks = sorted({ts for ts, _ in scored})
    everyone = {f"gpu-node-{i:03d}" for i in range(nodes)}
    for ts in ticks[1:-1]:
        want = everyone if ts >= cold_ticks[0] else everyone - moved
        assert want <= {n for t, n in scored if t == ts}, ts
    assert max(scored.values()) == 1  # and none twice
    e = engine()
    for ns, reasons, _ in sorted(scores.messages, key=lambda x: x[0].ts):
        e.tick(ns, explain_from(ns, reasons))
    acted = [r for r in e.store.query(limit=10_000) if r.kind is not ActionKind.ALERT]
    assert acted == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def private_broker(tmp_path: Path, kafka_bootstrap: str):
    """A second, private broker (own root and ports) that this test may stop and start."""
    env = {**os.environ, "KAFKA_ROOT": str(tmp_path / "kafka"), "KAFKA_PORT": str(_free_port()),
           "KAFKA_CONTROLLER_PORT": str(_free_port()), "SKIP_APT": "1", "KAFKA_HEAP_OPTS": "-Xms64m -Xmx256m"}
    up = [str(REPO / "deploy/testservices/kafka_up.sh")]
    down = [str(REPO / "deploy/testservices/kafka_down.sh")]

    def start() -> None:
        subprocess.run(up, env=env, check=True, capture_output=True, timeout=120)

    def stop() -> None:
        subprocess.run(down, env=env, check=True, capture_output=True, timeout=60)

    start()
    try:
        yield f"127.0.0.1:{env['KAFKA_PORT']}", start, stop
    finally:
        subprocess.run(down + ["--purge"], env=env, capture_output=True, timeout=60)


def private_worker(bootstrap: str, prefix: str, partitions: int, bundle: ModelBundle) -> tuple[str, ScoringWorker]:
    """A fresh telemetry topic of *partitions* (and its scores topic) on *bootstrap*, and a warm-from-the-start
    scoring worker on it."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1), NewTopic(f"{topic}.scores", 1, 1)])
    admin.close()
    topics = StreamTopics(telemetry=topic, events=f"{topic}.events", deadletter=f"{topic}.dlq")
    return topic, ScoringWorker(KafkaBus(bootstrap, "scoring", (topic,)), bundle, SETTINGS, POLICY, worker_id="w1",
                                scores_topic=f"{topic}.scores", topics=topics, warmup_s=0)


def test_a_broker_restart_loses_no_sample_and_no_tick_becomes_two_actions(private_broker, bundle) -> None:
    bootstrap, start, stop = private_broker
    topic, worker = private_worker(bootstrap, "restart", 4, bundle)
    nodes = 6
    thread, halt = run_in_thread(worker)
    try:
        produce(bootstrap, topic, fleet_messages(nodes, 0, 60, dbe_from=(2, 40)))
        wait_until(lambda: worker.counters.ticks >= 4, timeout_s=90, message="scoring before the restart")
        stop()
        time.sleep(2.0)  # the worker meets a dead broker (this is the scenario, not a wait for a result)
        start()
        produce(bootstrap, topic, fleet_messages(nodes, 60, 120, dbe_from=(2, 40)))
        wait_until(lambda: worker.counters.last_tick_ts is not None and worker.counters.last_tick_ts >= T0 + 230,
                   timeout_s=180, message="scoring after the restart up to the last full tick")
    finally:
        halt.set()
        thread.join(timeout=60)
    scores = Scores(bootstrap, f"{topic}.scores")
    wait_until(lambda: len(scores.read()) >= worker.counters.published, timeout_s=60, message="scores read back")
    scores.bus.close()

    scored = scores.scored()
    ticks = sorted({ts for ts, _ in scored})
    want = {(T0 + 10 * k, f"gpu-node-{i:03d}") for k in range(1, 24) for i in range(nodes)}
    assert want <= set(scored), f"lost: {sorted(want - set(scored))[:5]}"
    print(f"\nbroker restart: {len(ticks)} ticks, {worker.counters.errors} failed polls retried, "
          f"{worker.counters.reread} messages read again and skipped, "
          f"{sum(1 for v in scored.values() if v > 1)} (tick, node) scored twice")
    # the fault became exactly one action, and scoring a tick again (a replayed tick) adds none
    e = engine()
    for ns, reasons, _ in sorted(scores.messages, key=lambda x: x[0].ts):
        e.tick(ns, explain_from(ns, reasons))
    first = [r for r in e.store.query(limit=10_000) if r.kind is not ActionKind.ALERT]
    assert [r.node for r in first] == ["gpu-node-002"]
    for ns, reasons, _ in sorted(scores.messages, key=lambda x: x[0].ts):
        e.tick(ns, explain_from(ns, reasons))
    again = [r for r in e.store.query(limit=10_000) if r.kind is not ActionKind.ALERT]
    assert [r.id for r in again] == [r.id for r in first]


def test_a_worker_stops_promptly_while_its_broker_is_down(private_broker, bundle) -> None:
    """No call the scoring loop makes waits on the broker without bound: with the broker gone, the loop
    goes on turning (failed polls logged and retried) and a shutdown ends within seconds. One of the
    topic's partitions never gets a record, so every poll asks the broker for its end offset; a
    commit the coordinator never takes times out instead of waiting for it."""
    from kafka.errors import KafkaError

    bootstrap, start, stop = private_broker
    topic, worker = private_worker(bootstrap, "outage", 2, bundle)
    other = KafkaBus(bootstrap, "other", (topic,))
    thread, halt = run_in_thread(worker)
    try:
        produce(bootstrap, topic, fleet_messages(1, 0, 30))  # one node: one partition, the other stays empty
        wait_until(lambda: worker.counters.ticks >= 2, timeout_s=90, message="scoring before the outage")
        wait_until(lambda: bool(other.poll(10, 0.2)) or bool(other._consumer.assignment()), timeout_s=60,
                   message="the second member has its partitions")
        stop()
        committed: list = []

        def commit() -> None:
            try:
                other.commit({(topic, 0): 1})
                committed.append("taken")
            except KafkaError as e:
                committed.append(e)

        c = threading.Thread(target=commit, daemon=True)
        c.start()
        c.join(timeout=45)
        assert not c.is_alive(), "a commit waited on a dead broker without bound"
        assert committed and isinstance(committed[0], KafkaError)
    finally:
        halt.set()
        thread.join(timeout=45)
    alive = thread.is_alive()
    start()  # for the fixture's teardown
    assert not alive, "the scoring loop did not stop within 45 s while the broker was down"
