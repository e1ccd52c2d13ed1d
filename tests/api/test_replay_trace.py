"""``gpuops replay --trace``: one node's (or GPU's) every tick as CSV, agreeing with the report."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from api.cli import build_cli
from api.replay_trace import HEAD, TraceTarget, feature_columns
from pipeline.features import FEATURE_NAMES


def test_a_target_is_a_node_or_one_gpu_of_it() -> None:
    assert TraceTarget.parse("gpu-node-007") == TraceTarget("gpu-node-007")
    assert TraceTarget.parse(" gpu-node-007:3 ") == TraceTarget("gpu-node-007", 3)
    for bad in ("gpu-node-007:x", "gpu-node-007:", ":3", ""):
        with pytest.raises(ValueError, match="NODE|index"):
            TraceTarget.parse(bad)


def test_an_unknown_feature_is_refused_with_the_nearest_names() -> None:
    assert feature_columns(None) == list(FEATURE_NAMES)
    assert feature_columns(["ecc_sbe_cusum", "power_w_mean_short", "ecc_sbe_cusum"]) == ["ecc_sbe_cusum",
                                                                                         "power_w_mean_short"]
    with pytest.raises(ValueError, match="did you mean ecc_sbe_per_h_short"):
        feature_columns(["ecc_sbe_per_hour_short"])


@pytest.fixture(scope="module")
def traced(small_recording, tmp_path_factory):
    """The recording replayed once, tracing the node and GPU of its first incident with a decision."""
    out = tmp_path_factory.mktemp("trace")
    first = json.loads((small_recording / "incidents.jsonl").read_text().splitlines()[0])
    node, gpu = first["node"], first["gpu"]
    other = next(json.loads(line) for line in (small_recording / "incidents.jsonl").read_text().splitlines()
                 if json.loads(line)["node"] != node and json.loads(line)["gpu"] is not None)
    res = CliRunner().invoke(build_cli(), [
        "replay", str(small_recording), "--report", str(out / "r.json"), "--trace", node,
        "--trace", f"{other['node']}:{other['gpu']}", "--trace-out", str(out / "t.csv"),
        "--trace-features", "ecc_sbe_per_h_short,pcie_replay_per_min_short"])
    assert res.exit_code == 0, res.output
    return (json.loads((out / "r.json").read_text()), pd.read_csv(out / "t.csv", dtype={"decision": str}),
            node, gpu, other, res.output)


def test_the_trace_holds_every_tick_of_each_target_and_only_them(traced) -> None:
    rep, t, node, _, other, output = traced
    assert list(t.columns) == [*HEAD, "ecc_sbe_per_h_short", "pcie_replay_per_min_short"]
    per_part = t.groupby(["node", "gpu"]).size()
    assert set(per_part.index) == {(node, g) for g in range(8)} | {(other["node"], other["gpu"])}
    assert per_part.nunique() == 1  # every traced GPU on every tick (this fleet never goes silent)
    assert (t.groupby(["node", "gpu"])["ts"].apply(lambda s: s.is_monotonic_increasing)).all()
    assert f"trace: {len(t):,} rows (2 features)" in " ".join(output.split())
    assert t["p_fail"].between(0, 1).all() and t["anomaly"].between(0, 1).all()


def test_every_decision_of_the_report_on_a_traced_part_is_on_its_row(traced) -> None:
    rep, t, node, _, other, _ = traced
    mine = [d for d in rep["decisions"]
            if d["node"] == node or (d["node"] == other["node"] and d["gpu"] in (None, other["gpu"]))]
    assert mine, "the incidents' nodes were acted on"
    for d in mine:
        rows = t[(t["ts"] == d["ts"]) & (t["node"] == d["node"])]
        if d["gpu"] is not None:
            rows = rows[rows["gpu"] == d["gpu"]]
        assert len(rows) and rows["decision"].str.contains(d["reason"], regex=False).all(), d
    assert t["decision"].notna().sum() >= len(mine)


def test_the_first_incident_gpu_shows_the_signal_the_decision_read(traced) -> None:
    rep, t, node, gpu, _, _ = traced
    acted = [d for d in rep["decisions"] if d["node"] == node and d["action"] in ("drain", "reset")]
    assert acted
    row = t[(t["ts"] == acted[0]["ts"]) & (t["gpu"] == (acted[0]["gpu"] if acted[0]["gpu"] is not None else gpu))]
    assert row["fault"].iloc[0] == acted[0]["fault"] or row["rule_fault"].iloc[0] == acted[0]["fault"]


def test_through_the_dry_run_engine_the_trace_shows_the_engines_decisions(small_recording, tmp_path) -> None:
    safety = Path(__file__).resolve().parents[2] / "deploy" / "config" / "safety.example.yaml"
    first = json.loads((small_recording / "incidents.jsonl").read_text().splitlines()[0])
    res = CliRunner().invoke(build_cli(), ["replay", str(small_recording), "--report", str(tmp_path / "r.json"),
                                           "--safety", str(safety), "--trace", first["node"],
                                           "--trace-out", str(tmp_path / "t.csv"), "--trace-features", "ecc_sbe_cusum"])
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "r.json").read_text())
    t = pd.read_csv(tmp_path / "t.csv", dtype={"decision": str})
    mine = [d for d in rep["decisions"] if d["node"] == first["node"]]
    assert mine and t["decision"].notna().sum() >= len(mine)
    for d in mine:
        assert t[(t["ts"] == d["ts"])]["decision"].fillna("").str.contains(d["reason"], regex=False).any(), d


def test_a_mistyped_node_fails_after_the_report_naming_the_nodes_there(small_recording, tmp_path) -> None:
    res = CliRunner().invoke(build_cli(), ["replay", str(small_recording), "--report", str(tmp_path / "r.json"),
                                           "--trace", "gpu-node-0003", "--trace-out", str(tmp_path / "t.csv")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "no scored GPU matched gpu-node-0003" in text and "gpu-node-001" in text
    assert (tmp_path / "r.json").exists()  # the replay's work is kept
    assert list(pd.read_csv(tmp_path / "t.csv").columns[:len(HEAD)]) == list(HEAD)


@pytest.mark.parametrize("args, why", [
    (["--trace-features", "ecc_sbe_cusum"], "needs --trace"),
    (["--trace", "n1", "--trace-features", "nope_per_min"], "not a feature gpuops computes"),
    (["--trace", "n1:one"], "must be an index"),
    (["--trace", "n1", "--trace-out", "/no/such/dir/t.csv"], "does not exist"),
])
def test_bad_trace_arguments_fail_before_the_replay(small_recording, tmp_path, args, why) -> None:
    res = CliRunner().invoke(build_cli(), ["replay", str(small_recording), "--report", str(tmp_path / "r.json"),
                                           *args])
    assert res.exit_code == 2 and why in " ".join(res.output.split())
    assert not (tmp_path / "r.json").exists()
