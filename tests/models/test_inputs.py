"""The learned models read only features whose healthy meaning does not move from fleet to fleet."""

from __future__ import annotations

from models.inputs import exclusion_reason, model_inputs
from pipeline.features import FEATURE_NAMES


def test_features_that_encode_the_sampling_interval_or_the_chassis_are_not_model_inputs() -> None:
    inputs = set(model_inputs(FEATURE_NAMES))
    assert not {"sample_age_s", "samples_short", "node_gpus_scored", "net_ports"} & inputs
    assert "sampling interval" in exclusion_reason("sample_age_s")
    assert "chassis" in exclusion_reason("net_ports")


def test_lifetime_levels_and_port_sums_are_replaced_by_changes_and_the_worst_port() -> None:
    inputs = set(model_inputs(FEATURE_NAMES))
    assert not {n for n in FEATURE_NAMES if n.endswith("_total")} & inputs
    assert "net_port_rcv_errors_per_min_long" not in inputs
    assert "net_port_rcv_errors_per_min_port_max_long" in inputs
    assert "net_port_rcv_errors_excess_long_port_max" in inputs
    assert "ecc_sbe_excess_long" in inputs and "remapped_rows_corr_per_h_long" in inputs


def test_every_exclusion_says_why() -> None:
    excluded = [n for n in FEATURE_NAMES if n not in model_inputs(FEATURE_NAMES)]
    assert excluded
    assert all(len(exclusion_reason(n) or "") > 20 for n in excluded)
