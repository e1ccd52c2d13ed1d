"""The learned models read only features whose healthy meaning does not move from fleet to fleet."""

from __future__ import annotations

from models.inputs import exclusion_reason, model_inputs
from pipeline.features import FEATURE_NAMES


def test_features_that_encode_the_sampling_interval_or_the_chassis_are_not_model_inputs() -> None:
    inputs = set(model_inputs(FEATURE_NAMES))
    assert not {"sample_age_s", "samples_short", "node_gpus_scored", "net_ports"} & inputs
    assert "sampling interval" in exclusion_reason("sample_age_s")
    assert "node_silent_s" not in inputs and exclusion_reason("node_silent_s") == exclusion_reason("sample_age_s")
    assert "chassis" in exclusion_reason("net_ports")


def test_lifetime_levels_and_port_sums_are_replaced_by_changes_and_the_worst_port() -> None:
    inputs = set(model_inputs(FEATURE_NAMES))
    assert not {n for n in FEATURE_NAMES if n.endswith("_total")} & inputs
    assert "net_port_rcv_errors_per_min_long" not in inputs
    assert "ecc_sbe_excess_long" in inputs and "remapped_rows_corr_per_h_long" in inputs


def test_ports_are_read_only_through_their_rate_cusums() -> None:
    """A port's error count in a window (worst port, or its excess over the own baseline) is
    not a model input: one stray error must never be a verdict. Its CUSUM is."""
    inputs = set(model_inputs(FEATURE_NAMES))
    for c in ("port_rcv_errors", "symbol_error", "link_error_recovery", "link_downed"):
        assert f"net_{c}_per_min_port_max_long" not in inputs and f"net_{c}_per_min_port_max_short" not in inputs
        assert f"net_{c}_excess_long_port_max" not in inputs
        assert f"net_{c}_cusum_port_max" in inputs
    assert "stray error" in exclusion_reason("net_link_error_recovery_per_min_port_max_long")
    assert {"net_port_down_after_active_s", "net_ports_not_active_frac_short", "ecc_sbe_cusum"} <= inputs


def test_every_exclusion_says_why() -> None:
    excluded = [n for n in FEATURE_NAMES if n not in model_inputs(FEATURE_NAMES)]
    assert excluded
    assert all(len(exclusion_reason(n) or "") > 20 for n in excluded)


def test_power_against_peers_is_not_a_model_input() -> None:
    """Against the node's median GPU, a healthy busy GPU on a node shared by one-GPU jobs reads ~8; the
    telemetry names no job, so no other set of peers is one job's either."""
    inputs = set(model_inputs(FEATURE_NAMES))
    assert not {n for n in inputs if n.startswith("power_") and "peers" in n}
    assert "shared by jobs" in exclusion_reason("power_abs_dev_vs_peers")
