"""Scheduled retraining activates a new model only if it beats the current one on held-out data."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from api.retrain import beats, retrain
from models.bundle import default_model_path
from remediation.config import PolicyConfig


def test_better_recall_with_no_more_false_actions_beats() -> None:
    cur = {"recall": 0.8, "predictive_recall": 0.5, "false_actions_per_1k_node_days": 10.0}
    ok, why = beats({**cur, "predictive_recall": 0.6}, cur)
    assert ok and "predictive_recall" in why


def test_more_false_actions_never_beats_even_with_better_recall() -> None:
    cur = {"recall": 0.8, "predictive_recall": 0.5, "false_actions_per_1k_node_days": 10.0}
    ok, why = beats({"recall": 0.9, "predictive_recall": 0.7, "false_actions_per_1k_node_days": 11.0}, cur)
    assert not ok and "false_actions" in why


def test_equal_is_not_better() -> None:
    cur = {"recall": 0.8, "predictive_recall": 0.5, "false_actions_per_1k_node_days": 10.0}
    assert beats(dict(cur), cur)[0] is False


class CopyingRegistry:
    """A model registry whose training 'produces' a copy of the shipped model (our own boundary)."""

    def __init__(self, root: Path) -> None:
        self.root, self.activated, self._active = root, [], None

    def train(self, params: dict[str, Any], actor: str) -> dict[str, Any]:
        shutil.copytree(default_model_path(), self.root / "candidate")
        return {"id": "j1", "state": "succeeded", "result": {"name": "candidate"}}

    def job(self, job_id: str) -> dict[str, Any]:
        raise AssertionError("not polled: the job finished at once")

    def active(self) -> str | None:
        return self._active

    def path(self, name: str) -> Path:
        return self.root / name

    def activate(self, name: str, actor: str) -> dict[str, Any]:
        self.activated.append(name)
        return {}


def test_a_retrained_model_no_better_on_held_out_data_is_not_activated(tmp_path: Path, small_recording: Path) -> None:
    reg = CopyingRegistry(tmp_path)
    out = retrain(reg, {"recordings": [str(small_recording)], "held_out": str(small_recording)}, PolicyConfig())
    assert out["activated"] is False and "no better" in out["why"]
    assert reg.activated == [] and out["new"] == out["current_metrics"]


def test_retraining_without_a_held_out_recording_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="held_out"):
        retrain(CopyingRegistry(tmp_path), {"recordings": ["x"]}, PolicyConfig())
