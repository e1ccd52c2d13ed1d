"""``gpuops simulate``: the home world by default, a randomized world on request, recorded in the manifest."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from api.cli import build_cli
from collector.xid import catalog


def test_randomized_world_is_drawn_from_the_named_ranges_and_uses_every_restart_app_xid(tmp_path):
    out = tmp_path / "rec"
    res = CliRunner().invoke(build_cli(), ["simulate", "--out", str(out), "--nodes", "3", "--hours", "0.5",
                                           "--seed", "201", "--world", "randomized", "--world-ranges", "shift-h200"])
    assert res.exit_code == 0, res.output
    world = json.loads((out / "manifest.json").read_text())["world"]
    assert world["ranges"] == "shift-h200" and set(world["nodes"]["generation"]) == {"H200"}
    restart_app = sorted(c for c, e in catalog().items() if e.immediate_action == "RESTART_APP")
    assert world["range_values"]["app_xid_codes"] == restart_app and 94 in restart_app


def test_the_default_world_is_home_and_an_unknown_one_is_refused(tmp_path):
    res = CliRunner().invoke(build_cli(), ["simulate", "--out", str(tmp_path / "a"), "--nodes", "2", "--hours", "0.2"])
    assert res.exit_code == 0, res.output
    assert "world" not in json.loads((tmp_path / "a" / "manifest.json").read_text())
    bad = CliRunner().invoke(build_cli(), ["simulate", "--out", str(tmp_path / "b"), "--nodes", "2", "--hours", "0.2",
                                           "--world", "randomized", "--world-ranges", "shift-nowhere"])
    assert bad.exit_code != 0 and "valid:" in bad.output
