"""The feature contract with models/: stable, unique, documented names; validated settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.features import FEATURE_NAMES, FEATURES, markdown_table
from pipeline.settings import PipelineSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "pipeline.md"


def test_feature_names_are_unique_and_each_has_a_unit_and_meaning() -> None:
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)
    assert all(unit and meaning for _, unit, meaning in FEATURES)


def test_every_feature_is_documented_in_order_in_docs_pipeline_md() -> None:
    text = DOC.read_text()
    positions = [text.find(f"| `{name}` |") for name in FEATURE_NAMES]
    assert -1 not in positions, [n for n, p in zip(FEATURE_NAMES, positions) if p < 0]
    assert positions == sorted(positions)


def test_the_documented_unit_and_meaning_of_every_feature_are_the_codes() -> None:
    """A meaning changed in pipeline.features is changed in the doc too (`python -m pipeline.features`)."""
    documented = set(DOC.read_text().splitlines())
    rows = [r for r in markdown_table().splitlines() if r.startswith("| ") and r.split("|")[1].strip().isdigit()]
    assert len(rows) == len(FEATURE_NAMES)
    assert [r for r in rows if r not in documented] == []


def test_windows_that_are_not_whole_buckets_are_refused_at_start_up() -> None:
    with pytest.raises(ValidationError, match="whole number"):
        PipelineSettings(bucket_s=60, long_window_s=90)


def test_settings_come_from_the_environment_with_the_package_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPS_PIPELINE_CADENCE_S", "120")
    monkeypatch.setenv("GPUOPS_PIPELINE_SHORT_WINDOW_S", "120")
    assert PipelineSettings().cadence_s == 120


def test_a_short_window_other_than_the_cadence_is_refused_because_baselines_add_it_once_per_tick() -> None:
    with pytest.raises(ValidationError, match="must equal cadence_s"):
        PipelineSettings(cadence_s=120, short_window_s=60)
