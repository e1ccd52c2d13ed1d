"""``bench_replay.py --compare REV``: two versions measured side by side, each run in its own process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_replay  # noqa: E402
from bench_replay import HERE, compare, run_in  # noqa: E402


def _worktrees() -> str:
    return subprocess.run(["git", "-C", str(HERE), "worktree", "list"], capture_output=True, text=True).stdout


def test_versions_alternate_after_one_warm_up_each_and_the_worktree_is_removed(tmp_path) -> None:
    calls: list[Path] = []
    before = _worktrees()

    def fake(root: Path, recording: Path, model: Path | None) -> dict:
        calls.append(root)
        cpu = 10.0 if root == HERE else 20.0  # this tree twice as fast as the revision
        cpu += len(calls) * 0.01             # and no two runs alike
        return {"cpu_s": cpu, "wall_s": cpu, "gpu_samples": 1e6, "per_cpu_s": 1e6 / cpu, "per_wall_s": 1e6 / cpu,
                "read_s": 1.0, "pipeline_s": 2.0, "scoring_s": 3.0, "policy_s": 0.5}

    rows = compare("HEAD", tmp_path / "rec", None, 3, runner=fake)
    rev_root = calls[0]
    assert rev_root != HERE and calls[1] == HERE                       # one warm-up each, the revision first
    assert calls[2:] == [rev_root, HERE] * 3                            # then alternating
    assert [r["name"] for r in rows] == [rows[0]["name"], "this working tree"] and rows[0]["name"].startswith("HEAD (")
    assert len(rows[0]["runs"]) == len(rows[1]["runs"]) == 3            # warm-ups not counted
    assert rows[1]["per_cpu_s"] == pytest.approx(2 * rows[0]["per_cpu_s"], rel=0.01)
    assert not rev_root.exists() and _worktrees() == before


def test_a_model_inside_the_checkout_is_each_revisions_own_and_one_outside_is_shared(tmp_path) -> None:
    seen: dict[Path, set] = {}

    def fake(root: Path, recording: Path, model: Path | None) -> dict:
        seen.setdefault(root, set()).add(model)
        return {"cpu_s": 1.0, "wall_s": 1.0, "gpu_samples": 1.0, "per_cpu_s": 1.0, "per_wall_s": 1.0,
                "read_s": 0.1, "pipeline_s": 0.1, "scoring_s": 0.1, "policy_s": 0.1}

    compare("HEAD", tmp_path / "rec", HERE / "models" / "default", 1, runner=fake)
    assert seen == {r: {r / "models" / "default"} for r in seen} and HERE in seen
    seen.clear()
    compare("HEAD", tmp_path / "rec", tmp_path / "model", 1, runner=fake)   # a model trained elsewhere: shared
    assert all(m == {tmp_path / "model"} for m in seen.values()) and len(seen) == 2


def test_a_revision_git_does_not_know_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="--compare no-such-rev-xyz: git could not check it out"):
        compare("no-such-rev-xyz", Path("rec"), None, 1, runner=lambda *a: {})


def test_one_run_in_its_own_process_replays_with_the_code_it_is_given(tmp_path) -> None:
    from collector.simulator import SimConfig, simulate_recording

    rec = tmp_path / "rec"
    simulate_recording(SimConfig(nodes=2, hours=0.5, seed=3), rec)
    r = run_in(HERE, rec, None)
    assert r["gpu_samples"] == 2 * 8 * 180 and r["per_cpu_s"] > 0
    assert {"read_s", "pipeline_s", "scoring_s", "policy_s"} <= set(r)
    with pytest.raises(RuntimeError, match="failed"):
        run_in(HERE, tmp_path / "missing", None)


def test_runs_below_one_are_refused(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_replay.py", "--runs", "0", "--recording", "x"])
    with pytest.raises(SystemExit):
        bench_replay.main()
    assert "--runs must be at least 1" in capsys.readouterr().err
