"""Recordings follow spec/recording.md: round trips, other writers' layouts, clear errors, streaming."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from collector.recording import Manifest, RecordingError, open_recording, write_recording


def manifest(**kw):
    base = dict(start=1000.0, end=1600.0, interval_s=10.0, nodes=["n1", "n2"], gpus_per_node=2, source="test")
    base.update(kw)
    return Manifest(**base)


def gpu_frame(n_ticks=60, nodes=("n1", "n2"), gpus=2, seed=0):
    rng = np.random.default_rng(seed)
    rows = [(1000.0 + t * 10, nd, g) for t in range(n_ticks) for nd in nodes for g in range(gpus)]
    df = pd.DataFrame(rows, columns=["ts", "node", "gpu"])
    df["gpu"] = df["gpu"].astype("int16")
    df["util_gpu"] = rng.uniform(0, 100, len(df)).astype("float32")
    df["ecc_sbe_vol"] = np.arange(len(df), dtype=float)
    return df


def write_like_pandas(path, gpu, man, net=None, events_lines=None, incidents_lines=None, gz=False):
    """A recording as another tool would write it: pandas and json only."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text(json.dumps(man))
    gpu.to_parquet(path / "gpu.parquet", index=False)
    if net is not None:
        net.to_parquet(path / "net.parquet", index=False)
    for stem, lines in (("events", events_lines), ("incidents", incidents_lines)):
        if lines is not None:
            data = "".join(json.dumps(x) + "\n" for x in lines).encode()
            if gz:
                (path / f"{stem}.jsonl.gz").write_bytes(gzip.compress(data))
            else:
                (path / f"{stem}.jsonl").write_bytes(data)


def test_recording_round_trips_through_parquet_and_jsonl(tmp_path):
    gpu = gpu_frame()
    events = [{"ts": 1015.0, "node": "n1", "gpu": 1, "source": "kmsg", "kind": "xid", "code": 48,
               "pci_bus_id": "0000:3b:00", "message": "NVRM: Xid (PCI:0000:3b:00): 48, DBE"}]
    incidents = [{"id": "inc-1", "node": "n1", "gpu": 1, "fault": "hbm_ecc", "onset_ts": 1005.0,
                  "failure_ts": 1015.0, "predictable": True, "action": "reset", "note": ""}]
    write_recording(tmp_path / "r", manifest(), gpu, events=events, incidents=incidents)
    rec = open_recording(tmp_path / "r")
    back = rec.read_all()
    assert len(back) == len(gpu)
    np.testing.assert_array_equal(back["ecc_sbe_vol"].to_numpy(), gpu.sort_values("ts", kind="stable")["ecc_sbe_vol"])
    assert rec.events()["code"].tolist() == [48]
    assert rec.incidents() == incidents
    assert rec.manifest.nodes == ["n1", "n2"] and rec.manifest.node_days == pytest.approx(2 * 600 / 86400)


def test_unsorted_directory_of_parquet_with_gzip_jsonl_reads_sorted(tmp_path):
    gpu = gpu_frame().sample(frac=1.0, random_state=3)  # shuffled
    root = tmp_path / "r"
    (root / "gpu.parquet").mkdir(parents=True)
    for k, part in enumerate(gpu.iloc[i:i + 80] for i in range(0, len(gpu), 80)):
        part.to_parquet(root / "gpu.parquet" / f"part-{k}.parquet", index=False)
    (root / "manifest.json").write_text(json.dumps(manifest().to_json()))
    (root / "events.jsonl.gz").write_bytes(gzip.compress(b'{"ts": 1200.0, "node": "n2", "source": "kmsg", '
                                                         b'"kind": "xid", "code": 79}\n'))
    rec = open_recording(root)
    windows = list(rec.iter_windows(120))
    ts = np.concatenate([w.gpu["ts"].to_numpy() for w in windows])
    assert len(ts) == len(gpu) and np.all(np.diff(ts) >= 0)
    assert sum(len(w.events) for w in windows) == 1


def test_spilled_read_of_a_large_unsorted_recording_equals_the_in_memory_read(tmp_path):
    gpu = gpu_frame(n_ticks=120).sample(frac=1.0, random_state=1)
    write_like_pandas(tmp_path / "r", gpu, manifest(end=2200.0).to_json())
    in_mem = [w.gpu for w in open_recording(tmp_path / "r").iter_windows(300)]
    spilled = [w.gpu for w in open_recording(tmp_path / "r", sort_budget_bytes=1).iter_windows(300)]
    assert len(in_mem) == len(spilled) == 4
    for a, b in zip(in_mem, spilled):
        pd.testing.assert_frame_equal(a, b)


def test_rows_that_break_the_contract_are_returned_with_reasons_not_dropped(tmp_path):
    gpu = gpu_frame(n_ticks=3)
    gpu.loc[0, "ts"] = np.inf
    gpu.loc[1, "node"] = "bad node!"
    write_like_pandas(tmp_path / "r", gpu, manifest().to_json())
    windows = list(open_recording(tmp_path / "r").iter_windows(60))
    rejected = pd.concat([w.rejected for w in windows])
    assert sorted(rejected["reason"]) == ["malformed node name 'bad node!'", "non-finite timestamp"]
    assert sum(len(w.gpu) for w in windows) == len(gpu) - 2


def test_missing_optional_columns_and_other_node_names_are_fine(tmp_path):
    gpu = pd.DataFrame({"ts": [5.0, 1.0], "node": ["dgx-a100.rack7", "dgx-a100.rack7"], "gpu": [0, 0]})
    write_like_pandas(tmp_path / "r", gpu, manifest(nodes=["dgx-a100.rack7"], start=0.0, end=10.0).to_json())
    back = open_recording(tmp_path / "r").read_all()
    assert back["ts"].tolist() == [1.0, 5.0] and back["temp_gpu_c"].isna().all()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda p: (p / "manifest.json").unlink(), "missing manifest.json"),
        (lambda p: (p / "gpu.parquet").unlink(), "missing gpu.parquet"),
        (lambda p: (p / "manifest.json").write_text(json.dumps(manifest(version=2).to_json())), "unsupported version 2"),
        (lambda p: (p / "manifest.json").write_text("{"), "not valid JSON"),
        (lambda p: (p / "manifest.json").write_text(json.dumps({**manifest().to_json(), "nodes": "n1"})),
         "'nodes' must be a list"),
        (lambda p: pd.DataFrame({"ts": ["x"], "node": ["n1"], "gpu": [0]}).to_parquet(p / "gpu.parquet"),
         "column 'ts' has type string"),
        (lambda p: pd.DataFrame({"ts": [1.0], "node": ["n1"]}).to_parquet(p / "gpu.parquet"),
         "missing required column 'gpu'"),
        (lambda p: (p / "gpu.parquet").write_bytes(b"not parquet"), "not readable as Parquet"),
    ],
)
def test_invalid_recording_fails_with_a_clear_error(tmp_path, mutate, message):
    write_recording(tmp_path / "r", manifest(), gpu_frame(n_ticks=2))
    mutate(tmp_path / "r")
    with pytest.raises(RecordingError, match=message):
        open_recording(tmp_path / "r")


def test_bad_incident_line_names_the_line(tmp_path):
    write_like_pandas(tmp_path / "r", gpu_frame(2), manifest().to_json(),
                      incidents_lines=[{"node": "n1", "fault": "gremlins", "failure_ts": 1.0}])
    with pytest.raises(RecordingError, match="incident 1: unknown fault class 'gremlins'"):
        open_recording(tmp_path / "r").incidents()


def test_streaming_windows_hold_only_their_own_rows(tmp_path):
    write_recording(tmp_path / "r", manifest(end=1000.0 + 10 * 600), gpu_frame(n_ticks=600))
    rec = open_recording(tmp_path / "r")
    sizes = [len(w.gpu) for w in rec.iter_windows(600)]
    assert len(sizes) == 10 and max(sizes) == 60 * 4
    assert all((w.gpu["ts"] >= w.start).all() and (w.gpu["ts"] < w.end).all() for w in rec.iter_windows(600))


def test_directory_whose_files_differ_in_optional_columns_reads_every_row(tmp_path):
    root = tmp_path / "r"
    (root / "gpu.parquet").mkdir(parents=True)
    gpu_frame(n_ticks=5).to_parquet(root / "gpu.parquet" / "h0.parquet", index=False)
    later = gpu_frame(n_ticks=5).assign(ts=lambda d: d["ts"] + 50, temp_gpu_c=61.0).drop(columns=["util_gpu"])
    later.to_parquet(root / "gpu.parquet" / "h1.parquet", index=False)
    (root / "manifest.json").write_text(json.dumps(manifest().to_json()))
    windows = list(open_recording(root).iter_windows(30))
    gpu = pd.concat([w.gpu for w in windows])
    assert len(gpu) == 40 and gpu["temp_gpu_c"].notna().sum() == 20 and gpu["util_gpu"].notna().sum() == 20


def test_selected_columns_are_the_only_ones_read_besides_the_required_keys(tmp_path):
    write_recording(tmp_path / "r", manifest(), gpu_frame())
    windows = list(open_recording(tmp_path / "r").iter_windows(300, columns={"gpu": ["util_gpu"]}))
    assert all(list(w.gpu.columns) == ["ts", "node", "gpu", "util_gpu"] for w in windows)
    assert sum(len(w.gpu) for w in windows) == len(gpu_frame())


def test_selected_optional_column_absent_from_the_files_reads_as_null(tmp_path):
    gpu = pd.DataFrame({"ts": [1.0, 5.0], "node": ["n1", "n1"], "gpu": [0, 1]})
    write_like_pandas(tmp_path / "r", gpu, manifest(start=0.0, end=10.0).to_json())
    cols = {"gpu": ["temp_gpu_c", "throttle_reasons", "gpu_uuid", "not_in_contract_or_file"]}
    (w,) = open_recording(tmp_path / "r").iter_windows(60, columns=cols)
    assert list(w.gpu.columns) == ["ts", "node", "gpu", "gpu_uuid", "temp_gpu_c", "throttle_reasons"]
    assert w.gpu["temp_gpu_c"].isna().all() and w.gpu["gpu_uuid"].isna().all()
    assert w.gpu["throttle_reasons"].isna().all() and w.gpu["temp_gpu_c"].dtype == np.float32


@pytest.mark.parametrize("budget", [None, 1 << 30, 1], ids=["time-ordered", "sorted-in-memory", "spilled"])
def test_unknown_extra_columns_survive_when_every_column_is_read(tmp_path, budget):
    gpu = gpu_frame(n_ticks=6).assign(vendor_code=lambda d: np.arange(len(d)), vendor_tag="x")
    if budget is not None:
        gpu = gpu.sample(frac=1.0, random_state=2)
    write_like_pandas(tmp_path / "r", gpu, manifest().to_json())
    kw = {} if budget is None else {"sort_budget_bytes": budget}
    back = pd.concat([w.gpu for w in open_recording(tmp_path / "r", **kw).iter_windows(30)], ignore_index=True)
    assert sorted(back["vendor_code"]) == list(range(len(gpu))) and set(back["vendor_tag"]) == {"x"}
    assert (back["vendor_code"].to_numpy() // 4 == (back["ts"].to_numpy() - 1000) // 10).all()  # rows kept whole


@pytest.mark.parametrize("budget", [None, 1 << 30, 1], ids=["time-ordered", "sorted-in-memory", "spilled"])
def test_bad_rows_are_set_aside_with_the_same_reasons_whatever_the_read_path(tmp_path, budget):
    gpu = gpu_frame(n_ticks=6)
    gpu["gpu"] = gpu["gpu"].astype(float)
    gpu.loc[[0, 3], "ts"] = [np.inf, np.nan]
    gpu.loc[[5, 9], "node"] = ["bad node!", None]
    gpu.loc[7, "gpu"] = 1.5
    gpu.loc[8, "util_gpu"] = np.nan  # optional: kept as NaN
    if budget is not None:
        gpu = gpu.sample(frac=1.0, random_state=4)
    write_like_pandas(tmp_path / "r", gpu, manifest().to_json())
    kw = {} if budget is None else {"sort_budget_bytes": budget}
    windows = list(open_recording(tmp_path / "r", **kw).iter_windows(30, columns={"gpu": ["util_gpu"]}))
    rejected = pd.concat([w.rejected for w in windows])
    expected = {"non-finite timestamp", "missing required field 'ts'", "malformed node name 'bad node!'",
                "missing required field 'node'", "field 'gpu' must be an integer"}
    assert sorted(rejected["reason"]) == sorted(expected) and set(rejected["table"]) == {"gpu"}
    valid = pd.concat([w.gpu for w in windows])
    assert len(valid) + len(rejected) == len(gpu) and valid["util_gpu"].isna().sum() == 1
    assert valid["gpu"].dtype == np.int16 and valid["util_gpu"].dtype == np.float32


def test_rows_without_a_timestamp_in_a_later_row_group_are_rejected_not_lost(tmp_path):
    gpu = gpu_frame(n_ticks=100, nodes=("n1",), gpus=4)
    gpu.loc[300, "ts"] = np.nan  # written as null; row-group statistics leave it out
    (tmp_path / "r").mkdir()
    gpu.to_parquet(tmp_path / "r" / "gpu.parquet", index=False, row_group_size=50)
    (tmp_path / "r" / "manifest.json").write_text(json.dumps(manifest(end=2000.0).to_json()))
    windows = list(open_recording(tmp_path / "r").iter_windows(100))
    rejected = pd.concat([w.rejected for w in windows])
    assert rejected["reason"].tolist() == ["missing required field 'ts'"]
    assert sum(len(w.gpu) for w in windows) == len(gpu) - 1
