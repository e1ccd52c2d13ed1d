"""CPU cost of the node agent on an 8-GPU node (target: < 1 % of one core at a 10 s interval).

Sources: fake NVML with 8 GPUs (18 NVLink links each; tests/collector/fake_nvml.py),
the real H100 node sysfs capture (9 HCAs), a kernel log followed for new lines. Sink:
real Kafka when ``GPUOPS_TEST_KAFKA`` (or ``--bootstrap``) names a broker, else the
stdout sink writing to /dev/null.

Two measurements, side by side in one run:

1. per tick — process CPU time (all threads) of ``tick()`` + ``publish_pending()``
   over many ticks, broken down per source and for encode+publish;
2. steady state — the real ``Agent.run`` loop (sampler + publisher threads) for
   ``--run-s`` seconds at ``--interval``: total process CPU over wall time, which
   includes idle wake-ups between ticks and kafka-python's background thread.

What a fake NVML cannot show: the real NVML calls (ioctls into the driver, ~10-50 µs
each; ~110 calls per GPU per tick here) — see bench/results/agent.md for the estimate.

Usage::

    python bench/bench_agent.py --ticks 300 --run-s 60 --write bench/results/agent.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import io
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from collector.agent import Agent  # noqa: E402
from collector.agent_settings import AgentSettings  # noqa: E402
from collector.sinks.stdout import StdoutSink  # noqa: E402
from collector.sources.infiniband import InfinibandSource  # noqa: E402
from collector.sources.kmsg import KmsgSource  # noqa: E402
from collector.sources.nvml import NvmlSource  # noqa: E402


def _fake_nvml_module():
    spec = importlib.util.spec_from_file_location("fake_nvml", REPO / "tests" / "collector" / "fake_nvml.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fake_nvml"] = mod  # dataclasses look their module up while building the class
    spec.loader.exec_module(mod)
    return mod


def build(args: argparse.Namespace, log: Path, interval: float):
    fake = _fake_nvml_module()
    node = "bench-node-001"
    gpus = [fake.FakeGpu(uuid=f"GPU-{i}", pci_bus_id=f"00000000:{0x18 + i:02x}:00.0") for i in range(8)]
    nvml = NvmlSource(node, nvml=fake.FakeNvml(gpus))
    sources = [nvml, InfinibandSource(node, args.sysfs_root),
               KmsgSource(node, log, gpu_index_by_pci=nvml.gpu_index_by_pci())]
    settings = AgentSettings(node=node, interval_s=interval, health_file=Path(tempfile.mkdtemp()) / "health.json",
                             bootstrap=args.bootstrap or "127.0.0.1:9092",
                             telemetry_topic="bench.telemetry", events_topic="bench.events")
    if args.bootstrap:
        from collector.sinks.kafka import KafkaSink
        sink = KafkaSink.from_settings(settings)
    else:
        sink = StdoutSink(io.TextIOWrapper(open(os.devnull, "wb")))
    return Agent(settings, sources, sink)


def per_tick(args: argparse.Namespace, log: Path) -> dict:
    agent = build(args, log, 10.0)
    agent.tick()
    agent.publish_pending()  # connect, create topics: not part of the steady state
    per_source = {s.name: 0.0 for s in agent.sources}
    t_tick = t_pub = 0.0
    wall0 = time.perf_counter()
    for _ in range(args.ticks):
        for s in agent.sources:  # attribution pass, not counted in the tick
            c = time.process_time()
            s.sample(time.time())
            per_source[s.name] += time.process_time() - c
        c = time.process_time()
        agent.tick()
        t_tick += time.process_time() - c
        c = time.process_time()
        agent.publish_pending()
        t_pub += time.process_time() - c
    wall = time.perf_counter() - wall0
    from collector.sources.base import SourceBatch
    whole = SourceBatch()
    for src in agent.sources:
        whole.extend(src.sample(0.0))
    size = len(agent.encode(whole, 0.0)[0].value)
    agent.close()
    n = args.ticks
    return {"cpu_ms_per_tick": 1000 * (t_tick + t_pub) / n,
            "per_source_ms": {k: 1000 * v / n for k, v in per_source.items()},
            "encode_ms": 1000 * (t_tick - sum(per_source.values())) / n, "publish_ms": 1000 * t_pub / n,
            "wall_ms_per_iteration": 1000 * wall / n, "gpu_only_msg_bytes": size,
            "published": agent.published}


def steady_state(args: argparse.Namespace, log: Path) -> dict:
    agent = build(args, log, args.interval)
    stop = threading.Event()
    t = threading.Thread(target=agent.run, args=(stop,))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    t.start()
    stop.wait(args.run_s)
    cpu_run, wall_run = time.process_time() - cpu0, time.perf_counter() - wall0
    stop.set()
    t.join()
    return {"cpu_s": cpu_run, "wall_s": wall_run, "ticks": agent.ticks, "published": agent.published,
            "core_pct": 100 * cpu_run / wall_run}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ticks", type=int, default=300)
    p.add_argument("--interval", type=float, default=10.0)
    p.add_argument("--run-s", type=float, default=60.0)
    p.add_argument("--sysfs-root", type=Path,
                   default=REPO.parent / "shared/fixtures/infiniband/sysfs/gpud_h100_node/sys")
    p.add_argument("--bootstrap", default=os.environ.get("GPUOPS_TEST_KAFKA"))
    p.add_argument("--write", type=Path)
    args = p.parse_args()
    import logging
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "kern.log"
        log.write_text("")
        a = per_tick(args, log)
        b = steady_state(args, log)
    pct_tick = a["cpu_ms_per_tick"] / 1000 / args.interval * 100
    sink = f"Kafka at {args.bootstrap} (lz4, acks=all)" if args.bootstrap else "stdout → /dev/null"
    lines = [
        f"# Agent CPU — {dt.date.today()} ({platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} cores, {platform.machine()})",
        "",
        f"Node: 8 GPUs (fake NVML, 18 NVLink links each), 9 HCAs (real H100 sysfs capture), kernel log followed; "
        f"sink: {sink}. `python bench/bench_agent.py --ticks {args.ticks} --run-s {args.run_s:g} "
        f"--interval {args.interval:g}`",
        "",
        "| measurement | value |",
        "|---|---|",
        f"| CPU per tick (sample + encode + publish) | {a['cpu_ms_per_tick']:.2f} ms |",
    ]
    lines += [f"| &nbsp; of which source `{k}` | {v:.2f} ms |" for k, v in a["per_source_ms"].items()]
    lines += [
        f"| &nbsp; of which encode + buffer + health file | {a['encode_ms']:.2f} ms |",
        f"| &nbsp; of which publish (send + flush, acks=all) | {a['publish_ms']:.2f} ms |",
        f"| telemetry message per tick, 8 GPUs + 9 ports (JSON before lz4) | {a['gpu_only_msg_bytes']:,} B |",
        f"| → % of one core at a {args.interval:g} s interval (per-tick CPU / interval) | {pct_tick:.3f} % |",
        f"| steady state: `Agent.run` for {b['wall_s']:.0f} s ({b['ticks']} ticks, {b['published']} published), "
        f"all threads | {b['cpu_s'] * 1000:.0f} ms CPU → **{b['core_pct']:.3f} % of one core** |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text)


if __name__ == "__main__":
    main()
