"""Small synthetic telemetry for pipeline tests: DataFrames per spec/telemetry.md.

Seeded and tiny, so a test can build exactly the case it needs. (The lead's simulator
recordings replace this where a realistic fleet matters: see ``recording_frames``.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from collector.schema import GPU_COLUMNS, GPU_COUNTERS, IB_COUNTERS, ColumnKind

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, a multiple of 60 s


@dataclass
class Fleet:
    nodes: int = 2
    gpus: int = 4
    ports: int = 2
    samples: int = 30
    interval_s: float = 10.0
    jitter_s: float = 0.0
    seed: int = 0
    t0: float = T0


def gpu_frame(f: Fleet) -> pd.DataFrame:
    """GPU samples: gauges with noise, counters that grow (some reset midway), sorted by ts."""
    rng = np.random.default_rng(f.seed)
    n = f.nodes * f.gpus * f.samples
    k = np.repeat(np.arange(f.samples), f.nodes * f.gpus)
    ts = f.t0 + k * f.interval_s + rng.uniform(0, f.jitter_s, n) if f.jitter_s else f.t0 + k * f.interval_s
    node = np.tile(np.repeat([f"gpu-node-{i:03d}" for i in range(f.nodes)], f.gpus), f.samples)
    gpu = np.tile(np.arange(f.gpus), f.nodes * f.samples)
    cols: dict[str, object] = {"ts": ts, "node": node, "gpu": gpu.astype(np.int16)}
    for c in GPU_COLUMNS:
        if c.kind is ColumnKind.GAUGE and c.name not in cols:
            cols[c.name] = rng.uniform(20, 90, n).astype(np.float32)
    cols["sm_clock_mhz"] = rng.normal(1980, 10, n).astype(np.float32)
    cols["throttle_reasons"] = rng.choice([0, 0x4, 0x8, 0x20 | 0x4, 0x40, 0x80], n).astype(np.float64)
    cols["row_remap_pending"] = rng.integers(0, 2, n).astype(np.float32)
    for c in GPU_COUNTERS:
        inc = rng.poisson(2.0, (f.samples, f.nodes * f.gpus)).astype(np.float64)
        if c.endswith("_us"):
            inc *= 1e5
        cum = np.cumsum(inc, axis=0)
        cols[c] = cum.ravel()
    return pd.DataFrame(cols)


def net_frame(f: Fleet) -> pd.DataFrame:
    """Port samples for f.ports ports per node, one port DOWN on node 0 half the time."""
    rng = np.random.default_rng(f.seed + 1)
    n = f.nodes * f.ports * f.samples
    k = np.repeat(np.arange(f.samples), f.nodes * f.ports)
    df = pd.DataFrame({
        "ts": f.t0 + k * f.interval_s + 0.5,
        "node": np.tile(np.repeat([f"gpu-node-{i:03d}" for i in range(f.nodes)], f.ports), f.samples),
        "device": np.tile([f"mlx5_{p}" for p in range(f.ports)], f.nodes * f.samples),
        "port": np.ones(n, np.int16),
        "link_state": np.where((np.arange(n) % (f.nodes * f.ports) == 0) & (k % 2 == 0), "DOWN", "ACTIVE"),
        "rate_gbps": np.full(n, 400.0, np.float32),
    })
    for c in IB_COUNTERS:
        inc = rng.poisson(1.0, (f.samples, f.nodes * f.ports)).astype(np.float64)
        df[c] = np.cumsum(inc, axis=0).ravel()
    return df


def events_frame(f: Fleet, xids: list[tuple[float, int, int | None, int]]) -> pd.DataFrame:
    """XID events (ts offset from t0, node index, gpu or None, code)."""
    return pd.DataFrame({
        "ts": [f.t0 + dt for dt, _, _, _ in xids],
        "node": [f"gpu-node-{n:03d}" for _, n, _, _ in xids],
        "gpu": pd.array([g for _, _, g, _ in xids], dtype="Int16"),
        "source": "kmsg", "kind": "xid",
        "code": pd.array([c for _, _, _, c in xids], dtype="Int32"),
        "pci_bus_id": None, "message": "NVRM: Xid",
    })


def bmc_events_frame(f: Fleet) -> pd.DataFrame:
    """BMC events as the ipmi source gives them: an inlet and a fan reading per node per minute (each
    node at its own second), a benign SEL entry, and a power supply failing on node 1 half way."""
    from collector.sources.bmc_common import sensor_event

    rng = np.random.default_rng(5)
    rows = []
    for m in range(int(f.samples * f.interval_s // 60)):
        for n in range(f.nodes):
            ts = f.t0 + 60.0 * m + 3.0 + 7.0 * n + rng.uniform(0, 2)
            node = f"gpu-node-{n:03d}"
            rows.append(sensor_event(node, ts, "Inlet Temp", "temperature", float(24 + rng.integers(0, 3) + m),
                                     "degrees C", "ok", {"upper_critical": 45.0}, "ipmi"))
            rows.append(sensor_event(node, ts, "FAN1", "fan", float(7000 - 100 * rng.integers(0, 20)), "RPM", "ok",
                                     {"lower_critical": 1000.0}, "ipmi"))
    mid = f.t0 + f.samples * f.interval_s / 2
    for dt, node, sensor, text, up in ((0.0, 0, "Fan #0x30", "Lower Non-critical going low", True),
                                      (1.0, 1, "Power Supply #0x01", "Failure detected", True)):
        rows.append({"ts": mid + dt, "node": f"gpu-node-{node:03d}", "gpu": None, "source": "bmc", "kind": "sel",
                     "code": 3, "pci_bus_id": None, "sel_id": 3, "sensor": sensor,
                     "sensor_type": sensor.split(" #")[0], "event_text": text, "asserted": up, "message": text})
    df = pd.DataFrame(rows).astype({"gpu": "Int16", "code": "Int32", "pci_bus_id": "string"})
    return df.sort_values("ts", kind="stable").reset_index(drop=True)


def telemetry_messages(gpu: pd.DataFrame, net: pd.DataFrame | None, interval_s: float) -> list[tuple[str, bytes]]:
    """One wire message per node per sampling interval (what a collector sends), in time order.

    Values go through float64 on the wire (a float32 column is widened exactly first), so
    the decoded messages hold exactly what a replay of the same frames reads.
    """
    from collector.wire import TelemetryMessage, encode_telemetry, rows_to_columns

    def groups(df: pd.DataFrame | None) -> dict[tuple[str, int], list[dict]]:
        if df is None or len(df) == 0:
            return {}
        df = df.astype({c: np.float64 for c in df.columns if df[c].dtype == np.float32})
        k = np.floor(df["ts"].to_numpy() / interval_s).astype(np.int64)
        out: dict[tuple[str, int], list[dict]] = {}
        for (node, kk), part in df.assign(_k=k).groupby(["node", "_k"], sort=False):
            out[(node, int(kk))] = part.drop(columns=["_k"]).to_dict("records")
        return out

    g, n = groups(gpu), groups(net)
    msgs = []
    for key in sorted(set(g) | set(n), key=lambda nk: (nk[1], nk[0])):
        rows_g, rows_n = g.get(key, []), n.get(key, [])
        ts = max(r["ts"] for r in rows_g + rows_n)
        msg = TelemetryMessage(node=key[0], ts=ts, gpu=rows_to_columns(rows_g) if rows_g else {},
                               net=rows_to_columns(rows_n) if rows_n else {})
        msgs.append((key[0], encode_telemetry(msg)))
    return msgs


def event_messages(events: pd.DataFrame) -> list[tuple[str, bytes]]:
    """One ``gpu.events`` message per event row."""
    from collector.wire import encode_event

    out = []
    for r in events.to_dict("records"):
        r = {k: (None if v is pd.NA else v) for k, v in r.items()}
        out.append((r["node"], encode_event(r)))
    return out
