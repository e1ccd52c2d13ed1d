"""Live scoring through real Kafka: samples/s of one scoring worker, and decision latency.

The fleet: ``--nodes`` nodes (512) × 8 GPUs × 4 IB ports, one telemetry message per node
per ``--interval`` s of telemetry time (what ``gpuops agent`` sends), every GPU column of
spec/telemetry.md filled (gauges with noise, counters that grow).

1. **Throughput** — the messages of ``--minutes`` of telemetry are produced to a fresh
   topic (``--partitions``), then one :class:`api.scoring.ScoringWorker` (StreamWorker +
   KafkaBus + decode + features + the shipped model + explanations + ``gpu.scores``)
   consumes the backlog from a fresh consumer group: GPU samples / wall second and per
   CPU second. Run for each wire format (JSON, Arrow), and for JSON also with
   kafka-python's pure-Python CRC32C (as before the ``crc32c`` package was a dependency).
2. **Decision latency** — a producer process sends the fleet in real time (telemetry
   time = wall time, ``--latency-interval``) while the worker scores and an
   :class:`~remediation.engine.Engine` (dry-run adapter, in-memory SQLite store) consumes
   ``gpu.scores`` in another thread of the same process, as ``gpuops serve`` runs them.
   A tick [t, t + cadence) closes when the sample at t + cadence + allowed_lateness
   arrives: the latency of a tick is the time from that sample's arrival in Kafka
   (producer timestamp) to its gpu.scores message, and to the engine's decision on it.
   (A sample early in a tick also waits for the tick to end: cadence + lateness, set by
   config, not by processing.)

``--samples-per-message N`` (with ``--interval 1``): each message holds N samples per GPU and
port, one message per node per N intervals, as an agent with ``publish_every_ticks=N`` sends;
the latency run then sets ``allowed_lateness_s`` to the batch span and measures from the closing
sample's sampling time, so the agent's hold is included.

Usage::

    python bench/bench_live.py --bootstrap 127.0.0.1:19092 --write bench/results/live.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import platform
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from api.scoring import ScoringWorker  # noqa: E402
from collector.schema import GPU_COLUMNS, GPU_COUNTERS, IB_COUNTERS, ColumnKind  # noqa: E402
from collector.wire import TelemetryMessage, encode_telemetry_as  # noqa: E402
from models.bundle import load_default  # noqa: E402
from models.score_wire import decode_scores, explain_from  # noqa: E402
from pipeline.kafka_bus import KafkaBus  # noqa: E402
from pipeline.settings import PipelineSettings  # noqa: E402
from pipeline.worker import StreamTopics  # noqa: E402
from remediation.adapters.dryrun import DryRunAdapter  # noqa: E402
from remediation.config import PolicyConfig  # noqa: E402
from remediation.engine import Engine  # noqa: E402
from remediation.store import ActionStore  # noqa: E402

GPUS, PORTS = 8, 4
GAUGES = [c.name for c in GPU_COLUMNS if c.kind is ColumnKind.GAUGE and c.name not in ("ts", "gpu")]


class FleetMessages:
    """One node's telemetry message per interval, values drawn once and advanced per sample."""

    def __init__(self, nodes: int, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes = [f"gpu-node-{i:04d}" for i in range(nodes)]
        self.counters = {c: np.zeros((nodes, GPUS)) for c in GPU_COUNTERS}
        self.ib = {c: np.zeros((nodes, PORTS)) for c in IB_COUNTERS}
        self.bus_ids = [f"0000:{0x18 + g:02x}:00.0" for g in range(GPUS)]

    def tick(self, ts: float, wire_format: str, samples: int = 1, interval: float = 10.0) -> list[tuple[str, bytes]]:
        """One message per node holding *samples* samples per GPU and port, the last at *ts*, *interval* apart
        (what an agent with ``publish_every_ticks=samples`` sends)."""
        n = len(self.nodes)
        times = [ts - (samples - 1 - j) * interval for j in range(samples)]
        gauges = {c: np.empty((n, samples, GPUS)) for c in GAUGES}
        counters = {c: np.empty((n, samples, GPUS)) for c in self.counters}
        ib = {c: np.empty((n, samples, PORTS)) for c in self.ib}
        for j in range(samples):
            for c in GAUGES:
                gauges[c][:, j] = self.rng.uniform(20, 90, (n, GPUS)).round(1)
            for c in ("throttle_reasons", "row_remap_pending", "row_remap_failure"):
                gauges[c][:, j] = 0.0  # a healthy fleet: no fault counter moves
            for c in self.counters:
                if "energy" in c:
                    self.counters[c] += self.rng.uniform(5e3, 7e3, (n, GPUS)).round()
                counters[c][:, j] = self.counters[c]
            for c in self.ib:
                if c in ("port_xmit_data", "port_rcv_data"):
                    self.ib[c] += self.rng.uniform(1e9, 2e9, (n, PORTS)).round()
                ib[c][:, j] = self.ib[c]
        gpu_ts = np.repeat(times, GPUS).tolist()
        gpu_idx = list(range(GPUS)) * samples
        bus = self.bus_ids * samples
        net_ts = np.repeat(times, PORTS).tolist()
        devs = [f"mlx5_{p}" for p in range(PORTS)] * samples
        out = []
        for i, node in enumerate(self.nodes):
            gpu = {"ts": gpu_ts, "gpu": gpu_idx, "pci_bus_id": bus}
            gpu.update({c: v[i].ravel().tolist() for c, v in gauges.items()})
            gpu.update({c: v[i].ravel().tolist() for c, v in counters.items()})
            net = {"ts": net_ts, "device": devs, "port": [1] * len(devs),
                   "link_state": ["ACTIVE"] * len(devs), "rate_gbps": [400.0] * len(devs)}
            net.update({c: v[i].ravel().tolist() for c, v in ib.items()})
            out.append((node, encode_telemetry_as(TelemetryMessage(node, ts, gpu, net), wire_format)))
        return out


def agent_producer(bootstrap: str):
    """A producer configured as the agent's sink is (lz4 batches, acks=all)."""
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type="lz4", linger_ms=5,
                         client_id="bench-agents")


def warm_up(bundle) -> None:
    """Score once so that compiled scorers (numba) are built before any clock starts."""
    bundle.score(np.random.default_rng(0).uniform(0, 1, (64, len(bundle.feature_names))).astype(np.float32))


def sized(settings: PipelineSettings, nodes: int) -> PipelineSettings:
    """The capacity hints a deployment of *nodes* nodes sets (no regrowth of window state mid-run)."""
    return settings.model_copy(update={"expected_nodes": nodes, "expected_gpus": nodes * GPUS,
                                       "expected_ports": nodes * PORTS})


def make_topic(bootstrap: str, name: str, partitions: int) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench-live")
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    admin.close()


def pure_python_crc(enabled: bool) -> None:
    """Make kafka-python check CRC32C in pure Python (as without the crc32c package), or not."""
    import kafka.record._crc32c as py
    import kafka.record.util as util

    if enabled:
        util._crc32c = py.crc
    else:
        from crc32c import crc32c

        util._crc32c = crc32c


def throughput(args: argparse.Namespace, wire_format: str, slow_crc: bool) -> dict:
    topic = f"bench-live-{uuid.uuid4().hex[:8]}"
    make_topic(args.bootstrap, topic, args.partitions)
    fleet = FleetMessages(args.nodes)
    t0 = 1_767_225_600.0
    producer = agent_producer(args.bootstrap)
    n_msgs, n_bytes, encode_s = 0, 0, 0.0
    p0 = time.perf_counter()
    n_per = args.samples_per_message
    for k in range(int(args.minutes * 60 / (args.interval * n_per))):
        e0 = time.perf_counter()
        msgs = fleet.tick(t0 + (k + 1) * n_per * args.interval - args.interval, wire_format, n_per, args.interval)
        encode_s += time.perf_counter() - e0
        for node, raw in msgs:
            producer.send(topic, key=node.encode(), value=raw)
            n_msgs += 1
            n_bytes += len(raw)
    producer.flush()
    produce_s = time.perf_counter() - p0 - encode_s
    producer.close()

    pure_python_crc(slow_crc)
    topics = StreamTopics(telemetry=topic, events=f"{topic}.events", deadletter=f"{topic}.dlq")
    bus = KafkaBus(args.bootstrap, f"bench-{uuid.uuid4().hex[:8]}", (topic,))
    worker = ScoringWorker(bus, BUNDLE, sized(PipelineSettings(), args.nodes), PolicyConfig(), worker_id="bench",
                           topics=topics,
                           scores_topic=f"{topic}.scores")
    while worker.stream.messages == 0:  # joining the group takes seconds: the clock starts at the first data
        worker.run_once()
    first = worker.pipeline.counts.gpu_rows
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        while worker.stream.messages < n_msgs:
            worker.run_once()
        worker.drain()
    finally:
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        pure_python_crc(False)
        worker.close()
    samples = worker.counters.samples - first
    return {"format": wire_format, "crc": "pure Python" if slow_crc else "crc32c (C)", "messages": n_msgs,
            "per_msg": n_per, "late_rows": worker.pipeline.counts.late_rows,
            "bytes_per_msg": n_bytes / n_msgs, "samples": samples, "wall_s": wall, "cpu_s": cpu,
            "samples_per_s": samples / wall, "samples_per_cpu_s": samples / cpu, "ticks": worker.counters.ticks,
            "produce_msgs_per_s": n_msgs / produce_s, "encode_ms_per_msg": encode_s / n_msgs * 1e3}


def _paced_producer(bootstrap: str, topic: str, nodes: int, interval: float, seconds: float, fmt: str,
                    per_msg: int = 1) -> None:
    fleet = FleetMessages(nodes, seed=1)
    producer = agent_producer(bootstrap)
    start = time.time()
    k = 0
    while time.time() - start < seconds:
        due = start + k * interval * per_msg
        time.sleep(max(0.0, due - time.time()))
        now = time.time()  # samples taken every interval up to now, held and sent as one message per node
        for node, raw in fleet.tick(now, fmt, per_msg, interval):
            producer.send(topic, key=node.encode(), value=raw)
        producer.flush()
        k += 1
    producer.close()


def latency(args: argparse.Namespace, wire_format: str) -> dict:
    from kafka import KafkaConsumer

    topic = f"bench-lat-{uuid.uuid4().hex[:8]}"
    make_topic(args.bootstrap, topic, args.partitions)
    make_topic(args.bootstrap, f"{topic}.scores", 1)
    per_msg = args.samples_per_message
    lateness = latency_lateness(args)
    settings = sized(PipelineSettings(cadence_s=5, bucket_s=5, short_window_s=5, long_window_s=60,
                                      allowed_lateness_s=lateness, poll_timeout_s=0.05), args.nodes)
    topics = StreamTopics(telemetry=topic, events=f"{topic}.events", deadletter=f"{topic}.dlq")
    bus = KafkaBus(args.bootstrap, f"bench-{uuid.uuid4().hex[:8]}", (topic,), auto_offset_reset="latest")
    worker = ScoringWorker(bus, BUNDLE, settings, PolicyConfig(), worker_id="bench", topics=topics,
                           scores_topic=f"{topic}.scores")
    store = ActionStore("sqlite://")
    store.migrate()
    engine = Engine(store, DryRunAdapter(), policy=PolicyConfig())
    engine.start()
    consumer = KafkaConsumer(f"{topic}.scores", bootstrap_servers=args.bootstrap, auto_offset_reset="earliest",
                             group_id=f"engine-{uuid.uuid4().hex[:6]}")
    published: dict[float, float] = {}
    decided: dict[float, float] = {}
    stop = threading.Event()

    def engine_loop() -> None:
        while not stop.is_set():
            for records in consumer.poll(timeout_ms=100).values():
                for r in records:
                    ns, reasons, msg = decode_scores(r.value)
                    engine.tick(ns, explain_from(ns, reasons))
                    decided[ns.ts] = time.time()
                    published[ns.ts] = msg["published_at"]

    while not bus.backlog():
        worker.run_once()
    t = threading.Thread(target=engine_loop, daemon=True)
    t.start()
    prod = mp.get_context("spawn").Process(target=_paced_producer, args=(
        args.bootstrap, topic, args.nodes, args.latency_interval, args.latency_s, wire_format, per_msg))
    prod.start()
    end = time.time() + args.latency_s + 3 * settings.cadence_s
    while time.time() < end:
        worker.run_once()
    prod.join()
    time.sleep(1.0)
    stop.set()
    t.join()
    worker.close()
    consumer.close()
    closing = {ts: ts + settings.allowed_lateness_s for ts in decided}  # the closing sample's arrival (≈ its ts)
    to_pub = np.array([published[ts] - closing[ts] for ts in sorted(decided)][1:])  # first tick: partial
    to_dec = np.array([decided[ts] - closing[ts] for ts in sorted(decided)][1:])
    pct = lambda a, q: float(np.percentile(a, q)) if len(a) else float("nan")  # noqa: E731
    return {"format": wire_format, "ticks": len(to_dec), "samples_per_s": args.nodes * GPUS / args.latency_interval,
            "per_msg": per_msg, "lateness": lateness, "late_rows": worker.pipeline.counts.late_rows,
            "pub_p50": pct(to_pub, 50), "pub_p99": pct(to_pub, 99), "dec_p50": pct(to_dec, 50),
            "dec_p99": pct(to_dec, 99), "dec_max": float(to_dec.max()) if len(to_dec) else float("nan")}


def latency_lateness(args: argparse.Namespace) -> float:
    """Allowed lateness of the latency run: 1 s, or the batch span when messages hold several samples."""
    return max(1.0, args.samples_per_message * args.latency_interval)


def render(args: argparse.Namespace, rows: list[dict], lat: list[dict]) -> str:
    today = dt.date.today().isoformat()
    out = [f"### {today} — {platform.node() or 'vm'}, Python {platform.python_version()}, {os.cpu_count()} cores",
           f"{args.nodes} nodes × {GPUS} GPUs × {PORTS} IB ports, sampled every {args.interval:g} s, "
           f"{args.samples_per_message} sample(s) per GPU per message (one message per node per "
           f"{args.interval * args.samples_per_message:g} s), "
           f"{args.minutes:g} min of telemetry, topic of {args.partitions} partitions; shipped model; one process",
           "", "| wire format | CRC32C check | message bytes | GPU samples | wall s | GPU samples/s | "
           "samples/CPU-s | ticks | late rows | producer msgs/s (lz4) | encode ms/msg |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['format']} | {r['crc']} | {r['bytes_per_msg']:,.0f} | {r['samples']:,} | {r['wall_s']:.1f} | "
                   f"**{r['samples_per_s']:,.0f}** | {r['samples_per_cpu_s']:,.0f} | {r['ticks']} | {r['late_rows']} | "
                   f"{r['produce_msgs_per_s']:,.0f} | {r['encode_ms_per_msg']:.2f} |")
    if lat:
        out += ["", f"Decision latency (real time, {args.latency_s:g} s, sampling every {args.latency_interval:g} s, "
                f"{args.samples_per_message} sample(s) per message, cadence 5 s, lateness {latency_lateness(args):g} s, "
                "engine in a thread of the same process), from the sampling time of the sample that closes a tick "
                "(so including the time the agent holds it for its batch):", "",
                "| wire format | load GPU samples/s | ticks | → gpu.scores p50 / p99 s | → engine decision p50 / p99 / max s |",
                "|---|---|---|---|---|"]
        for r in lat:
            out.append(f"| {r['format']} | {r['samples_per_s']:,.0f} | {r['ticks']} | {r['pub_p50']:.2f} / "
                       f"{r['pub_p99']:.2f} | {r['dec_p50']:.2f} / **{r['dec_p99']:.2f}** / {r['dec_max']:.2f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", default=os.environ.get("GPUOPS_TEST_KAFKA", "127.0.0.1:19092"))
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--interval", type=float, default=10.0, help="telemetry interval, s")
    ap.add_argument("--minutes", type=float, default=10.0, help="telemetry time produced per throughput run")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--formats", default="json,arrow")
    ap.add_argument("--no-slow-crc", action="store_true", help="skip the pure-Python CRC32C run")
    ap.add_argument("--latency-s", type=float, default=60.0, help="real seconds of the latency run (0: skip)")
    ap.add_argument("--latency-interval", type=float, default=1.0)
    ap.add_argument("--samples-per-message", type=int, default=1,
                    help="samples per GPU per message (agent publish_every_ticks); a message per node per N x interval")
    ap.add_argument("--write", type=Path, help="append the results to this markdown file")
    args = ap.parse_args()
    global BUNDLE
    BUNDLE = load_default()
    warm_up(BUNDLE)
    formats = args.formats.split(",")
    rows = []
    if "json" in formats and not args.no_slow_crc:
        rows.append(throughput(args, "json", slow_crc=True))
        print(rows[-1], flush=True)
    for fmt in formats:
        rows.append(throughput(args, fmt, slow_crc=False))
        print(rows[-1], flush=True)
    lat = []
    if args.latency_s > 0:
        for fmt in formats:
            lat.append(latency(args, fmt))
            print(lat[-1], flush=True)
    text = render(args, rows, lat)
    print(text)
    if args.write:
        with args.write.open("a") as f:
            f.write("\n" + text)


BUNDLE = None

if __name__ == "__main__":
    main()
