"""Window state and features: counters, NaN, irregular time, ordering, memory, peers, events."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.features import STEADY_COOL_C
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from tests.pipeline.synth import T0, Fleet, events_frame, gpu_frame, net_frame

SETTINGS = PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=600)


def one_gpu(ts: list[float], **cols: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"ts": [T0 + t for t in ts], "node": "gpu-node-000", "gpu": 0, **cols})


def run(df: pd.DataFrame, net: pd.DataFrame | None = None, events: pd.DataFrame | None = None,
        settings: PipelineSettings = SETTINGS) -> dict[float, pd.DataFrame]:
    pipe = FeaturePipeline(settings)
    pipe.ingest_frames(df, net, events)
    return {b.ts: b.to_frame() for b in pipe.flush()}


def test_counter_reset_gives_no_negative_rate() -> None:
    # 100 → 160 → reset (driver reload) → 5 → 25: increments 60, 5, 20 over 30 s
    out = run(one_gpu([0, 10, 20, 30], pcie_replay=[100.0, 160.0, 5.0, 25.0]))
    rate = out[T0 + 60]["pcie_replay_per_min_short"].iloc[0]
    assert rate >= 0
    assert rate == (60 + 5 + 20) / 30 * 60


def test_a_lifetime_counter_that_goes_down_is_another_part_and_is_re_anchored_not_counted_again() -> None:
    # remapped rows persist across reboots: 40 → 41 → (GPU swapped for a refurbished one) 12 → 13
    out = run(one_gpu([0, 10, 20, 30], remapped_rows_corr=[40.0, 41.0, 12.0, 13.0], pcie_replay=[0.0, 0.0, 0.0, 0.0]))
    assert out[T0 + 60]["remapped_rows_corr_per_h_long"].iloc[0] == (1 + 0 + 1) / 30 * 3600


def test_the_worst_port_and_its_own_baseline_do_not_grow_with_the_number_of_ports() -> None:
    def node_with_ports(n_ports: int) -> pd.DataFrame:
        rows = [{"ts": T0 + t, "node": "gpu-node-000", "device": f"mlx5_{p}", "port": 1, "link_state": "ACTIVE",
                 "port_rcv_errors": float(t // 10) if p == 0 else 0.0} for p in range(n_ports) for t in range(0, 60, 10)]
        return pd.DataFrame(rows)

    gpu = one_gpu([0, 10, 20, 30, 40, 50], pcie_replay=[0.0] * 6)
    one, nine = (run(gpu, node_with_ports(k))[T0 + 60].iloc[0] for k in (1, 9))
    for name in ("net_port_rcv_errors_per_min_port_max_short", "net_port_rcv_errors_excess_long_port_max"):
        assert one[name] == nine[name] and one[name] > 0, name


def test_unsupported_counter_stays_nan_and_never_reads_as_zero() -> None:
    out = run(one_gpu([0, 10, 20], ecc_sbe_vol=[np.nan] * 3, ecc_sbe_agg=[np.nan] * 3, pcie_replay=[0.0, 0.0, 0.0]))
    f = out[T0 + 60].iloc[0]
    assert np.isnan(f["ecc_sbe_per_h_short"]) and np.isnan(f["ecc_sbe_per_h_long"])
    assert np.isnan(f["temp_gpu_c_mean_short"])  # the column is absent from the input
    assert f["pcie_replay_per_min_short"] == 0.0  # supported and quiet is a real zero


def test_rates_are_exact_for_irregular_intervals() -> None:
    # gaps of 1, 9, 2 and 18 s with 1, 9, 2, 18 SBEs: exactly 1 per second whatever the spacing
    ts = [0, 1, 10, 12, 30]
    out = run(one_gpu(ts, ecc_sbe_vol=[0.0, 1.0, 10.0, 12.0, 30.0],
                      thermal_violation_us=[0.0, 0.5e6, 5e6, 6e6, 15e6]))
    f = out[T0 + 60].iloc[0]
    assert f["ecc_sbe_per_h_short"] == 3600.0
    assert np.isclose(f["thermal_violation_frac_short"], 0.5)


def test_slope_reads_a_linear_trend_in_units_per_minute() -> None:
    ts = np.arange(0, 600, 7.0)
    out = run(one_gpu(list(ts), temp_gpu_c=list(50 + 0.05 * ts)))  # 3 degC per minute
    f = out[T0 + 600].iloc[0]
    assert np.isclose(f["temp_gpu_c_slope_long"], 3.0, rtol=1e-6)
    assert np.isclose(f["temp_gpu_c_slope_short"], 3.0, rtol=1e-6)


def test_unsorted_input_in_any_split_gives_the_same_features_as_sorted() -> None:
    fleet = Fleet(nodes=3, gpus=4, samples=40, interval_s=5.0, jitter_s=2.0)
    g, n = gpu_frame(fleet), net_frame(fleet)
    e = events_frame(fleet, [(30, 0, 1, 79), (31, 1, None, 48), (90, 2, 3, 13)])
    want = run(g, n, e)
    rng = np.random.default_rng(7)
    shuffled = g.sample(frac=1.0, random_state=3)
    pipe = FeaturePipeline(SETTINGS)
    for part in np.array_split(np.arange(len(shuffled)), 9):  # ragged chunks, rows out of order
        pipe.ingest_frames(shuffled.iloc[part])
    pipe.ingest_frames(None, n.sample(frac=1.0, random_state=int(rng.integers(100))), e[::-1])
    got = {b.ts: b.to_frame() for b in pipe.flush()}
    assert got.keys() == want.keys()
    for ts in want:
        pd.testing.assert_frame_equal(got[ts], want[ts], check_exact=True)


def test_state_size_does_not_grow_with_the_number_of_ticks_fed() -> None:
    pipe = FeaturePipeline(SETTINGS)
    sizes = []
    for hour in range(3):
        fleet = Fleet(nodes=4, gpus=8, samples=360, interval_s=10.0, t0=T0 + 3600 * hour, seed=hour)
        pipe.ingest_frames(gpu_frame(fleet), net_frame(fleet))
        assert len(pipe.advance(fleet.t0 + 3600)) == 60
        sizes.append(pipe.state_bytes)
    assert sizes[0] == sizes[1] == sizes[2]
    assert pipe.counts.ticks == 180


def test_one_slow_gpu_among_eight_stands_out_against_its_peers() -> None:
    fleet = Fleet(nodes=4, gpus=8, samples=12, interval_s=5.0)
    g = gpu_frame(fleet)
    slow = (g.node == "gpu-node-002") & (g.gpu == 5)
    g.loc[slow, "sm_clock_mhz"] = 1400.0
    g.loc[slow, "util_gpu"] -= 30
    f = run(g)[T0 + 60]
    deficit = f.set_index(["node", "gpu"])["sm_clock_deficit_vs_peers"]
    assert deficit.idxmax() == ("gpu-node-002", 5)
    assert deficit.max() > 0.25
    assert deficit.drop(("gpu-node-002", 5)).abs().max() < 0.02
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(g)
    by_node = pipe.flush()[0].by_node()  # the node view keeps the worst GPU's value
    col = by_node.column("sm_clock_deficit_vs_peers")
    assert len(by_node) == 4
    assert by_node.node[np.argmax(col)] == "gpu-node-002" and col.max() == deficit.max()


def test_on_a_shared_node_an_idle_gpu_is_nobodys_straggler_but_a_slow_busy_one_is() -> None:
    fleet = Fleet(nodes=2, gpus=8, samples=12, interval_s=5.0)
    g = gpu_frame(fleet)
    node = g.node == "gpu-node-001"
    idle = node & g.gpu.isin([0, 1, 2])  # another job's GPUs, idle at idle clocks
    g.loc[idle, ["sm_clock_mhz", "util_gpu"]] = [345.0, 0.0]
    slow = node & (g.gpu == 6)
    g.loc[slow, "sm_clock_mhz"] = 1200.0
    f = run(g)[T0 + 60].set_index(["node", "gpu"])
    busy_deficit, all_deficit = f["sm_clock_deficit_vs_busy_peers"], f["sm_clock_deficit_vs_peers"]
    assert busy_deficit.loc["gpu-node-001"].loc[[0, 1, 2]].isna().all()
    assert all_deficit.loc["gpu-node-001"].loc[[0, 1, 2]].min() > 0.5  # what the old feature read as slow
    assert busy_deficit.idxmax() == ("gpu-node-001", 6) and busy_deficit.max() > 0.3
    assert busy_deficit.drop(("gpu-node-001", 6)).abs().max() < 0.02


def test_xids_are_counted_by_catalogue_class_and_unresolved_ones_count_for_the_node_only() -> None:
    fleet = Fleet(nodes=2, gpus=4, samples=12, interval_s=10.0)
    e = events_frame(fleet, [(5, 0, 1, 13), (6, 0, 1, 43), (7, 0, 2, 79), (8, 1, None, 48)])
    f = run(gpu_frame(fleet), events=e)[T0 + 60].set_index(["node", "gpu"])
    assert f.loc[("gpu-node-000", 1), "xid_app_count_short"] == 1
    assert f.loc[("gpu-node-000", 1), "xid_informational_count_short"] == 1
    assert f.loc[("gpu-node-000", 1), "xid_off_bus_count_short"] == 0
    assert f.loc[("gpu-node-000", 2), "xid_off_bus_count_short"] == 1
    assert (f.loc["gpu-node-001", "xid_dbe_count_short"] == 0).all()
    assert (f.loc["gpu-node-001", "node_xid_dbe_count_short"] == 1).all()
    assert f.loc["gpu-node-000", "node_xid_dbe_count_short"].sum() == 0


def test_a_gpu_that_goes_silent_is_still_scored_with_a_growing_sample_age() -> None:
    fleet = Fleet(nodes=1, gpus=4, samples=30, interval_s=10.0)
    g = gpu_frame(fleet)
    g = g[~((g.gpu == 3) & (g.ts >= T0 + 100))]
    out = run(g)
    last = out[T0 + 300].set_index("gpu")
    assert last.loc[3, "sample_age_s"] == 210.0 and last.loc[0, "sample_age_s"] == 10.0
    assert np.isnan(last.loc[3, "temp_gpu_c_mean_short"])


def test_port_counters_and_link_state_aggregate_per_node() -> None:
    fleet = Fleet(nodes=2, gpus=2, ports=2, samples=7, interval_s=10.0)
    n = net_frame(fleet)
    n["port_xmit_wait"] = (n.ts - T0) * 1000.0  # congestion: grows, but is its own feature
    n["symbol_error"] = 0.0
    f = run(gpu_frame(fleet), n)[T0 + 60].set_index(["node", "gpu"])
    assert np.isclose(f.loc[("gpu-node-000", 0), "net_port_xmit_wait_per_min_short"], 2 * 60_000)
    assert f.loc[("gpu-node-000", 0), "net_symbol_error_per_min_short"] == 0
    assert f.loc[("gpu-node-000", 0), "net_ports_not_active_frac_short"] == 3 / 12
    assert f.loc[("gpu-node-001", 1), "net_ports_not_active_frac_short"] == 0
    assert (f["net_ports"] == 2).all()


def test_a_tick_with_ports_or_events_but_no_gpu_gives_an_empty_batch_not_a_crash() -> None:
    net = pd.DataFrame([{"ts": T0 + 5, "node": "gpu-node-000", "device": "mlx5_0", "port": 1, "link_state": "ACTIVE",
                         "port_rcv_errors": 0.0}])
    out = run(one_gpu([200, 210], pcie_replay=[0.0, 0.0]), net)
    assert len(out[T0 + 60]) == 0
    assert len(out[T0 + 240]) == 1


def test_nodes_braking_together_see_each_other_so_a_facility_brake_is_not_one_nodes_fault() -> None:
    rows = [{"ts": T0 + t, "node": f"gpu-node-00{n}", "gpu": 0, "throttle_reasons": 0x80 if n < 2 else 0,
             "pcie_replay": 0.0} for n in range(3) for t in range(0, 60, 10)]
    f = run(pd.DataFrame(rows))[T0 + 60].set_index("node")["other_nodes_power_brake_short"]
    assert f.to_dict() == {"gpu-node-000": 1, "gpu-node-001": 1, "gpu-node-002": 2}


def test_a_brake_is_compared_with_the_most_any_other_node_braked_in_the_long_window() -> None:
    def brake(n: int, gpu: int, t: int) -> int:  # node 0 GPU 1: 6 of 24 samples; node 1: 3 of 24; node 2: none
        return 0x80 if (n == 0 and gpu == 1 and t < 60) or (n == 1 and gpu == 0 and 100 <= t < 130) else 0

    rows = [{"ts": T0 + t, "node": f"gpu-node-00{n}", "gpu": gpu, "throttle_reasons": brake(n, gpu, t),
             "pcie_replay": 0.0} for n in range(3) for gpu in range(2) for t in range(0, 240, 10)]
    f = run(pd.DataFrame(rows))[T0 + 240].set_index(["node", "gpu"])["other_nodes_power_brake_long_ratio"]
    assert f[("gpu-node-000", 0)] == f[("gpu-node-000", 1)] == pytest.approx(0.5)  # a node's brake: its worst GPU
    assert f[("gpu-node-001", 0)] == pytest.approx(2.0)
    assert np.isnan(f[("gpu-node-002", 0)])  # did not brake: nothing to share
    alone = [r for r in rows if r["node"] == "gpu-node-000"]
    assert run(pd.DataFrame(alone))[T0 + 240]["other_nodes_power_brake_long_ratio"].tolist() == [0.0, 0.0]


def test_a_node_is_silent_only_when_every_gpu_of_it_has_stopped() -> None:
    fleet = Fleet(nodes=2, gpus=4, samples=30, interval_s=10.0)
    g = gpu_frame(fleet)
    late = g.ts >= T0 + 100
    g = g[~(late & (g.node == "gpu-node-001")) & ~(late & (g.node == "gpu-node-000") & (g.gpu == 3))]
    f = run(g)[T0 + 300].set_index(["node", "gpu"])["node_silent_s"]
    assert (f.loc["gpu-node-001"] == 210.0).all()       # the whole node went dark at T0 + 90
    assert (f.loc["gpu-node-000"] == 10.0).all()        # one GPU off the bus: its node still reports


@pytest.mark.parametrize("nulls", [False, True])
def test_a_gpu_without_a_reading_for_retain_silent_s_is_lost_to_its_node_until_it_reads_again(nulls) -> None:
    fleet = Fleet(nodes=3, gpus=4, samples=24 * 6, interval_s=10.0)   # 24 minutes at 10 s
    g = gpu_frame(fleet)
    gone = (g.ts >= T0 + 100) & (g.ts < T0 + 1200)
    g = g[~(gone & (g.node == "gpu-node-000") & (g.gpu == 3))]         # the collector's form: no row
    values = [c for c in g.columns if c not in ("ts", "node", "gpu", "gpu_uuid", "pci_bus_id")]
    if nulls:
        g.loc[gone & (g.node == "gpu-node-001") & (g.gpu == 2), values] = np.nan  # an exporter's: rows of nulls
        g.loc[(g.node == "gpu-node-002") & (g.gpu == 1), values] = np.nan     # never read at all: nothing to lose
    frames = run(g)
    ticks = (T0 + 660, T0 + 720, T0 + 1140, T0 + 1260)
    lost = {t: frames[t].groupby("node")["node_gpus_lost"].agg(["min", "max"]) for t in ticks}
    reading = {t: frames[t].groupby("node")["node_gpus_reading"].agg(["min", "max"]) for t in ticks}
    assert (lost[T0 + 660].values == 0).all()                       # 570 s without a reading: not yet
    assert reading[T0 + 660].to_dict("index")["gpu-node-000"] == {"min": 4, "max": 4}
    for t in (T0 + 720, T0 + 1140):                                  # 600 s and more: on every row of its node
        assert lost[t].to_dict("index") == {"gpu-node-000": {"min": 1, "max": 1},
                                            "gpu-node-001": {"min": int(nulls), "max": int(nulls)},
                                            "gpu-node-002": {"min": 0, "max": 0}}
        assert reading[t].to_dict("index") == {"gpu-node-000": {"min": 3, "max": 3},
                                               "gpu-node-001": {"min": 4 - nulls, "max": 4 - nulls},
                                               "gpu-node-002": {"min": 4 - nulls, "max": 4 - nulls}}
    assert 3 not in set(frames[T0 + 1140].query("node == 'gpu-node-000'").gpu)  # its row is gone; its node counts it
    assert (lost[T0 + 1260].values == 0).all()                      # it reads again
    assert (reading[T0 + 1260]["min"] == [4, 4, 4 - nulls]).all()


def test_a_brake_another_node_had_earlier_in_the_long_window_still_counts_once_it_has_ended() -> None:
    def brake(n: int, t: int) -> int:
        return 0x80 if (n == 0 and t < 60) or (n == 2 and t < 10) else 0   # node 0: a minute; node 2: one sample

    rows = [{"ts": T0 + t, "node": f"gpu-node-00{n}", "gpu": 0, "throttle_reasons": brake(n, t), "pcie_replay": 0.0}
            for n in range(3) for t in range(0, 240, 10)]
    f = run(pd.DataFrame(rows))[T0 + 240].set_index("node")      # the long window (5 min here) holds all 24 samples
    assert f["other_nodes_power_brake_short"].to_dict() == {"gpu-node-000": 0, "gpu-node-001": 0, "gpu-node-002": 0}
    # node 0 braked 6 of 24 samples (25 %); node 2's 1 of 24 (4 %) is under the 5 % a brake needs
    assert f["other_nodes_power_brake_long"].to_dict() == {"gpu-node-000": 0, "gpu-node-001": 1, "gpu-node-002": 1}


def test_a_straggler_trend_builds_over_minutes_of_steady_work_and_not_from_heat_or_part_time_work() -> None:
    fleet = Fleet(nodes=1, gpus=8, samples=20 * 6, interval_s=10.0)  # 20 minutes at 10 s
    g = gpu_frame(fleet)
    g["util_gpu"], g["throttle_reasons"] = 95.0, 0.0
    slow, hot, part = (g.gpu == 5), (g.gpu == 6), (g.gpu == 7)
    g.loc[slow | hot | part, "sm_clock_mhz"] = 1980.0 * 0.7               # three GPUs 30 % under their peers
    g.loc[hot, "throttle_reasons"] = 0x20                                  # ... one says it is hot (SW thermal slowdown)
    g.loc[part, "util_gpu"] = 30.0                                         # ... one works part time
    frames = run(g)
    trend = {ts: f.set_index("gpu")["sm_clock_deficit_vs_busy_peers_trend"] for ts, f in frames.items()}
    first = min(ts for ts, t in trend.items() if t[5] >= 0.15)
    assert 6 <= (first - T0) / 60 <= 9                                     # 10 min x ln 2 of steady work, not at once
    assert trend[T0 + 60][5] < 0.05                                        # one slow minute is not a straggler
    last = trend[max(trend)]
    assert last[[6, 7]].isna().all()                                       # heat and part-time work do not feed it
    assert last.drop([5, 6, 7]).abs().max() < 0.02


def test_a_straggler_slow_in_spells_reads_its_share_of_slow_minutes_where_its_trend_stays_shallow() -> None:
    fleet = Fleet(nodes=1, gpus=8, samples=40 * 6, interval_s=10.0)  # 40 minutes at 10 s
    g = gpu_frame(fleet)
    g["util_gpu"], g["throttle_reasons"] = 95.0, 0.0
    minute = ((g.ts - T0) // 60).astype(int)
    spells = (g.gpu == 5) & (minute % 2 == 0)                              # every other minute 15 % slow
    capped = (g.gpu == 3) & (minute % 2 == 0)                              # ... and one at its power cap in them
    dip = (g.gpu == 4) & (minute == 30)                                    # one minute 30 % slow
    g.loc[spells | capped, "sm_clock_mhz"] = 1980.0 * 0.85
    g.loc[capped, "throttle_reasons"] = 0x4
    g.loc[dip, "sm_clock_mhz"] = 1980.0 * 0.7
    frames = run(g)
    last = frames[max(frames)].set_index("gpu")
    share, trend = last["sm_clock_slow_share"], last["sm_clock_deficit_vs_busy_peers_trend"]
    assert 0.4 <= share[5] <= 0.6 and trend[5] < 0.10                     # half its minutes, whatever the mean
    assert 0.03 <= share[4] <= 0.15                                        # a dip is a minute's share, decaying
    assert share[3] == 0.0 and trend[3] > 0.05                             # the cap explains its slow minutes
    assert share.drop([3, 4, 5]).max() == 0.0


def test_a_gpu_that_sends_no_throttle_reasons_says_not_from_heat_by_its_temperature_or_not_at_all() -> None:
    fleet = Fleet(nodes=1, gpus=8, samples=20 * 6, interval_s=10.0)
    g = gpu_frame(fleet)
    g["util_gpu"], g["throttle_reasons"], g["temp_gpu_c"] = 95.0, 0.0, 65.0
    slow, cool, hot, blind = (g.gpu == 5), (g.gpu == 4), (g.gpu == 3), (g.gpu == 2)
    g.loc[slow | cool | hot | blind, "sm_clock_mhz"] = 1980.0 * 0.7       # four GPUs 30 % under their peers
    g.loc[cool | hot | blind, "throttle_reasons"] = np.nan                 # three on an exporter without the field:
    g.loc[hot, "temp_gpu_c"] = STEADY_COOL_C + 4.0                         # one near NVIDIA's SW slowdown (85-87 degC)
    g.loc[blind, "temp_gpu_c"] = np.nan                                    # one that sends no temperature either
    frames = run(g)
    last = frames[max(frames)].set_index("gpu")["sm_clock_deficit_vs_busy_peers_trend"]
    assert last[5] >= 0.15 and abs(last[4] - last[5]) < 1e-6              # cool: read as its reasons would say (ST)
    assert np.isnan(last[3]) and np.isnan(last[2])                         # hot or unknown is not clean (SU)
    share = frames[max(frames)].set_index("gpu")["sm_clock_slow_share"]
    assert share[5] > 0.5 and share[4] == 0.0                              # it cannot say it is not at its power cap


def test_a_gpu_that_sends_no_throttle_reasons_carries_its_temperature_for_the_hw_slowdown_rule() -> None:
    fleet = Fleet(nodes=1, gpus=4, samples=3 * 6, interval_s=10.0)
    g = gpu_frame(fleet)
    g["throttle_reasons"], g["temp_gpu_c"] = 0.0, 70.0
    g.loc[g.gpu.isin([2, 3]), "throttle_reasons"] = np.nan                # two on an exporter without the field
    g.loc[g.gpu.isin([1, 3]), "temp_gpu_c"] = 91.0                        # ... one of them, and one beside, hot
    last = run(g)
    last = last[max(last)].set_index("gpu")["temp_gpu_c_without_reasons_short"]
    assert np.isnan(last[0]) and np.isnan(last[1])                         # its flags say it (rule hw_thermal)
    assert last[2] == pytest.approx(70.0) and last[3] == pytest.approx(91.0)
