"""Shadow policies: decided on every live tick beside the engine's own, recorded, never carried out."""

from __future__ import annotations

import pytest

from remediation.config import PolicyConfig, policy_with
from remediation.shadow import ShadowPolicies
from tests.remediation.test_engine import POLICY, Clock, engine, explain, fleet


@pytest.fixture
def store():
    from remediation.store import ActionStore

    s = ActionStore("sqlite://")
    s.migrate()
    return s


def run(e, clock, ticks=6, p_risky=0.95):
    """A fleet of 4 nodes whose n00001 predicts an nvlink failure and n00002 fires a rule, tick after tick."""
    live = []
    for k in range(ticks):
        clock.t = 1_000_000.0 + 60 * k
        e.tick(fleet(4, clock.t, rule_nodes=(2,), p=[0.0, p_risky, 0.0, 0.0]), explain)
        live.append(list(e.last_decisions))
    return live


def test_a_shadow_of_the_live_policy_decides_exactly_as_it_and_none_is_carried_out(store):
    clock = Clock()
    shadow = ShadowPolicies({"same": POLICY, "rules-only": policy_with(POLICY, {"use_model": False})})
    e = engine(store, clock, shadow=shadow)
    live = run(e, clock)
    flat = [d.to_dict() for tick in live for d in tick]
    got = shadow.summary()
    assert got["ticks"] == 6 and got["since"] == 1_000_000.0
    assert got["live"]["recent"] == flat and got["shadows"]["same"]["recent"] == flat
    assert got["live"]["by_action_and_fault"]["drain"] == {"ib_link": 1, "nvlink": 1}
    only_rules = got["shadows"]["rules-only"]
    assert only_rules["by_action_and_fault"]["drain"] == {"ib_link": 1}   # the prediction is not its to act on
    assert only_rules["policy"]["use_model"] is False
    # the engine acted on its own decisions only: what it recorded is what it would without shadows
    plain_clock = Clock()
    from remediation.store import ActionStore
    other = ActionStore("sqlite://")
    other.migrate()
    plain = engine(other, plain_clock)
    assert [[d.to_dict() for d in t] for t in run(plain, plain_clock)] == [[d.to_dict() for d in t] for t in live]
    assert sorted((a.node, a.kind.value) for a in store.query()) == sorted((a.node, a.kind.value) for a in other.query())


def test_counts_are_by_policy_action_and_fault_and_recent_decisions_are_bounded(store):
    clock = Clock()
    shadow = ShadowPolicies({"strict": policy_with(POLICY, {"act_threshold": 0.99, "corroborate_threshold": 0.99})},
                            recent=2)
    e = engine(store, clock, shadow=shadow)
    run(e, clock, ticks=4)
    counts = shadow.counts()
    assert counts["live"][("drain", "nvlink")] == 1 and ("drain", "nvlink") not in counts["strict"]
    assert counts["strict"][("drain", "ib_link")] == 1
    assert all(len(v["recent"]) <= 2 for v in [shadow.summary()["live"], *shadow.summary()["shadows"].values()])
    assert isinstance(shadow.policies["strict"], PolicyConfig)
