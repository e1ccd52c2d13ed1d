"""Arrow telemetry decodes to exactly the rows JSON does (the fast path equals the obvious one),
mixed with JSON in one poll, and a bad sample is dead-lettered alone with the JSON path's reason."""

from __future__ import annotations

import numpy as np

from collector.wire import TOPIC_EVENTS, TOPIC_TELEMETRY, decode_telemetry, encode_telemetry, encode_telemetry_arrow
from pipeline.bus import BusMessage
from pipeline.decode import MessageDecoder
from pipeline.registry import Keys
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from tests.pipeline.synth import Fleet, gpu_frame, net_frame, telemetry_messages

FLEET = Fleet(nodes=3, gpus=4, ports=2, samples=12, interval_s=5.0, jitter_s=1.0, seed=5)


def as_arrow(raw: bytes) -> bytes:
    return encode_telemetry_arrow(decode_telemetry(raw))


def bus_messages(fmt) -> list[BusMessage]:
    msgs = telemetry_messages(gpu_frame(FLEET), net_frame(FLEET), FLEET.interval_s)
    return [BusMessage(TOPIC_TELEMETRY, node, fmt(i, raw), 0, i) for i, (node, raw) in enumerate(msgs)]


def decode(msgs: list[BusMessage]):
    s = PipelineSettings()
    return MessageDecoder(Keys(), s.max_gpus_per_node, (TOPIC_TELEMETRY,), (TOPIC_EVENTS,)).decode(msgs)


def sorted_rows(rows):
    """Rows in a canonical order (slot numbers are the registry's, assigned in arrival order)."""
    v = np.nan_to_num(rows.vals, nan=-1e300)
    return rows.take(np.lexsort(tuple(v[::-1]) + (rows.ts,)))


def test_arrow_messages_decode_to_the_rows_json_messages_do() -> None:
    want = decode(bus_messages(lambda i, raw: raw))
    for fmt in (lambda i, raw: as_arrow(raw), lambda i, raw: as_arrow(raw) if i % 2 else raw):  # all, mixed
        got = decode(bus_messages(fmt))
        assert not got.rejected and [p[1] for p in got.progress] == [p[1] for p in want.progress]
        assert [p[2] for p in got.progress] == [p[2] for p in want.progress]
        for a, b in ((got.gpu, want.gpu), (got.net, want.net)):
            a, b = sorted_rows(a), sorted_rows(b)
            np.testing.assert_array_equal(a.ts, b.ts)
            np.testing.assert_array_equal(a.vals, b.vals)


def test_the_pipeline_gives_the_same_features_from_arrow_as_from_json() -> None:
    out = []
    for fmt in (lambda i, raw: raw, lambda i, raw: as_arrow(raw)):
        s = PipelineSettings(cadence_s=10, bucket_s=10, short_window_s=10, long_window_s=30)
        pipe = FeaturePipeline(s)
        d = MessageDecoder(pipe.keys, s.max_gpus_per_node, (TOPIC_TELEMETRY,), (TOPIC_EVENTS,)).decode(bus_messages(fmt))
        pipe.ingest(d.gpu, d.net, d.xids)
        out.append(pipe.flush())
    assert len(out[0]) == len(out[1]) > 3
    for a, b in zip(*out):
        assert a.ts == b.ts and list(a.node) == list(b.node)
        np.testing.assert_array_equal(a.x, b.x)


def test_a_bad_sample_in_an_arrow_message_is_rejected_alone_with_the_json_reason() -> None:
    raw = telemetry_messages(gpu_frame(FLEET), None, FLEET.interval_s)[0][1]
    msg = decode_telemetry(raw)
    msg.gpu["gpu"][1] = 99  # outside [0, max_gpus)
    for enc in (encode_telemetry, encode_telemetry_arrow):
        got = decode([BusMessage(TOPIC_TELEMETRY, msg.node, enc(msg), 0, 0)])
        assert len(got.rejected) == 1 and "gpu index 99 outside [0, 64)" in got.rejected[0].reason
        assert len(got.gpu) == len(msg.gpu["gpu"]) - 1


def test_an_arrow_message_with_a_string_where_a_number_belongs_takes_the_general_path() -> None:
    raw = telemetry_messages(gpu_frame(FLEET), None, FLEET.interval_s)[0][1]
    msg = decode_telemetry(raw)
    msg.gpu["temp_gpu_c"] = ["hot"] * len(msg.gpu["gpu"])
    got = decode([BusMessage(TOPIC_TELEMETRY, msg.node, enc(msg), 0, 0) for enc in (encode_telemetry_arrow,)])
    want = decode([BusMessage(TOPIC_TELEMETRY, msg.node, encode_telemetry(msg), 0, 0)])
    assert [r.reason for r in got.rejected] == [r.reason for r in want.rejected] != []
