"""The leader lease in the action store: one holder at a time, expiry, renewal, fencing epochs.

Runs on SQLite and PostgreSQL (the ``store`` fixture); time is passed in, so expiry is
stepped, not waited for.
"""

from __future__ import annotations

import threading

import pytest

from remediation.store import ActionStore, StoreError


def test_first_holder_takes_the_lease_in_epoch_one(store: ActionStore) -> None:
    assert store.acquire_lease("engine", "a", 10.0, now=100.0) == 1
    assert store.lease_holder("engine", now=105.0) == "a"


def test_second_holder_is_refused_while_the_lease_is_live(store: ActionStore) -> None:
    store.acquire_lease("engine", "a", 10.0, now=100.0)
    assert store.acquire_lease("engine", "b", 10.0, now=109.0) is None
    assert store.lease_holder("engine", now=109.0) == "a"


def test_holder_acquiring_again_keeps_its_epoch_and_extends(store: ActionStore) -> None:
    store.acquire_lease("engine", "a", 10.0, now=100.0)
    assert store.acquire_lease("engine", "a", 10.0, now=105.0) == 1
    assert store.lease("engine").expires_at == pytest.approx(115.0)


def test_expired_lease_goes_to_another_holder_with_a_new_epoch(store: ActionStore) -> None:
    store.acquire_lease("engine", "a", 10.0, now=100.0)
    assert store.acquire_lease("engine", "b", 10.0, now=110.5) == 2
    assert store.lease_holder("engine", now=111.0) == "b"
    assert store.renew_lease("engine", "a", 10.0, now=111.0) is False


def test_renew_extends_only_a_live_lease_of_the_same_term(store: ActionStore) -> None:
    store.acquire_lease("engine", "a", 10.0, now=100.0)
    assert store.renew_lease("engine", "a", 10.0, now=108.0, epoch=1) is True
    assert store.lease("engine").expires_at == pytest.approx(118.0)
    assert store.renew_lease("engine", "a", 10.0, now=108.0, epoch=7) is False
    assert store.renew_lease("engine", "a", 10.0, now=200.0) is False      # lapsed meanwhile


def test_same_holder_after_lapse_starts_a_new_term(store: ActionStore) -> None:
    store.acquire_lease("engine", "a", 10.0, now=100.0)
    assert store.acquire_lease("engine", "a", 10.0, now=150.0) == 2


def test_released_lease_is_taken_at_once_by_a_standby(store: ActionStore) -> None:
    store.acquire_lease("engine", "a", 30.0, now=100.0)
    assert store.release_lease("engine", "a") is True
    assert store.lease_holder("engine", now=101.0) is None
    assert store.acquire_lease("engine", "b", 30.0, now=101.0) == 2
    assert store.release_lease("engine", "a") is False


def test_leases_of_different_names_are_independent(store: ActionStore) -> None:
    assert store.acquire_lease("engine", "a", 10.0, now=100.0) == 1
    assert store.acquire_lease("retrain", "b", 10.0, now=100.0) == 1


def test_non_positive_ttl_is_refused(store: ActionStore) -> None:
    with pytest.raises(StoreError, match="ttl"):
        store.acquire_lease("engine", "a", 0.0, now=100.0)


def test_racing_holders_never_both_win(store_url: str) -> None:
    stores = [ActionStore(store_url) for _ in range(4)]
    stores[0].migrate()
    wins: list[tuple[int, str, int]] = []
    lock = threading.Lock()

    def contend(k: int) -> None:
        for rnd in range(15):
            # every round starts after the previous lease lapsed: exactly one winner per round
            epoch = stores[k].acquire_lease("engine", f"r{k}", 5.0, now=1000.0 + rnd * 10.0)
            if epoch is not None:
                with lock:
                    wins.append((rnd, f"r{k}", epoch))

    threads = [threading.Thread(target=contend, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    by_round: dict[int, set[str]] = {}
    for rnd, who, _ in wins:
        by_round.setdefault(rnd, set()).add(who)
    assert all(len(w) == 1 for w in by_round.values()), by_round
    epochs = sorted(e for _, _, e in wins)
    assert len(set(epochs)) == len(epochs)           # every term has its own fencing token


def test_retention_deletes_old_scores_and_alerts_but_keeps_the_audit_trail(store: ActionStore) -> None:
    from remediation.actions import ActionKind, ActionRecord, ActionState
    from remediation.store import NodeScoreRow

    store.put_scores([NodeScoreRow("n1", 10.0, 0.1, None, 0.0, None, "ok"),
                      NodeScoreRow("n2", 500.0, 0.1, None, 0.0, None, "ok")])

    def rec(i: str, kind: ActionKind, at: float) -> ActionRecord:
        return ActionRecord(id=i, node="n1", kind=kind, state=ActionState.PROPOSED, reason="r", actor="engine",
                            incident_ts=at, created_at=at, updated_at=at)

    store.insert(rec("old-alert", ActionKind.ALERT, 10.0))
    store.insert(rec("new-alert", ActionKind.ALERT, 500.0))
    store.insert(rec("old-drain", ActionKind.DRAIN, 10.0))
    assert store.delete_older_than(100.0) == {"node_scores": 1, "alerts": 1}
    assert [r.node for r in store.scores()] == ["n2"]
    assert {r.id for r in store.query(limit=10)} == {"new-alert", "old-drain"}
