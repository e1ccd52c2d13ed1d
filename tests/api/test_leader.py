"""Engine leadership by the store's lease: one leader, takeover within the bound, acting only while held.

Two electors on one SQLite store, with stepped clocks (no waiting for ttl to pass).
"""

from __future__ import annotations

from pathlib import Path

from api.leader import LeaderElector
from remediation.store import ActionStore


class Clocks:
    """A wall clock and a monotonic clock moved together by the test."""

    def __init__(self) -> None:
        self.t = 1000.0

    def wall(self) -> float:
        return self.t

    def mono(self) -> float:
        return self.t


def _store(tmp_path: Path) -> ActionStore:
    s = ActionStore(f"sqlite:///{tmp_path / 'a.db'}")
    s.migrate()
    return s


def _elector(store: ActionStore, name: str, c: Clocks, log: list) -> LeaderElector:
    return LeaderElector(store, name, 15.0, clock=c.wall, monotonic=c.mono,
                         on_gain=lambda e: log.append((name, "gain", e)), on_loss=lambda: log.append((name, "loss")))


def test_exactly_one_of_two_replicas_leads(tmp_path: Path) -> None:
    store, c, log = _store(tmp_path), Clocks(), []
    a, b = _elector(store, "a", c, log), _elector(store, "b", c, log)
    assert a.step() is True and b.step() is False
    for _ in range(10):
        c.t += a.renew_every_s
        assert a.step() and not b.step()
    assert log == [("a", "gain", 1)]


def test_standby_takes_over_within_ttl_plus_renew_interval_when_the_leader_dies(tmp_path: Path) -> None:
    store, c, log = _store(tmp_path), Clocks(), []
    a, b = _elector(store, "a", c, log), _elector(store, "b", c, log)
    a.step()
    died = c.t                                   # a stops renewing: it was killed
    while not b.step():
        c.t += b.renew_every_s
    assert c.t - died <= a.ttl_s + b.renew_every_s
    assert log[-1] == ("b", "gain", 2) and b.epoch == 2


def test_leader_that_cannot_renew_stops_acting_when_its_deadline_passes(tmp_path: Path) -> None:
    store, c, log = _store(tmp_path), Clocks(), []
    a = _elector(store, "a", c, log)
    a.step()
    a.store = ActionStore(f"sqlite:///{tmp_path / 'missing' / 'x.db'}")   # unreachable: every call fails
    c.t += 5
    assert a.step() is True                      # still within its term
    c.t += 11
    assert a.step() is False and a.is_leader() is False
    assert log[-1] == ("a", "loss")


def test_lease_taken_over_while_leader_paused_makes_it_step_down(tmp_path: Path) -> None:
    store, c, log = _store(tmp_path), Clocks(), []
    a, b = _elector(store, "a", c, log), _elector(store, "b", c, log)
    a.step()
    c.t += 20                                    # a was paused (GC, a stalled host) past its ttl
    assert a.is_leader() is False                # its own deadline already tells it
    assert b.step() is True
    assert a.step() is False
    assert ("a", "loss") in log


def test_released_lease_goes_to_the_standby_at_once(tmp_path: Path) -> None:
    store, c, log = _store(tmp_path), Clocks(), []
    a, b = _elector(store, "a", c, log), _elector(store, "b", c, log)
    a.step()
    a.release()
    assert b.step() is True and a.is_leader() is False


def test_failed_takeover_gives_the_lease_back(tmp_path: Path) -> None:
    store, c = _store(tmp_path), Clocks()

    def boom(epoch: int) -> None:
        raise RuntimeError("adapter down")

    a = LeaderElector(store, "a", 15.0, clock=c.wall, monotonic=c.mono, on_gain=boom)
    assert a.step() is False
    assert store.lease_holder("engine", now=c.t) is None
