"""The judging benches' arithmetic: shift-suite draws and pooled false-action rates."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_robustness import poisson_upper, pooled  # noqa: E402
from bench_shift import MAX_DRAW, SUITE, seed_of  # noqa: E402


def test_every_draw_of_the_suite_keeps_its_seeds_distinct_and_inside_the_suites_range() -> None:
    seeds = [seed_of(name, d) for d in range(1, MAX_DRAW + 1) for name in SUITE]
    assert len(set(seeds)) == len(seeds)
    assert all(401 <= s <= 499 for s in seeds)
    assert [seed_of(name) for name in SUITE] == [seed for _, seed in SUITE.values()]


@pytest.mark.parametrize("draw", [0, MAX_DRAW + 1])
def test_a_draw_outside_the_range_is_refused(draw: int) -> None:
    with pytest.raises(ValueError, match="draw must be"):
        seed_of("messy", draw)


def test_the_upper_bound_after_no_event_is_three() -> None:
    assert poisson_upper(0) == pytest.approx(2.9957, abs=1e-3)
    assert poisson_upper(1) > poisson_upper(0)


def _row(group: str, days: float, false: int, false_rules: int = 0) -> dict:
    return {"group": group, "model": {"node_days": days, "false_actions": false},
            "rules_baseline": {"node_days": days, "false_actions": false_rules}}


def test_a_group_is_read_over_all_its_node_days() -> None:
    text = pooled([_row("shift", 64, 1), _row("shift", 64, 0, 2), _row("home", 64, 0)])
    shift = next(line for line in text.splitlines() if line.startswith("| shift"))
    cells = [c.strip() for c in shift.strip("|").split("|")]
    assert cells[1:5] == ["2", "128", "1 / 2", "7.8"]
    assert float(cells[5]) == pytest.approx(1000 * poisson_upper(1) / 128, abs=0.05)
    home = next(line for line in text.splitlines() if line.startswith("| home"))
    assert home.split("|")[5].strip() == "0.0" and float(home.split("|")[6]) == pytest.approx(46.8, abs=0.05)


def test_classes_are_counted_over_every_recording_of_a_group() -> None:
    from bench_robustness import by_class

    a = {"group": "shift", "model": {"per_class": {"power": (1, 2, 0, 1), "pcie": (3, 3, 2, 2)}}}
    b = {"group": "shift", "model": {"per_class": {"power": (2, 2, 1, 1)}}}
    text = by_class([a, b])
    header, _, shift = text.splitlines()
    assert header == "| group | pcie | power |"
    assert shift == "| shift | 3/3, 2/2 ahead | 3/4, 1/2 ahead |"


def test_each_compared_policy_is_pooled_beside_the_policy_per_group() -> None:
    from bench_robustness import alternatives_table

    def m(caught, ahead, false):
        return {"caught": caught, "node_fault_incidents": 10, "caught_predictively": ahead, "predictable": 8,
                "false_actions": false}

    rows = [{"group": "tuning", "model": m(9, 6, 1), "alternatives": {"alert": m(9, 2, 0)}},
            {"group": "tuning", "model": m(10, 7, 0), "alternatives": {"alert": m(10, 3, 0)}},
            {"group": "shift", "model": m(8, 5, 2), "alternatives": {"alert": m(8, 5, 1)}}]
    lines = alternatives_table(rows).splitlines()[2:]
    assert lines == ["| tuning | --policy | 19/20 | 13/16 | 1 |", "| tuning | alert | 19/20 | 5/16 | 0 |",
                     "| shift | --policy | 8/10 | 5/8 | 2 |", "| shift | alert | 8/10 | 5/8 | 1 |"]


def test_the_tuning_ground_is_24_recordings_of_tuning_seeds_and_their_thinned_copies() -> None:
    from tuning_ground import WORLDS, recordings

    rec = recordings()
    assert len(rec) == 24 and len({name for name, *_ in rec}) == 24
    assert {kind for _, kind, _, _ in rec} == {"native", "sbe-burst", "thinned"}
    # tuning seeds only (home 11-12 are the home world's tuning seeds): never training's or the suite's
    assert all(301 <= w.seed <= 399 or (w.ranges is None and w.seed in (11, 12)) for w in WORLDS)
    assert all(w.ranges is None or not w.ranges.startswith("shift-") for w in WORLDS)
    assert all(k >= 2 for _, kind, _, k in rec if kind == "thinned")


def _tuning_row(name: str, caught: int, incidents: int, ahead: int, predictable: int, false: int) -> dict:
    m = {"caught": caught, "node_fault_incidents": incidents, "caught_predictively": ahead,
         "predictable": predictable, "false_actions": false}
    return {"group": "tuning", "name": name, "model": m, "rules_baseline": {**m, "false_actions": 0}}


def test_tuning_rows_are_totalled_by_the_grounds_sets() -> None:
    from bench_robustness import tuning_sets

    text = tuning_sets([_tuning_row("tune-301", 28, 28, 13, 19, 0), _tuning_row("tune-302", 25, 25, 15, 18, 1),
                        _tuning_row("tune-302-every3", 25, 25, 15, 18, 1), _tuning_row("elsewhere", 9, 9, 9, 9, 9)])
    assert "| native | 2 | 53/53 | 28/37 | 1 / 0 |" in text
    assert "| thinned | 1 | 25/25 | 15/18 | 1 / 0 |" in text
    assert "| all | 3 | 78/78 | 43/55 | 2 / 0 |" in text  # a recording not of the ground is left out
    assert tuning_sets([_tuning_row("elsewhere", 1, 1, 1, 1, 0)]) == ""
