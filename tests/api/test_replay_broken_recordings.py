"""``gpuops replay`` on recordings that are empty or broken: one clear line and a non-zero exit
when nothing can be replayed, a valid report (and a warning) when only optional parts are empty."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from api.cli import build_cli
from collector.recording import Manifest, write_recording

T0 = 1_767_225_600.0
NODES = ["gpu-node-001", "gpu-node-002"]
HOURS = 2


def _gpu(t0: float = T0) -> pd.DataFrame:
    ts = np.arange(t0, T0 + HOURS * 3600, 60.0)
    rows = [{"ts": t, "node": n, "gpu": g, "util_gpu": 90.0, "temp_gpu_c": 60.0, "power_w": 400.0,
             "sm_clock_mhz": 1980.0} for t in ts for n in NODES for g in range(2)]
    return pd.DataFrame(rows)


def _net() -> pd.DataFrame:
    ts = np.arange(T0, T0 + HOURS * 3600, 60.0)
    return pd.DataFrame([{"ts": t, "node": n, "device": "mlx5_0", "port": 1, "link_state": "ACTIVE",
                          "symbol_error": 0.0} for t in ts for n in NODES])


def _events() -> list[dict]:
    return [{"ts": T0 + 30, "node": NODES[0], "gpu": 0, "source": "kmsg", "kind": "xid", "code": 13,
             "pci_bus_id": "0000:18:00", "message": "NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception"}]


def _record(path: Path, gpu: pd.DataFrame, net: pd.DataFrame | None = None, events: list | None = None) -> Path:
    manifest = Manifest(start=T0, end=T0 + HOURS * 3600, interval_s=60.0, nodes=NODES, gpus_per_node=2,
                        source="test")
    return write_recording(path, manifest, gpu, net if net is not None else _net(),
                           events if events is not None else _events())


def _replay(path: Path, tmp_path: Path):
    return CliRunner().invoke(build_cli(), ["replay", str(path), "--rules-only", "--report", str(tmp_path / "r.json")])


def _one_error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, output
    return lines[0]


def test_zero_row_gpu_table_ends_with_one_clear_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    rec = _record(tmp_path / "rec", _gpu().iloc[:0])
    res = _replay(rec, tmp_path)
    assert res.exit_code == 2, res.output
    assert not isinstance(res.exception, Exception)  # an exit, not an IndexError from deep inside the pipeline
    assert _one_error_line(res.output) == f"error: {rec / 'gpu.parquet'}: zero rows, so no GPU samples: nothing to replay"
    assert not (tmp_path / "r.json").exists()


def test_gpu_rows_that_all_break_the_contract_end_with_the_reason_and_a_non_zero_exit(tmp_path: Path) -> None:
    gpu = _gpu().assign(node="bad node!")
    res = _replay(_record(tmp_path / "rec", gpu), tmp_path)
    assert res.exit_code == 2, res.output
    line = _one_error_line(res.output)
    assert "no valid GPU sample to replay" in line and "malformed node name" in line


def test_ports_and_events_before_the_first_gpu_sample_are_counted_not_a_crash(tmp_path: Path) -> None:
    res = _replay(_record(tmp_path / "rec", _gpu(t0=T0 + 600)), tmp_path)
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert summary["not_replayed_before_first_gpu_sample"] == {"port_samples": 20, "events": 1}
    assert summary["gpu_samples"] == len(_gpu(t0=T0 + 600))


@pytest.mark.parametrize("empty", ["net", "events"])
def test_an_empty_optional_table_still_gives_a_valid_report(tmp_path: Path, empty: str) -> None:
    rec = _record(tmp_path / "rec", _gpu(), net=_net().iloc[:0] if empty == "net" else None,
                  events=[] if empty == "events" else None)
    if empty == "events":
        assert (rec / "events.jsonl").read_text() == ""
    res = _replay(rec, tmp_path)
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["summary"]["gpu_samples"] == len(_gpu())
    assert rep["summary"]["port_samples"] == (0 if empty == "net" else len(_net()))


@pytest.mark.parametrize("missing", ["start", "nodes", "gpus_per_node", "format"])
def test_manifest_missing_a_field_ends_with_one_line_naming_it(tmp_path: Path, missing: str) -> None:
    rec = _record(tmp_path / "rec", _gpu())
    manifest = json.loads((rec / "manifest.json").read_text())
    del manifest[missing]
    (rec / "manifest.json").write_text(json.dumps(manifest))
    res = _replay(rec, tmp_path)
    assert res.exit_code == 2, res.output
    assert f"'{missing}'" in _one_error_line(res.output)
