"""``gpuops train``: a whole model, or the anomaly detector alone on top of a model that is kept."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from api.cli import build_cli
from collector.simulator import SimConfig, simulate_recording


def test_the_anomaly_detector_alone_is_refit_on_top_of_a_kept_model(tmp_path):
    rec = tmp_path / "rec"
    simulate_recording(SimConfig(nodes=6, hours=6, seed=6, rate_multiplier=1500), rec)
    whole = CliRunner().invoke(build_cli(), ["train", str(rec), "--out", str(tmp_path / "m1")])
    assert whole.exit_code == 0, whole.output
    # a wide console: the message names two temporary paths, and rich wraps at the terminal's width
    res = CliRunner().invoke(build_cli(), ["train", str(rec), "--out", str(tmp_path / "m2"), "--anomaly-only",
                                           "--base", str(tmp_path / "m1"), "--seed", "3"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert "anomaly detector refit on" in res.output and str(tmp_path / "m1") in res.output
    m1, m2 = (json.loads((tmp_path / d / "model.json").read_text()) for d in ("m1", "m2"))
    assert m2["training"] == m1["training"] and m2["inputs"]["classifier"] == m1["inputs"]["classifier"]
    assert m2["anomaly_training"]["settings"]["seed"] == 3 and "anomaly_training" not in m1


def test_a_base_without_anomaly_only_is_refused(tmp_path):
    res = CliRunner().invoke(build_cli(), ["train", str(tmp_path), "--out", str(tmp_path / "m"), "--base", str(tmp_path)])
    assert res.exit_code == 2 and "--base goes with --anomaly-only" in res.output
