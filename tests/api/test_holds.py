"""What a held node's resume waits for (api/holds.py): from its records, its latest scores and, on the engine
leader, the policy's memory of it."""

from __future__ import annotations

from api.holds import hold_status, retry_cap
from remediation.actions import ENGINE_ACTOR, ActionKind, ActionRecord, ActionState
from remediation.config import PolicyConfig
from remediation.policy import NodeState

CFG = PolicyConfig(min_hold_s=3600, resume_after_s=1800, clear_threshold=0.1)
T0 = 1_000_000.0


def record(kind=ActionKind.DRAIN, actor=ENGINE_ACTOR, at=T0, fault="gpu_off_bus", grade="certain",
           **kw) -> ActionRecord:
    return ActionRecord(id=f"{kind.value}-{actor}-{at}", node="n1", kind=kind, state=ActionState.SUCCEEDED,
                        reason="XID 79: GPU 3 fell off the bus", actor=actor, incident_ts=at, created_at=at,
                        updated_at=at, fault=fault, grade=grade, **kw)


def row(minutes: float, risk=0.02, rule=None, gpus_reading=8, gpus_lost=0, reasons=None) -> dict:
    return {"ts": T0 + 60 * minutes, "risk": risk, "rule": rule, "gpus_reading": gpus_reading,
            "gpus_lost": gpus_lost, "reasons": reasons or {}}


def test_a_node_nobody_holds_has_no_hold():
    drained, resumed = record(), record(ActionKind.RESUME, at=T0 + 7200)
    assert hold_status([], row(5), CFG, None) is None
    assert hold_status([resumed, drained], row(130), CFG, None) is None


def test_a_lost_gpu_and_the_minimum_hold_are_both_named():
    held = NodeState(held_since=T0, held_gpus=8)
    h = hold_status([record(evidence={"held_gpus": 8})], row(20, gpus_reading=8, gpus_lost=1), CFG, held)
    assert h["waiting_for"][0] == "min_hold_s: out 20 of 60 min"
    assert h["waiting_for"][1].startswith("1 GPU(s) without a reading for retain_silent_s")
    assert (h["since"], h["gpus_when_taken_out"], h["actor"]) == (T0, 8, ENGINE_ACTOR)


def test_after_a_restart_a_replica_counts_the_gpus_from_the_hold_record():
    h = hold_status([record(evidence={"held_gpus": 8})], row(90, gpus_reading=7, gpus_lost=0), CFG, None)
    assert h["waiting_for"] == ["7 of the 8 GPUs it had when taken out read now: every one must read again"]


def test_a_rule_and_a_high_risk_are_named_in_the_rule_s_own_words():
    h = hold_status([record()], row(90, risk=0.4, rule=2, reasons={"rule": "XID 79 fell off the bus"}), CFG, None)
    assert h["waiting_for"] == ["a rule still fires: XID 79 fell off the bus",
                                "risk 0.40, not under clear_threshold 0.1"]


def test_a_clean_node_waits_for_the_clean_time_only_the_leader_knows():
    rec = record(evidence={"held_gpus": 8})
    leader = NodeState(held_since=T0, held_gpus=8, healthy_since=T0 + 60 * 80)
    assert hold_status([rec], row(90), CFG, leader)["waiting_for"] == ["clean for 10 of resume_after_s 30 min"]
    assert hold_status([rec], row(120), CFG, leader)["waiting_for"] == []          # due at the next tick
    assert hold_status([rec], row(90), CFG, None)["waiting_for"][0].startswith("clean now: how long is the engine")


def test_a_person_s_hold_waits_for_the_person_even_after_gpuops_own():
    person = record(actor="operator:fay", at=T0 + 600)
    assert hold_status([person], row(90), CFG, None)["waiting_for"][0].startswith(
        "a person: taken out by operator:fay")
    both = hold_status([person, record(evidence={"held_gpus": 8})], row(90, gpus_reading=7), CFG, None)
    assert both["actor"] == "operator:fay" and both["since"] == T0 and both["gpus_when_taken_out"] == 8
    assert both["waiting_for"][0].startswith("7 of the 8 GPUs")


def test_a_replica_that_has_no_scores_of_the_node_says_so():
    h = hold_status([record()], None, CFG, None)
    assert h["waiting_for"] == ["scores: none of this node since this replica started"]
    assert h["gpus_reading"] is None


def test_the_retry_cap_names_the_class_that_was_wrong_and_ends_with_its_window():
    wrong = record(at=T0, fault="hbm_ecc", grade="predicted", source="model")
    resumed = record(ActionKind.RESUME, at=T0 + 3600, source="policy")
    cap = retry_cap([resumed, wrong], T0 + 7200, CFG)
    assert (cap["fault"], cap["since"], cap["until"], cap["action"]) == ("hbm_ecc", T0, T0 + 86400, wrong.id)
    assert retry_cap([resumed, wrong], T0 + 86400, CFG) is None              # the window is over
    assert retry_cap([wrong], T0 + 1800, CFG) is None                        # still held: not wrong yet
    every = retry_cap([resumed, wrong], T0 + 7200, CFG.model_copy(update={"model_retry_per_fault": False}))
    assert every["fault"] is None and every["reason"].startswith("predictions of every class only alert")


def test_a_prediction_whose_failure_came_while_held_caps_nothing():
    wrong = record(at=T0, fault="hbm_ecc", grade="predicted", source="model")
    came = record(at=T0 + 600, fault="hbm_ecc", source="rule")              # the failure came while it was held
    resumed = record(ActionKind.RESUME, at=T0 + 7200, source="policy")
    assert retry_cap([resumed, came, wrong], T0 + 9000, CFG) is None


def test_a_prediction_a_person_found_faulty_caps_nothing():
    found = record(at=T0, fault="hbm_ecc", grade="predicted", source="model", verdict="faulty")
    resumed = record(ActionKind.RESUME, at=T0 + 7200, source="policy")
    assert retry_cap([resumed, found], T0 + 9000, CFG) is None
    healthy = record(at=T0, fault="hbm_ecc", grade="predicted", source="model", verdict="healthy")
    assert retry_cap([resumed, healthy], T0 + 9000, CFG)["fault"] == "hbm_ecc"
