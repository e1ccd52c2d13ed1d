"""Randomized simulator worlds: drawn per recording, recorded, reproducible, messy the way real fleets are."""

from __future__ import annotations

import ast
import inspect
import json
from dataclasses import fields, replace

import numpy as np
import pandas as pd
import pytest

from collector.recording import open_recording
from collector.simulator import (
    SHIFTS,
    TRAINING,
    SimConfig,
    Simulator,
    WorldRanges,
    draw_world,
    ranges_by_name,
    simulate_recording,
    world_config,
)
from collector.simulator import ranges as ranges_module
from collector.simulator.background import apply_background, draw_background
from collector.simulator.ranges import EXPORTER_DEFAULT_MISSING, GENERATIONS, TUNING_SHIFTS, UNSUPPORTED_FIELDS
from collector.xid import catalog

RESTART_APP = tuple(sorted(c for c, e in catalog().items() if e.immediate_action == "RESTART_APP"))

#: a world where every messy axis is certainly on, so small fleets show each of them
BUSY = replace(TRAINING, name="test-busy", interval_choices_s=(5, 10, 20), mixed_interval_prob=1.0,
               exporter_default_node_frac=(0.3, 0.3), legacy_gpu_frac=(0.5, 0.5), legacy_port_frac=(0.9, 0.9),
               saturated_port_frac=(0.3, 0.3), ib_noisy_port_frac=(0.4, 0.4), ib_rate_per_h=(5, 10),
               sbe_gpu_frac=(0.1, 0.1), link_flap_per_port_day=(1.0, 1.0), late_row_frac=(0.01, 0.01),
               app_xid_per_gpu_day=(0.5, 0.5), app_xid_codes=RESTART_APP, generations=("A100", "H100", "H200"),
               mixed_fleet_prob=1.0)


def _cfg(seed=211, ranges=BUSY, nodes=12, hours=2.0, **kw):
    return world_config(SimConfig(nodes=nodes, hours=hours, seed=seed, **kw), draw_world(seed, ranges, nodes))


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    out = tmp_path_factory.mktemp("world") / "rec"
    cfg = _cfg()
    simulate_recording(cfg, out)
    rec = open_recording(out)
    return cfg, rec, rec.read_all("gpu"), rec.read_all("net"), rec.events(), rec.incidents()


def test_the_world_is_recorded_in_the_manifest_and_reproducible_from_the_seed(busy):
    cfg, rec, *_ = busy
    manifest = json.loads((rec.path / "manifest.json").read_text())
    world = manifest["world"]
    assert world["seed"] == 211 and world["ranges"] == "test-busy"
    assert world["nodes"]["generation"] == list(cfg.world.generation)
    assert json.dumps(draw_world(211, BUSY, 12).to_json(), sort_keys=True) == json.dumps(world, sort_keys=True)

    def digest(seed):
        sim = Simulator(_cfg(seed=seed, nodes=4, hours=1))
        cols = [np.concatenate([ch.gpu.column("ecc_sbe_agg").to_numpy(zero_copy_only=False) for ch in sim.chunks()])]
        return cols[0], json.dumps(sim.incidents(), sort_keys=True), sim.manifest().to_json()["world"]

    a, b, c = digest(5), digest(5), digest(6)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1:] == b[1:] and a[2] != c[2]


def test_the_recording_reads_back_through_the_contract_without_rejections(busy):
    _, rec, gpu, net, *_ = busy
    raw = pd.read_parquet(rec.path / "gpu.parquet")
    assert len(raw) == len(gpu) and len(pd.read_parquet(rec.path / "net.parquet")) == len(net)
    rejected = sum(len(w.rejected) for w in rec.iter_windows(600.0))
    assert rejected == 0
    # some rows were written late: the file is not in time order, the reader sorts it
    assert (np.diff(raw["ts"].to_numpy()) < -5).any()


def test_healthy_parts_get_benign_background_errors(busy):
    _, _, gpu, net, _, incidents = busy
    faulty_nodes = {i["node"] for i in incidents if i["fault"] != "app_error"}
    healthy = net[~net["node"].isin(faulty_nodes)].sort_values("ts")
    grow = healthy.groupby(["node", "device"])["port_rcv_errors"].agg(lambda s: s.iloc[-1] - s.iloc[0])
    assert (grow > 0).sum() >= 3, "no healthy port trickles receive errors"
    flaps = healthy[healthy["link_state"] != "ACTIVE"]
    assert len(flaps) and set(flaps["node"]) <= set(healthy["node"])
    g = gpu[~gpu["node"].isin(faulty_nodes)].sort_values("ts")
    sbe = g.groupby(["node", "gpu"])["ecc_sbe_vol"].agg(lambda s: s.max() - s.min())
    assert (sbe > 0).any(), "no healthy GPU logs SBE"


class _Grid:
    """Just enough of generate.Chunk for apply_background: 32 parts' rates over *n_ticks* of 10 s."""

    a, dt, G, NP = 0, 10.0, 32, 32

    def __init__(self, n_ticks: int):
        self.b, self.rates = n_ticks, {}

    def rate(self, name):
        return self.rates.setdefault(name, np.zeros((self.b, 32)))

    net_rate = rate

    def __getattr__(self, name):  # inc, bg_event, link_down, ...: not under test here
        return lambda *a, **k: np.zeros((self.b, 32))


def test_healthy_parts_rise_for_hours_and_come_back_down_from_their_own_random_stream():
    """A benign rise lifts one part's rate over its span only, and adding rises to a world
    changes none of its other draws (so the worlds recorded before them keep their content)."""
    rising = replace(BUSY, rise_per_gpu_day=(2.0, 2.0), rise_per_port_day=(2.0, 2.0), rise_s=(1800, 1800))
    quiet = replace(BUSY, rise_per_gpu_day=(0.0, 0.0), rise_per_port_day=(0.0, 0.0))
    w_rise, w_quiet = draw_world(9, rising, 4), draw_world(9, quiet, 4)
    assert {k: v for k, v in w_rise.rates.items() if not k.startswith("rise_")} == \
        {k: v for k, v in w_quiet.rates.items() if not k.startswith("rise_")}
    kw = dict(n_ticks=720, dt=10.0, gpus_per_node=8, ports_per_node=8, app_codes=RESTART_APP)
    with_rises = draw_background(w_rise, np.random.default_rng(1), **kw)
    without = draw_background(w_quiet, np.random.default_rng(1), **kw)
    rises = [e for e in with_rises.episodes if e.kind == "rise"]
    assert [e for e in with_rises.episodes if e.kind != "rise"] == without.episodes
    assert {e.counter for e in rises} >= {"", "ecc_sbe_vol"} and all(e.b - e.a == 180 for e in rises if e.b < 720)
    # rendered: the part's rate is up inside the span and back at its trickle outside it
    gpu_rise = next(e for e in rises if e.counter and 0 < e.a and e.b < 720)

    grid = _Grid(720)
    apply_background(grid, replace(with_rises, episodes=[gpu_rise]))
    col = grid.rates[gpu_rise.counter][:, gpu_rise.part] - (grid.rates[gpu_rise.counter][0, gpu_rise.part])
    assert (col[gpu_rise.a:gpu_rise.b] > 0).all() and not col[:gpu_rise.a].any() and not col[gpu_rise.b:].any()


def test_half_the_sbe_bursts_tail_off_for_hours_with_the_same_count_and_the_same_other_draws():
    """A tailing SBE burst starts at its highest rate and decays (a storm that subsides, so a rate that
    falls is no precursor); its shape comes from its own stream: the bursts' parts, onsets and remaps,
    and every other episode, are the same whatever share tails off."""
    kw = dict(n_ticks=4320, dt=10.0, gpus_per_node=8, ports_per_node=8, app_codes=RESTART_APP)
    bg = {frac: draw_background(w, np.random.default_rng(3), **kw) for frac in (0.0, 1.0)
          for w in [draw_world(9, replace(BUSY, sbe_burst_per_gpu_day=(1.0, 1.0), sbe_burst_decay_frac=frac), 4)]}
    flat, tail = ([e for e in bg[f].episodes if e.kind == "sbe_burst"] for f in (0.0, 1.0))
    assert len(flat) >= 10 and not any(e.tau_ticks for e in flat) and all(e.tau_ticks >= 60 for e in tail)
    assert [(e.part, e.a, e.remap) for e in flat] == [(e.part, e.a, e.remap) for e in tail]
    others = [[e for e in bg[f].episodes if e.kind != "sbe_burst"] for f in (0.0, 1.0)]
    assert others[0] == others[1]

    whole = [(f, e) for f, e in zip(flat, tail) if e.b < 4320]   # not cut off by the recording's end
    assert len(whole) >= 5
    for f, e in whole:
        sums = []
        for ep in (replace(f, remap=False), replace(e, remap=False)):
            grid = _Grid(4320)
            apply_background(grid, replace(bg[0.0], episodes=[ep], sbe_per_h=np.zeros(32)))
            sums.append(grid.rates["ecc_sbe_vol"][:, ep.part])
        col = sums[1][e.a:e.b]
        assert np.all(np.diff(col) < 0) and e.b - e.a > f.b - f.a           # falls, and lasts longer
        assert sums[1].sum() == pytest.approx(sums[0].sum(), rel=0.03)     # the same count


def test_a_shared_nodes_gpus_run_their_own_jobs_so_some_idle_while_their_peers_work(tmp_path):
    shared = replace(TRAINING, shared_node_frac=(1.0, 1.0), idle_node_frac=(0.0, 0.0),
                     inference_node_frac=(0.0, 0.0), shared_job_s=(600, 600), shared_gap_s=(600, 600))
    alone = replace(shared, shared_node_frac=(0.0, 0.0))
    assert {k: v for k, v in draw_world(8, shared, 3).rates.items() if k != "shared_node_frac"} == \
        {k: v for k, v in draw_world(8, alone, 3).rates.items() if k != "shared_node_frac"}
    gpu = {}
    for name, ranges in (("shared", shared), ("alone", alone)):
        simulate_recording(_cfg(seed=8, ranges=ranges, nodes=3, hours=1.0), tmp_path / name)
        g = open_recording(tmp_path / name).read_all("gpu")
        gpu[name] = g.assign(tick=(g["ts"] // 60)).groupby(["node", "tick"])["util_gpu"].agg(["min", "max"])
    split = (gpu["shared"]["min"] < 5) & (gpu["shared"]["max"] > 50)
    assert split.mean() > 0.3, "a shared node's GPUs should often disagree on whether they are busy"
    assert ((gpu["alone"]["min"] < 5) & (gpu["alone"]["max"] > 50)).mean() < 0.05


def test_sampling_intervals_differ_between_nodes_when_the_world_mixes_them(busy):
    cfg, _, gpu, *_ = busy
    assert len(set(cfg.world.node_interval_s)) > 1
    per_node = gpu[gpu["gpu"] == 0].sort_values("ts").groupby("node")["ts"].apply(lambda s: np.median(np.diff(s)))
    want = dict(zip(cfg.node_names(), cfg.world.node_interval_s))
    for node, med in per_node.items():
        assert abs(med - want[node]) < 0.3 * want[node], (node, med, want[node])
    assert per_node.round().nunique() > 1


def test_fields_a_default_exporter_lacks_are_null_not_zero(busy):
    cfg, _, gpu, *_ = busy
    default = {n for n, d in zip(cfg.node_names(), cfg.world.exporter_default) if d}
    assert default, "the test world has no node on the default exporter set"
    lacking = gpu[gpu["node"].isin(default)]
    full = gpu[~gpu["node"].isin(default) & gpu["util_gpu"].notna()]
    for col in EXPORTER_DEFAULT_MISSING:
        assert lacking[col].isna().all(), col
        assert full[col].notna().all(), col
    assert lacking["util_gpu"].notna().any() and lacking["remapped_rows_corr"].notna().any()


def test_optional_fields_a_gpu_does_not_report_are_null_on_exactly_the_drawn_gpus(tmp_path):
    lacking = replace(TRAINING, unsupported_node_frac=(0.6, 0.6))
    plain = replace(TRAINING, unsupported_node_frac=(0.0, 0.0))
    world = draw_world(9, lacking, 6)
    assert {k: v for k, v in world.to_json().items() if k not in ("nodes", "range_values")} == \
        {k: v for k, v in draw_world(9, plain, 6).to_json().items() if k not in ("nodes", "range_values")}
    assert set(world.unsupported) == set(UNSUPPORTED_FIELDS) and any(m for v in world.unsupported.values() for m in v)
    cfg = _cfg(seed=9, ranges=lacking, nodes=6, hours=0.5)
    simulate_recording(cfg, tmp_path / "rec")
    gpu = open_recording(tmp_path / "rec").read_all("gpu")
    gpu = gpu[gpu["util_gpu"].notna()]        # a sample, not a gap
    index = {n: i for i, n in enumerate(cfg.node_names())}
    for group, cols in UNSUPPORTED_FIELDS.items():
        mask = np.array(world.unsupported[group])[gpu["node"].map(index).to_numpy()]
        lacks = ((mask >> gpu["gpu"].to_numpy().astype(np.int64)) & 1).astype(bool)
        for col in cols:
            assert gpu.loc[lacks, col].isna().all() and gpu.loc[~lacks, col].notna().all(), col
        assert lacks.any() or not any(world.unsupported[group])


def test_lifetime_counters_start_non_zero_and_narrow_ib_counters_stick_at_their_width(busy):
    _, _, gpu, net, *_ = busy
    first = gpu.sort_values("ts").groupby(["node", "gpu"]).first()
    assert (first["ecc_sbe_agg"].dropna() > 0).mean() > 0.2
    assert (first["remapped_rows_corr"] > 0).any()
    assert (first["thermal_violation_us"].dropna() > 0).all()
    last = net.groupby(["node", "device"])[["symbol_error", "link_downed", "excessive_buffer_overrun_errors"]].max()
    assert (last["symbol_error"] <= 65535).all() and (last["link_downed"] <= 255).all()
    assert (last["excessive_buffer_overrun_errors"] <= 15).all()
    assert ((last["symbol_error"] == 65535) | (last["link_downed"] == 255)
            | (last["excessive_buffer_overrun_errors"] == 15)).any()


def test_background_is_never_labelled_as_an_incident(tmp_path):
    quiet = replace(BUSY, rate_multiplier=(0.0, 0.0), sbe_burst_per_gpu_day=(3.0, 3.0), info_xid_per_gpu_day=(0.5, 0.5))
    cfg = _cfg(seed=212, ranges=quiet, nodes=8, hours=2)
    summary = simulate_recording(cfg, tmp_path / "rec")
    rec = open_recording(tmp_path / "rec")
    assert summary.incidents == [] and (rec.incidents() or []) == []
    ev = rec.events()
    codes = set(ev[ev["kind"] == "xid"]["code"].astype(int))
    assert codes & {63, 92} and codes - {63, 92}, codes   # remaps, SBE-rate and app XIDs all happened
    assert (rec.read_all("gpu")["row_remap_pending"] == 1).any()


def test_app_xids_come_from_every_restart_app_code_of_the_catalogue(busy):
    _, _, _, _, events, incidents = busy
    codes = set(events[events["kind"] == "xid"]["code"].astype(int))
    assert len(codes & set(RESTART_APP)) >= 5 and codes - {13, 31, 43}
    app = [i for i in incidents if i["fault"] == "app_error"]
    assert all(i["action"] == "none" for i in app)


def test_the_home_world_has_no_world_entry_and_keeps_one_interval():
    sim = Simulator(SimConfig(nodes=2, hours=0.5, seed=1))
    assert "world" not in sim.manifest().to_json() and sim.plan.world is None


def test_generation_profiles_set_limits_and_clocks(busy):
    cfg, _, gpu, *_ = busy
    assert gpu["power_limit_w"].notna().mean() > 0.5
    gen = dict(zip(cfg.node_names(), cfg.world.generation))
    g = gpu.assign(gen=gpu["node"].map(gen))
    for name, prof in GENERATIONS.items():
        part = g[g["gen"] == name]
        if len(part):
            assert (part["power_limit_w"].dropna() == prof.power_limit_w).all()   # null where not reported
            assert part["sm_clock_mhz"].max() <= prof.max_sm_clock_mhz + 15


def test_shift_worlds_lie_outside_the_training_ranges():
    assert "H200" not in TRAINING.generations and SHIFTS["shift-h200"].generations == ("H200",)
    assert 60 not in TRAINING.interval_choices_s and 2 not in TRAINING.interval_choices_s
    x10, x3 = SHIFTS["shift-background-x10"], TUNING_SHIFTS["tune-background-x3"]
    for name in ("sbe_gpu_frac", "sbe_rate_per_h", "sbe_burst_per_gpu_day", "pcie_gpu_frac", "pcie_rate_per_min",
                 "nvlink_gpu_frac", "nvlink_rate_per_min", "ib_noisy_port_frac", "ib_rate_per_h", "ib_burst_per_port_day",
                 "link_flap_per_port_day", "app_xid_per_gpu_day", "info_xid_per_gpu_day", "rise_per_gpu_day",
                 "rise_per_port_day"):
        assert getattr(x10, name)[0] >= getattr(TRAINING, name)[1], name
        assert getattr(x3, name)[0] >= getattr(TRAINING, name)[1], name
        # the tuning world stays below the judged one: a choice made on it is not made on the suite
        assert getattr(x3, name)[1] <= getattr(x10, name)[1], name
    assert not set(TUNING_SHIFTS) & set(SHIFTS) and all(n.startswith("tune-") for n in TUNING_SHIFTS)
    assert SHIFTS["shift-messy"].skew_sd_s[0] > TRAINING.skew_sd_s[1]
    with pytest.raises(ValueError, match="valid: "):
        ranges_by_name("shift-nowhere")


def test_every_range_documents_its_unit_and_source():
    tree = ast.parse(inspect.getsource(ranges_module))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "WorldRanges")
    lines = inspect.getsource(ranges_module).splitlines()
    documented = False
    for stmt in cls.body:
        if not isinstance(stmt, ast.AnnAssign):
            continue
        above = lines[stmt.lineno - 2].strip()
        if above.startswith("#:") or above.startswith("#"):
            documented = True
        elif not documented or not lines[stmt.lineno - 2].strip():
            documented = False
        name = stmt.target.id  # type: ignore[attr-defined]
        assert documented, f"WorldRanges.{name} has no comment with unit and source"
    assert {f.name for f in fields(WorldRanges)} >= {"interval_choices_s", "sbe_gpu_frac", "ib_rate_per_h"}


def test_faults_in_a_randomized_world_keep_exact_labels_and_show_their_precursors(tmp_path):
    from collector.schema import FaultClass

    many = replace(BUSY, rate_multiplier=(4000, 4000), exporter_default_node_frac=(0.0, 0.0), gap_per_node_day=(0, 0))
    mix = {FaultClass.HBM_ECC: 1.0, FaultClass.NVLINK: 1.0, FaultClass.PCIE: 1.0, FaultClass.APP_ERROR: 1.0}
    cfg = world_config(SimConfig(nodes=16, hours=6, seed=213, mix=mix),
                       draw_world(213, many, 16))
    simulate_recording(cfg, tmp_path / "rec")
    rec = open_recording(tmp_path / "rec")
    gpu, incidents = rec.read_all("gpu"), rec.incidents()
    shown, checked = 0, 0
    for inc in incidents:
        assert inc["onset_ts"] is None or inc["onset_ts"] < inc["failure_ts"]
        if inc["fault"] == "app_error":
            assert inc["action"] == "none" and inc["onset_ts"] is None
        col = {"hbm_ecc": "ecc_sbe_vol", "nvlink": "nvlink_crc_flit_err", "pcie": "pcie_replay"}.get(inc["fault"])
        if not inc["predictable"] or col is None or inc["failure_ts"] - inc["onset_ts"] < 600:
            continue
        sel = gpu[(gpu["node"] == inc["node"]) & (gpu["gpu"] == inc["gpu"]) & (gpu["ts"] >= inc["onset_ts"] - 30)
                  & (gpu["ts"] < inc["failure_ts"] - 1)].sort_values("ts")[col].dropna()
        checked += 1
        shown += bool(len(sel) and sel.iloc[-1] > sel.iloc[0])
    assert checked >= 5 and shown >= 0.8 * checked, (shown, checked)


def test_32_bit_data_counters_wrap_on_the_nodes_drawn_to_read_them(tmp_path):
    wrapping = replace(BUSY, wrap_data_node_frac=(1.0, 1.0), ports_per_node_choices=(9,))
    cfg = _cfg(seed=214, ranges=wrapping, nodes=3, hours=0.5)
    assert cfg.ports_per_node == 9 and all(cfg.world.wrap_data)
    simulate_recording(cfg, tmp_path / "rec")
    net = open_recording(tmp_path / "rec").read_all("net")
    assert net["device"].nunique() == 9 and net["port_xmit_data"].max() < 2 ** 32
    d = net.sort_values("ts").groupby(["node", "device"])["port_xmit_data"].diff()
    assert (d < 0).any()


def test_hot_but_healthy_nodes_touch_sw_thermal_slowdown_but_never_hw_slowdown(tmp_path):
    hot = replace(BUSY, name="test-hot", hot_node_frac=(1.0, 1.0), idle_node_frac=(0.0, 0.0),
                  inference_node_frac=(0.0, 0.0))
    cfg = replace(_cfg(seed=212, ranges=hot, nodes=8, hours=3.0), rate_multiplier=0.0)
    simulate_recording(cfg, tmp_path / "rec")
    gpu = open_recording(tmp_path / "rec").read_all("gpu")
    bits = gpu.throttle_reasons.fillna(0).astype(np.int64)
    assert ((bits & 0x20) > 0).any()           # SW thermal: touched
    assert not ((bits & 0x40) > 0).any()       # HW thermal: never, on healthy GPUs


def test_a_busy_gpu_at_its_power_cap_runs_a_lower_clock_in_a_drawn_world(busy):
    from collector.simulator.generate import CAPPED_CLOCK_FACTOR

    gpu = busy[2]
    bits = gpu.throttle_reasons.fillna(0).astype(np.int64)
    busy_ok = (gpu.util_gpu > 50) & ((bits & ~0x4) == 0)   # busy, no throttle reason but the SW power cap
    capped, free = gpu[busy_ok & ((bits & 0x4) > 0)], gpu[busy_ok & ((bits & 0x4) == 0)]
    assert len(capped) > 100
    # per node (one generation each in a mixed fleet): capped clocks sit 3-15 % under the uncapped ones
    top = free.groupby("node")["sm_clock_mhz"].median()
    ratio = capped["sm_clock_mhz"] / capped["node"].map(top)
    lo, hi = CAPPED_CLOCK_FACTOR
    assert ratio.between(lo - 0.01, hi + 0.01).mean() > 0.99
    assert ratio.median() < 0.95


def test_a_drawn_worlds_straggler_is_deeper_or_milder_and_may_sag_or_come_and_go(tmp_path):
    from collector.schema import FaultClass
    from collector.simulator.plan import SLOW_FACTOR_DRAWN

    many = replace(BUSY, rate_multiplier=(4000, 4000), exporter_default_node_frac=(0.0, 0.0), gap_per_node_day=(0, 0),
                   power_cap_frac=(0.0, 0.0), shared_node_frac=(0.0, 0.0), idle_node_frac=(0.0, 0.0))
    cfg = world_config(SimConfig(nodes=16, hours=6, seed=215, mix={FaultClass.FAIL_SLOW: 1.0}), draw_world(215, many, 16))
    simulate_recording(cfg, tmp_path / "rec")
    rec = open_recording(tmp_path / "rec")
    gpu, incidents = rec.read_all("gpu"), rec.incidents()
    deficits = []
    for inc in (i for i in incidents if i["fault"] == "fail_slow"):
        node = gpu[(gpu["node"] == inc["node"]) & (gpu["ts"] >= inc["onset_ts"]) & (gpu["ts"] < inc["failure_ts"])]
        clock = node[node["util_gpu"] > 50].pivot_table(index="ts", columns="gpu", values="sm_clock_mhz")
        if inc["gpu"] not in clock.columns or len(clock) < 20:
            continue
        tick = 1 - clock[inc["gpu"]] / clock.drop(columns=inc["gpu"]).median(axis=1)
        deficits.append(float(tick.quantile(0.9)))   # the deepest it gets (a sag deepens, an intermittent one pauses)
        own = node[node["gpu"] == inc["gpu"]].sort_values("ts")
        assert own["ecc_sbe_vol"].dropna().diff().fillna(0).eq(0).all()   # no errors: only slower
    assert len(deficits) >= 5, len(deficits)
    lo, hi = 1 - SLOW_FACTOR_DRAWN[1], 1 - SLOW_FACTOR_DRAWN[0]
    assert min(deficits) > lo - 0.05 and max(deficits) < hi + 0.05
    assert min(deficits) < 0.25   # milder than the home world's 25-45 %


def test_a_node_that_loses_its_power_goes_dark_until_repaired_and_a_node_without_a_bmc_logs_none(tmp_path):
    from collector.schema import FaultClass

    power = replace(BUSY, name="test-power", rate_multiplier=(6000, 6000), bmc_node_frac=(0.5, 0.5))
    cfg = _cfg(seed=17, ranges=power, nodes=8, hours=6.0, mix={FaultClass.POWER: 1.0})
    simulate_recording(cfg, tmp_path / "rec")
    rec = open_recording(tmp_path / "rec")
    gpu, net, events = rec.read_all("gpu"), rec.read_all("net"), rec.events()
    lost = [i for i in rec.incidents() if i["fault"] == "power"]
    assert lost, "no power incident drawn"
    names = list(rec.manifest.nodes)
    for inc in lost:
        node, t = inc["node"], inc["failure_ts"]
        dark = lambda df: df[(df["node"] == node) & (df["ts"] > t + 30) & (df["ts"] < t + 1800)]  # noqa: E731
        assert len(dark(gpu)) == 0 and len(dark(net)) == 0, f"{node} still reports after losing its power"
        kmsg = events[events["source"] != "bmc"]
        assert len(dark(kmsg)) == 0
        before = gpu[(gpu["node"] == node) & (gpu["ts"] < t) & (gpu["ts"] > t - 600)]
        assert len(before), f"{node} was not reporting before its power failed"
    has_bmc = dict(zip(names, draw_world(17, power, 8).bmc_node))
    assert set(has_bmc.values()) == {True, False}
    speaking = set(events.loc[events["source"] == "bmc", "node"])
    assert speaking == {n for n, b in has_bmc.items() if b}


def test_a_drawn_worlds_failing_supply_brakes_as_often_as_its_magnitude_says(tmp_path):
    """A weak precursor brakes a node in a fifth of its samples at most, a strong one nearly always:
    so some warned power losses brake under half of every minute before the node goes dark."""
    from collector.schema import THROTTLE_HW_POWER_BRAKE, FaultClass

    share = {}
    for m in (0.4, 2.5):
        power = replace(BUSY, name=f"test-power-{m}", rate_multiplier=(6000, 6000), fault_magnitude=(m, m),
                        intermittent_prob=0.0, power_brake_per_rack_day=(0.0, 0.0))
        cfg = _cfg(seed=17, ranges=power, nodes=8, hours=6.0, mix={FaultClass.POWER: 1.0})
        simulate_recording(cfg, tmp_path / str(m))
        rec = open_recording(tmp_path / str(m))
        gpu = rec.read_all("gpu")
        late = []
        for inc in (i for i in rec.incidents() if i["fault"] == "power" and i["predictable"]):
            t0, t1 = inc["onset_ts"], inc["failure_ts"]
            own = gpu[(gpu["node"] == inc["node"]) & (gpu["ts"] >= t0 + 0.75 * (t1 - t0)) & (gpu["ts"] < t1)]
            late.append(((own["throttle_reasons"] & THROTTLE_HW_POWER_BRAKE) > 0).mean())
        assert late, "no warned power loss drawn"
        share[m] = float(np.mean(late))
    # the last quarter of the precursor: 0.4 x (43-55 %) at most 22 %; 2.5 x that is over 100 %, clipped
    assert share[0.4] < 0.25 and share[2.5] > 0.9, share
