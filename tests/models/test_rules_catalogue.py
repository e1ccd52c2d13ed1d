"""Rules are the catalogue: every XID acts as its NVIDIA bucket says, from kernel event to decision.

Events go through the real pipeline (features), the rules, the node aggregation and the
policy, on otherwise healthy GPUs, so what is checked is what the engine would be told.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collector.schema import Action, FaultClass, FollowUp, Grade
from collector.xid import catalog, class_of
from models.bundle import ModelBundle
from models.node_scores import aggregate, score_batches
from models.rules import DEFAULT_RULES, PORT_DOWN_SUSTAINED_S, Rule, RulesDetector
from pipeline.features import FEATURE_NAMES
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from remediation.config import PolicyConfig
from remediation.policy import PolicyState, decide

T0 = 1_700_000_000.0
SETTINGS = PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=600)
GPUS = 4


def _healthy(nodes: int, samples: int = 12, **flags: float) -> pd.DataFrame:
    """Quiet GPUs every 10 s: no counters, no throttling; *flags* set gauges on every row."""
    n = nodes * GPUS * samples
    k = np.repeat(np.arange(samples), nodes * GPUS)
    return pd.DataFrame({
        "ts": T0 + 10.0 * k, "node": np.tile(np.repeat([f"n{i:03d}" for i in range(nodes)], GPUS), samples),
        "gpu": np.tile(np.arange(GPUS), nodes * samples).astype(np.int16),
        "util_gpu": np.full(n, 50.0, np.float32), "throttle_reasons": np.zeros(n), **flags})


def _events(xids: list[tuple[int, int | None, int]]) -> pd.DataFrame:
    """XID events (node index, gpu or None, code) at T0 + 15 s."""
    return pd.DataFrame({
        "ts": T0 + 15.0, "node": [f"n{n:03d}" for n, _, _ in xids],
        "gpu": pd.array([g for _, g, _ in xids], dtype="Int16"), "source": "kmsg", "kind": "xid",
        "code": pd.array([c for _, _, c in xids], dtype="Int32"), "pci_bus_id": None, "message": "NVRM: Xid"})


def _outcome(gpu: pd.DataFrame, events: pd.DataFrame | None = None):
    """Node scores and the policy's decisions at the first tick (the XIDs are in its short window)."""
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(gpu, None, events)
    batch = pipe.flush()[0]
    bundle = ModelBundle.rules_only()
    (sc,) = score_batches(bundle, [batch])
    ns = aggregate(batch, sc, bundle.rules)
    cfg = PolicyConfig(model_warmup_s=0)
    decisions, _ = decide(ns, PolicyState(), batch.ts, cfg, lambda i, source: source)
    return ns, {d.node: d for d in decisions}, bundle.rules


def test_every_catalogue_code_acts_as_its_bucket_says():
    codes = sorted(catalog())
    ns, decisions, rules = _outcome(_healthy(len(codes)), _events([(i, 1, c) for i, c in enumerate(codes)]))
    for i, code in enumerate(codes):
        cls, bucket, node = class_of(code), catalog()[code].immediate_action, f"n{i:03d}"
        j = list(ns.node).index(node)
        if not cls.acts:
            assert ns.rule[j] < 0 and node not in decisions, (code, bucket)
            assert bucket not in ("RESET_GPU", "RESTART_BM", "WORKFLOW_XID_48") or code == 109, code
            continue
        d = decisions[node]
        assert (d.action, d.follow_up, d.fault, d.gpu, d.grade) == (
            cls.action, cls.follow_up, cls.fault, 1, Grade.CERTAIN), (code, bucket)
        assert bucket not in ("RESTART_APP", "IGNORE", "WORKFLOW_XID_45"), code
        expected = {"RESET_GPU": (Action.RESET, None), "WORKFLOW_XID_48": (Action.RESET, None),
                    "RESTART_BM": (Action.DRAIN, FollowUp.REBOOT), "WORKFLOW_NVLINK_ERR": (Action.DRAIN, None),
                    "WORKFLOW_NVLINK5_ERR": (Action.DRAIN, None)}[bucket]
        assert (d.action, d.follow_up) == expected, (code, bucket)


@pytest.mark.parametrize("codes", [[94], [63], [92], [13, 31, 43, 45]])
def test_app_and_informational_xids_alone_take_no_action(codes):
    _, decisions, _ = _outcome(_healthy(1), _events([(0, 1, c) for c in codes]))
    assert decisions == {}


def test_63_with_94_on_one_gpu_drains_and_resets_when_idle():
    _, decisions, _ = _outcome(_healthy(1), _events([(0, 2, 63), (0, 2, 94)]))
    d = decisions["n000"]
    assert (d.action, d.follow_up, d.fault, d.gpu) == (Action.DRAIN, FollowUp.RESET_WHEN_IDLE, FaultClass.HBM_ECC, 2)


def test_63_and_94_on_different_gpus_take_no_action():
    _, decisions, _ = _outcome(_healthy(1), _events([(0, 1, 63), (0, 2, 94)]))
    assert decisions == {}


def test_a_pending_remap_flag_with_a_new_contained_error_drains_and_resets_when_idle():
    _, decisions, _ = _outcome(_healthy(1, row_remap_pending=np.float32(1.0)), _events([(0, 3, 94)]))
    d = decisions["n000"]
    assert (d.action, d.follow_up, d.gpu) == (Action.DRAIN, FollowUp.RESET_WHEN_IDLE, 3)


def test_a_pending_remap_flag_alone_takes_no_action():
    _, decisions, _ = _outcome(_healthy(1, row_remap_pending=np.float32(1.0)))
    assert decisions == {}


def test_a_row_remap_failure_resets_like_xid_64():
    _, decisions, _ = _outcome(_healthy(1, row_remap_failure=np.float32(1.0)))
    assert decisions["n000"].action is class_of(64).action is Action.RESET


@pytest.mark.parametrize("code, action, follow_up", [
    (79, Action.DRAIN, FollowUp.REBOOT),
    (95, Action.DRAIN, FollowUp.RESET_WHEN_IDLE),  # a reset needs a GPU: drain, reset the node's GPUs when idle
    (48, Action.DRAIN, FollowUp.RESET_WHEN_IDLE),
    (74, Action.DRAIN, None),
])
def test_an_xid_naming_no_gpu_acts_on_the_node_never_on_gpu_0(code, action, follow_up):
    ns, decisions, _ = _outcome(_healthy(1), _events([(0, None, code)]))
    d = decisions["n000"]
    assert d.gpu is None and ns.rule_gpu[0] == -1
    assert (d.action, d.follow_up, d.grade) == (action, follow_up, Grade.CERTAIN)


def test_an_xid_naming_no_gpu_that_never_acts_alone_takes_no_action():
    _, decisions, _ = _outcome(_healthy(1), _events([(0, None, 13), (0, None, 94), (0, None, 63)]))
    assert decisions == {}


def test_the_port_rule_fires_only_on_a_port_down_since_active_for_the_sustained_time():
    col = FEATURE_NAMES.index("net_port_down_after_active_s")
    x = np.zeros((3, len(FEATURE_NAMES)), np.float32)
    x[:, [i for i, n in enumerate(FEATURE_NAMES) if n.startswith("node_bmc_")]] = np.nan  # no BMC (a 0 margin fires)
    x[:, col] = [0.0, PORT_DOWN_SUSTAINED_S - 10, PORT_DOWN_SUSTAINED_S]
    x[:, FEATURE_NAMES.index("net_ports_not_active_frac_short")] = 1.0  # a never-active port: frac alone never fires
    r = RulesDetector(FEATURE_NAMES)
    rule = r.score(x).detail["rule"]
    assert rule[:2].tolist() == [-1, -1]
    assert r.rules[rule[2]].name == "ib_port_not_active"


def test_rules_survive_a_save_and_load_with_their_conditions_and_scope():
    r = RulesDetector(FEATURE_NAMES)
    again = RulesDetector(FEATURE_NAMES)
    again.set_state(r.get_state())
    assert again.rules == r.rules == DEFAULT_RULES


def test_a_rule_requiring_an_unknown_feature_fails_at_load():
    bad = Rule("x", "row_remap_pending", 0, FaultClass.HBM_ECC, Action.DRAIN, "x", requires=(("nope", 0),))
    with pytest.raises(Exception, match="nope"):
        RulesDetector(FEATURE_NAMES, (bad,))


def test_a_node_held_for_a_dead_port_is_not_resumed_while_the_port_stays_down():
    samples = 3 * 360  # 3 h at 10 s; the port goes down after 10 min and stays down
    gpu = _healthy(1, samples)
    ts = T0 + 10.0 * np.arange(samples) + 0.5
    net = pd.DataFrame({"ts": ts, "node": "n000", "device": "mlx5_0", "port": np.ones(samples, np.int16),
                        "link_state": np.where(np.arange(samples) < 60, "ACTIVE", "DOWN")})
    pipe = FeaturePipeline(PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=1800))
    pipe.ingest_frames(gpu, net)
    bundle = ModelBundle.rules_only()
    cfg = PolicyConfig(model_warmup_s=0)  # held >= min_hold_s (1 h) and healthy for 30 min would resume it
    state, decisions, fired = PolicyState(), [], []
    for batch in pipe.flush():
        (sc,) = score_batches(bundle, [batch])
        ns = aggregate(batch, sc, bundle.rules)
        fired.append(int(ns.rule[0]))
        d, state = decide(ns, state, batch.ts, cfg, lambda i, source: source)
        decisions += d
    assert [(d.action, d.source) for d in decisions] == [(Action.DRAIN, "rule")]
    assert bundle.rules.rules[fired[-1]].name == "ib_port_not_active"
    assert state.held() == ["n000"]
