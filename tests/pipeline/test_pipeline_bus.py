"""The live path on the in-process bus: decoding, dead letters, watermark, commits."""

from __future__ import annotations

import orjson
import pandas as pd
import pytest

from collector.wire import TOPIC_DEADLETTER, TOPIC_EVENTS, TOPIC_TELEMETRY, TelemetryMessage, encode_telemetry
from pipeline.batch import FeatureBatch
from pipeline.bus import InProcessBus, make_bus
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from pipeline.worker import StreamWorker
from tests.pipeline.synth import Fleet, bmc_events_frame, event_messages, events_frame, gpu_frame, net_frame, telemetry_messages

SETTINGS = PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=600)


def replay(gpu: pd.DataFrame, net: pd.DataFrame | None = None, events: pd.DataFrame | None = None) -> list[FeatureBatch]:
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(gpu, net, events)
    return pipe.flush()


def consume_all(bus: InProcessBus, n_messages: int) -> tuple[StreamWorker, list[FeatureBatch]]:
    got: list[FeatureBatch] = []
    worker = StreamWorker(bus, FeaturePipeline(SETTINGS), got.append)
    for _ in range(10_000):
        if worker.messages >= n_messages and not any(bus.backlog().values()):
            break
        worker.run_once()
    worker.drain()
    return worker, got


def assert_same(got: list[FeatureBatch], want: list[FeatureBatch]) -> None:
    assert [b.ts for b in got] == [b.ts for b in want]
    for g, w in zip(got, want):
        pd.testing.assert_frame_equal(g.to_frame(), w.to_frame(), check_exact=True)


def test_live_messages_on_the_in_process_bus_give_exactly_the_replay_features() -> None:
    fleet = Fleet(nodes=5, gpus=4, ports=2, samples=40, interval_s=10.0, jitter_s=1.0)
    g, n = gpu_frame(fleet), net_frame(fleet)
    e = events_frame(fleet, [(35, 0, 1, 79), (36, 1, None, 48), (200, 3, 2, 13)])
    e = pd.concat([e, bmc_events_frame(fleet)], ignore_index=True)  # BMC readings and SEL entries too
    bus = InProcessBus(partitions=4)
    msgs = telemetry_messages(g, n, fleet.interval_s)
    for node, raw in msgs:
        bus.produce(TOPIC_TELEMETRY, node, raw)
    for node, raw in event_messages(e):
        bus.produce(TOPIC_EVENTS, node, raw)
    worker, got = consume_all(bus, len(msgs) + len(e))
    assert worker.pipeline.counts.late_rows == 0
    want = replay(g, n, e)
    assert_same(got, want)
    f = pd.concat([b.to_frame() for b in want])
    assert f["node_bmc_inlet_margin_c"].notna().any() and f["node_bmc_psu_fail_count_short"].max() == 1


def test_bad_messages_and_samples_are_dead_lettered_with_a_reason_while_good_ones_still_yield_features() -> None:
    fleet = Fleet(nodes=2, gpus=4, ports=0, samples=12, interval_s=10.0)
    g = gpu_frame(fleet)
    bus = InProcessBus(partitions=2)
    msgs = telemetry_messages(g, None, fleet.interval_s)
    for node, raw in msgs:
        bus.produce(TOPIC_TELEMETRY, node, raw)
    bad_sample = TelemetryMessage(node="gpu-node-001", ts=fleet.t0 + 30.0, gpu={
        "ts": [fleet.t0 + 30.0, None, fleet.t0 + 31.0, fleet.t0 + 32.0],
        "gpu": [7, 1, True, 9], "util_gpu": [50.0, 50.0, 50.0, "high"]})
    junk = [b"not json", b'{"schema":"something.else","v":1}',
            orjson.dumps({"schema": "gpuops.telemetry", "v": 1, "node": "bad node!", "ts": fleet.t0, "gpu": {}}),
            orjson.dumps({"schema": "gpuops.telemetry", "v": 99, "node": "gpu-node-000", "ts": fleet.t0}),
            encode_telemetry(bad_sample)]
    for raw in junk:
        bus.produce(TOPIC_TELEMETRY, "gpu-node-001", raw)
    bus.produce(TOPIC_EVENTS, "gpu-node-000", b'{"schema":"gpuops.event","v":1,"node":"gpu-node-000","ts":1.0}')
    worker, got = consume_all(bus, len(msgs) + len(junk) + 1)

    letters = [orjson.loads(m.value) for m in bus.messages(TOPIC_DEADLETTER)]
    reasons = [d["reason"] for d in letters]
    assert len(letters) == worker.deadlettered == 4 + 3 + 1  # 4 messages, 3 samples, 1 event
    assert any("not valid JSON" in r for r in reasons)
    assert any("schema is 'something.else'" in r for r in reasons)
    assert any("malformed node name 'bad node!'" in r for r in reasons)
    assert any("unsupported schema version 99" in r for r in reasons)
    assert any(r.startswith("gpu sample 1: missing required field 'ts'") for r in reasons)
    assert any(r.startswith("gpu sample 2: field 'gpu' must be a number") for r in reasons)
    assert any(r.startswith("gpu sample 3: field 'util_gpu' must be a number") for r in reasons)
    assert any("missing required field 'source'" in r for r in reasons)
    assert all(d["topic"] in (TOPIC_TELEMETRY, TOPIC_EVENTS) and d["offset"] is not None for d in letters)
    # the one good sample of the half-bad message counts; everything else equals the clean replay
    extra = pd.DataFrame({"ts": [fleet.t0 + 30.0], "node": ["gpu-node-001"], "gpu": [7], "util_gpu": [50.0]})
    assert_same(got, replay(pd.concat([g, extra], ignore_index=True)))


def test_offsets_are_committed_only_once_the_tick_of_their_rows_is_closed() -> None:
    fleet = Fleet(nodes=1, gpus=2, ports=0, samples=9, interval_s=10.0)  # ticks [0,60) and [60,90)
    bus = InProcessBus(partitions=1, topics=(TOPIC_TELEMETRY,))
    for node, raw in telemetry_messages(gpu_frame(fleet), None, fleet.interval_s):
        bus.produce(TOPIC_TELEMETRY, node, raw)
    scored: list[FeatureBatch] = []
    settings = SETTINGS.model_copy(update={"allowed_lateness_s": 0.0, "poll_max_records": 7})
    worker = StreamWorker(bus, FeaturePipeline(settings), scored.append)
    worker.run_once()  # messages at 0..60 s: the first tick closes when the 60 s sample is seen
    assert [b.ts for b in scored] == [fleet.t0 + 60]
    assert bus.committed == {(TOPIC_TELEMETRY, 0): 6}  # offsets 0-5 (0..50 s) are done, 60 s is open
    worker.run_once()
    worker.drain()
    assert [b.ts for b in scored] == [fleet.t0 + 60, fleet.t0 + 120]
    assert bus.committed == {(TOPIC_TELEMETRY, 0): 9}


def test_the_in_process_bus_partitions_by_key_the_same_way_every_run() -> None:
    a, b = InProcessBus(partitions=4), InProcessBus(partitions=4)
    keys = [f"gpu-node-{i:03d}" for i in range(50)]
    assert [a.partition_for(k) for k in keys] == [b.partition_for(k) for k in keys]
    assert len({a.partition_for(k) for k in keys}) == 4


def test_an_unknown_bus_name_fails_at_start_up_listing_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: inprocess, kafka"):
        make_bus(PipelineSettings(bus="rabbit"))


def test_live_xids_naming_only_a_pci_bus_id_find_their_gpu_as_in_replay() -> None:
    fleet = Fleet(nodes=3, gpus=4, ports=2, samples=40, interval_s=10.0)
    g = gpu_frame(fleet)
    g["pci_bus_id"] = [f"00000000:{0x18 + 0x20 * int(i):02X}:00.0" for i in g["gpu"]]
    e = events_frame(fleet, [(235, 1, None, 79), (236, 2, None, 48)])
    e["pci_bus_id"] = ["0000:58:00", "0000:ff:00"]  # GPU 2 of node 1; a bus id no GPU has
    bus = InProcessBus(partitions=2)
    msgs = telemetry_messages(g, None, fleet.interval_s)
    for node, raw in msgs:
        bus.produce(TOPIC_TELEMETRY, node, raw)
    for node, raw in event_messages(e):
        bus.produce(TOPIC_EVENTS, node, raw)
    _, got = consume_all(bus, len(msgs) + len(e))
    want = replay(g, None, e)
    assert_same(got, want)
    f = pd.concat([b.to_frame() for b in want]).groupby(["node", "gpu"]).sum()
    assert f.loc[("gpu-node-001", 2), "xid_off_bus_count_short"] == 1
    assert f["xid_off_bus_count_short"].sum() == 1
    assert f.loc["gpu-node-002", "node_xid_dbe_count_short"].min() == 1


@pytest.mark.parametrize("wire_format", ["json", "arrow"])
def test_messages_holding_several_samples_per_gpu_give_exactly_the_replay_features(wire_format: str) -> None:
    """An agent with publish_every_ticks=4 at 10 s: each message spans 40 s, under the 60 s lateness."""
    from collector.wire import decode_telemetry, encode_telemetry_arrow

    fleet = Fleet(nodes=5, gpus=4, ports=2, samples=40, interval_s=10.0, jitter_s=1.0)
    g, n = gpu_frame(fleet), net_frame(fleet)
    bus = InProcessBus(partitions=4)
    msgs = telemetry_messages(g, n, 4 * fleet.interval_s)
    assert max(len(decode_telemetry(raw).gpu["gpu"]) for _, raw in msgs) == 4 * fleet.gpus
    for node, raw in msgs:
        bus.produce(TOPIC_TELEMETRY, node, raw if wire_format == "json" else encode_telemetry_arrow(decode_telemetry(raw)))
    got: list[FeatureBatch] = []
    worker = StreamWorker(bus, FeaturePipeline(SETTINGS.model_copy(update={"allowed_lateness_s": 60.0})), got.append)
    while worker.messages < len(msgs) or any(bus.backlog().values()):
        worker.run_once()
    worker.drain()
    assert worker.pipeline.counts.late_rows == 0 and worker.deadlettered == 0
    assert_same(got, replay(g, n))


class RefusingBus(InProcessBus):
    """An in-process bus whose next *refuse* commits fail, as a Kafka commit the coordinator does not take."""

    def __init__(self, refuse: int, **kw) -> None:
        super().__init__(**kw)
        self.refuse = refuse

    def commit(self, offsets=None) -> None:
        if self.refuse:
            self.refuse -= 1
            raise TimeoutError("commit not taken")
        super().commit(offsets)


def test_offsets_a_refused_commit_held_are_committed_with_the_next_one() -> None:
    fleet = Fleet(nodes=1, gpus=2, ports=0, samples=9, interval_s=10.0)  # ticks [0,60) and [60,90)
    bus = RefusingBus(1, partitions=1, topics=(TOPIC_TELEMETRY,))
    for node, raw in telemetry_messages(gpu_frame(fleet), None, fleet.interval_s):
        bus.produce(TOPIC_TELEMETRY, node, raw)
    scored: list[FeatureBatch] = []
    settings = SETTINGS.model_copy(update={"allowed_lateness_s": 0.0, "poll_max_records": 7})
    worker = StreamWorker(bus, FeaturePipeline(settings), scored.append)
    with pytest.raises(TimeoutError):
        worker.run_once()          # the first tick closes and is published; its commit is refused
    assert [b.ts for b in scored] == [fleet.t0 + 60] and bus.committed == {}
    worker.run_once()              # nothing new closes, yet the held offsets go out again
    assert bus.committed == {(TOPIC_TELEMETRY, 0): 6}
    worker.drain()
    assert bus.committed == {(TOPIC_TELEMETRY, 0): 9}
