"""Events are streamed by window: each window holds the same events, in the same order, as
the whole events table read, validated, sorted by ts (stable) and sliced by window, as the
reader did before; on a simulated recording with BMC readings and on files whose lines are
out of order, in memory bounded by the window."""

from __future__ import annotations

import gzip
import logging
import math

import numpy as np
import orjson
import pandas as pd
import pytest

from collector.recording import open_recording
from collector.recording.events import EventWindows, scan_events
from collector.recording.jsonl import read_jsonl
from collector.schema import FaultClass, RecordType, validate_frame
from collector.simulator import SimConfig, simulate_recording

WINDOW_S, ALIGN = 1800.0, 60.0


def _plain(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v.item() if isinstance(v, np.generic) else v


def _null(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def records(df: pd.DataFrame) -> list[dict]:
    """Rows as dicts without their null fields (a field an event lacks reads as NaN or None)."""
    return [{k: _plain(v) for k, v in r.items() if not (not isinstance(v, (list, np.ndarray)) and _null(v))}
            for r in df.to_dict("records")]


def whole_read_windows(root, window_s=WINDOW_S, align=ALIGN, events_file="events.jsonl"):
    """The windows' events as the reader made them before streaming: one frame of every line's
    dict, validated, sorted by ts (stable), sliced by window on the tables' and events' range."""
    rows, _ = read_jsonl(root / events_file)
    ev = validate_frame(pd.DataFrame(rows), RecordType.EVENT).valid
    ev = ev.sort_values("ts", kind="stable").reset_index(drop=True)
    rec = open_recording(root)
    spans = [rec.read_all(t)["ts"] for t in ("gpu", "net")] + [ev["ts"]]
    lo = min(float(s.min()) for s in spans if len(s))
    hi = max(float(s.max()) for s in spans if len(s))
    lo = math.floor(lo / align) * align
    ts = ev["ts"].to_numpy()
    out = {}
    for k in range(int(math.floor((hi - lo) / window_s)) + 1):
        i0, i1 = np.searchsorted(ts, [lo + k * window_s, lo + (k + 1) * window_s])
        if i1 > i0:
            out[lo + k * window_s] = records(ev.iloc[i0:i1])
    return out


def streamed_windows(root, window_s=WINDOW_S, align=ALIGN):
    return {w.start: records(w.events) for w in open_recording(root).iter_windows(window_s, align=align)
            if len(w.events)}


def _maintenance(ts: float, node: str) -> dict:
    return {"ts": ts, "node": node, "source": "operator", "kind": "maintenance", "nodes": [node, "gpu-node-001"],
            "start": ts + 60, "end": ts + 1800, "reason": "PSU swap", "author": "ops"}


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """4 h of 6 nodes with BMC readings, SEL entries and XIDs, and two operator maintenance
    events put in time order among the lines (their ``nodes`` lists are extra fields)."""
    root = tmp_path_factory.mktemp("events") / "sim"
    cfg = SimConfig(nodes=6, gpus_per_node=2, ports_per_node=1, hours=4, seed=3, rate_multiplier=300,
                    mix={FaultClass.POWER: 1.0, FaultClass.THERMAL: 1.0, FaultClass.HBM_ECC: 1.0})
    simulate_recording(cfg, root)
    lines = (root / "events.jsonl").read_bytes().splitlines()
    t0 = orjson.loads(lines[0])["ts"]
    for ts, node in ((t0 + 3600.5, "gpu-node-003"), (t0 + 7300.0, "gpu-node-005")):
        at = next(i for i, ln in enumerate(lines) if orjson.loads(ln)["ts"] > ts)
        lines.insert(at, orjson.dumps(_maintenance(ts, node)))
    (root / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return root


def _copy_with_events(src, dst, lines: list[bytes], gz: bool = False):
    dst.mkdir()
    for name in ("manifest.json", "gpu.parquet", "net.parquet"):
        (dst / name).write_bytes((src / name).read_bytes())
    data = b"\n".join(lines) + b"\n"
    if gz:
        (dst / "events.jsonl.gz").write_bytes(gzip.compress(data))
    else:
        (dst / "events.jsonl").write_bytes(data)
    return dst


def test_streamed_windows_hold_the_same_events_in_the_same_order_as_the_whole_read(simulated):
    want = whole_read_windows(simulated)
    got = streamed_windows(simulated)
    assert got == want
    kinds = {e["kind"] for evs in got.values() for e in evs}
    assert {"bmc_sensor", "maintenance"} <= kinds
    assert sum(map(len, got.values())) == scan_events(simulated / "events.jsonl").lines
    assert scan_events(simulated / "events.jsonl").lag == 0.0


def test_a_file_with_shuffled_lines_gives_the_same_windows_with_a_warning(simulated, tmp_path, caplog):
    lines = (simulated / "events.jsonl").read_bytes().splitlines()
    np.random.default_rng(7).shuffle(lines)
    root = _copy_with_events(simulated, tmp_path / "shuffled", lines, gz=True)
    with caplog.at_level(logging.WARNING, logger="collector.recording.events"):
        got = streamed_windows(root)
    assert got == whole_read_windows(root, events_file="events.jsonl.gz")
    assert any("out of time order" in r.getMessage() for r in caplog.records)


def test_lines_a_little_out_of_order_are_put_in_order_holding_little_more_than_a_window(simulated, tmp_path,
                                                                                         caplog):
    lines = (simulated / "events.jsonl").read_bytes().splitlines()
    mixed = [ln for i in range(0, len(lines), 40) for ln in reversed(lines[i:i + 40])]  # blocks written backwards
    root = _copy_with_events(simulated, tmp_path / "blocks", mixed)
    scan = scan_events(root / "events.jsonl")
    assert 0 < scan.lag < 300
    with caplog.at_level(logging.WARNING, logger="collector.recording.events"):
        got = streamed_windows(root)
    assert got == whole_read_windows(root)
    assert not caplog.records
    per_window = max(map(len, got.values()))
    reader = EventWindows(root / "events.jsonl", scan, math.floor(scan.lo / ALIGN) * ALIGN, WINDOW_S, 10)
    held = []
    for k in range(10):
        reader.window(k)
        held.append(reader.held)
    reader.close()
    assert 0 < max(held) < per_window / 2  # what is held past a window: its lag's worth, not the file


def test_bad_lines_neither_move_the_window_grid_nor_reach_a_window(simulated, tmp_path, caplog):
    lines = (simulated / "events.jsonl").read_bytes().splitlines()
    t0 = orjson.loads(lines[0])["ts"]
    bad = [b"not json", orjson.dumps({"ts": "soon", "node": "gpu-node-001", "source": "kmsg", "kind": "xid"}),
           orjson.dumps({"ts": t0 - 86400.0, "source": "kmsg", "kind": "xid", "code": 79}),  # no node: invalid
           orjson.dumps({"ts": t0 + 100.0, "node": "gpu-node-002", "source": "kmsg", "kind": "xid", "code": 79.5})]
    root = _copy_with_events(simulated, tmp_path / "bad", lines[:50] + bad + lines[50:])
    rec = open_recording(root)
    assert rec._time_range() == open_recording(simulated)._time_range()
    with caplog.at_level(logging.WARNING, logger="collector.recording.events"):
        got = streamed_windows(root)
    assert got == whole_read_windows(root) == whole_read_windows(simulated)
    assert any("4 event lines rejected" in r.getMessage() for r in caplog.records)


def test_windows_outside_an_explicit_range_get_no_events(simulated):
    rec = open_recording(simulated)
    lo, hi = rec._time_range()
    start, end = lo + 3000.0, lo + 6000.0
    evs = pd.concat([w.events for w in rec.iter_windows(600, start=start, end=end)])
    whole = rec.events()
    assert records(evs) == records(whole[(whole["ts"] >= start) & (whole["ts"] < start + 600 * 6)])


def test_a_filtered_read_gives_the_whole_reads_rows_of_those_sources_and_kinds(simulated):
    rec = open_recording(simulated)
    whole = rec.events()
    ops = rec.events(sources=("operator",))
    assert len(ops) == 2 and ops["nodes"].map(len).tolist() == [2, 2]
    assert records(ops) == records(whole[whole["source"] == "operator"])
    sel = rec.events(sources=("bmc",), kinds=("sel", "xid"))
    assert records(sel) == records(whole[(whole["source"] == "bmc") & (whole["kind"] == "sel")])


def test_a_filtered_read_judges_the_parsed_event_not_the_words_on_its_line(simulated, tmp_path):
    lines = (simulated / "events.jsonl").read_bytes().splitlines()
    t0 = orjson.loads(lines[0])["ts"]
    extra = [orjson.dumps({"ts": t0 + 5.0, "node": "gpu-node-001", "source": "kmsg", "kind": "xid", "code": 79,
                           "message": 'paged the "operator" about it'}),
             orjson.dumps({"kind": "maintenance", "source": "operator", "node": "gpu-node-002", "ts": t0 + 6.0,
                           "nodes": ["gpu-node-002"], "start": t0 + 6.0, "end": t0 + 600.0, "reason": "re-cable"})]
    root = _copy_with_events(simulated, tmp_path / "words", lines[:10] + extra + lines[10:])
    ops = open_recording(root).events(sources=("operator",))
    assert ops["source"].tolist() == ["operator"] * 3 and ops["ts"].iloc[0] == t0 + 6.0
    xids = open_recording(root).events(kinds=("xid",))
    assert (xids["kind"] == "xid").all() and t0 + 5.0 in set(xids["ts"])


@pytest.mark.parametrize("block_bytes", [1, 3000, None])
def test_a_scan_by_blocks_of_any_size_gives_what_a_line_by_line_scan_gives(simulated, tmp_path, monkeypatch,
                                                                            caplog, block_bytes):
    """Blocks whose lines all start with their ts are scanned in bulk, any other block line by
    line. On a file with lines out of order, bad lines and lines whose ts is not first, the scan,
    the windows and the rejections are those of the line-by-line scan, whatever the block size
    (one line; a few lines, so blocks of both kinds; the default)."""
    from collector.recording import blocks, events

    lines = (simulated / "events.jsonl").read_bytes().splitlines()
    t0 = orjson.loads(lines[0])["ts"]
    mixed = [ln for i in range(0, len(lines), 40) for ln in reversed(lines[i:i + 40])]
    odd = [b"not json", b"", orjson.dumps({"node": "gpu-node-001", "ts": t0 + 50.0, "source": "kmsg", "kind": "xid",
                                           "code": 79}),  # ts not first: parsed to be read
           orjson.dumps({"ts": t0 - 86400.0, "source": "kmsg", "kind": "xid", "code": 79}),  # invalid, far early
           orjson.dumps({"ts": t0 + 100.0, "node": "gpu-node-002", "source": "kmsg", "kind": "xid", "code": 79.5})]
    root = _copy_with_events(simulated, tmp_path / "odd", mixed[:300] + odd + mixed[300:])
    path = root / "events.jsonl"

    def read() -> tuple:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="collector.recording.events"):
            got = streamed_windows(root)
        return scan_events(path), got, [r.getMessage() for r in caplog.records]

    if block_bytes:
        monkeypatch.setattr(blocks, "BLOCK_BYTES", block_bytes)
    bulk = read()
    monkeypatch.setattr(events, "leading_ts", lambda block: None)   # every block line by line
    assert bulk == read()
    assert bulk[0].lag > 0 and bulk[1] == whole_read_windows(root)
    assert any("event lines rejected" in m for m in bulk[2])


def test_operator_events_read_with_the_scan_are_the_filtered_reads(simulated):
    """The first filtered read of a recording scans the file too (one pass for a replay): the same
    rows as a filtered read alone, and the same scan as a scan alone."""
    rec = open_recording(simulated)
    ops = rec.events(sources=("operator",))
    assert rec._event_scan == scan_events(simulated / "events.jsonl")
    assert records(ops) == records(open_recording(simulated).events()[lambda d: d["source"] == "operator"])
    assert len(ops) == 2
