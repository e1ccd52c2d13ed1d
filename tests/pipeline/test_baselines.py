"""Per-part rate baselines: a part is judged against what it usually does, whatever the sampling."""

from __future__ import annotations

import numpy as np

from pipeline.baselines import RateBaselines


def _feed(base: RateBaselines, rate_per_s: float, interval_s: float, hours: float, seed: int = 0) -> None:
    """Poisson events at *rate_per_s* reported every *interval_s* for *hours*, one part."""
    rng = np.random.default_rng(seed)
    parts = np.array([0])
    for k in range(int(hours * 3600 / interval_s)):
        events = rng.poisson(rate_per_s * interval_s)
        base.update(parts, (k + 1) * interval_s, np.array([[events]], float), np.array([[interval_s]]))


def test_a_part_with_a_steady_trickle_shows_no_excess_once_its_rate_is_learnt() -> None:
    base = RateBaselines(1, 4)
    _feed(base, 10 / 3600, 60.0, 24)           # ten errors an hour, all day
    same = base.excess(np.array([0]), np.array([[5.0]]), np.array([[1800.0]]))  # 5 in 30 min: its usual
    assert abs(same[0, 0]) < 0.3


def test_a_burst_on_a_quiet_part_is_a_large_excess_and_one_error_a_small_one() -> None:
    base = RateBaselines(1, 4)
    _feed(base, 0.0, 60.0, 24)
    parts = np.array([0])
    one = base.excess(parts, np.array([[1.0]]), np.array([[1800.0]]))[0, 0]
    burst = base.excess(parts, np.array([[200.0]]), np.array([[1800.0]]))[0, 0]
    assert 0 < one < 1.0
    assert burst > 4.0


def test_the_learnt_rate_does_not_depend_on_the_sampling_interval() -> None:
    rates = []
    for interval in (2.0, 10.0, 60.0):
        base = RateBaselines(1, 4)
        _feed(base, 30 / 3600, interval, 24, seed=int(interval))
        rates.append(base.rate(np.array([0]))[0, 0] * 3600)
    assert max(rates) / min(rates) < 1.25, rates
    assert 20 < np.mean(rates) < 40


def test_an_unsupported_counter_is_unknown_not_zero_and_teaches_nothing() -> None:
    base = RateBaselines(1, 4)
    parts = np.array([1])
    before = base.rate(parts).copy()
    base.update(parts, 60.0, np.array([[np.nan]]), np.array([[60.0]]))
    assert np.array_equal(base.rate(parts), before)
    assert np.isnan(base.excess(parts, np.array([[np.nan]]), np.array([[1800.0]]))[0, 0])


def test_a_new_part_starts_at_the_prior_and_growing_keeps_what_was_learnt() -> None:
    base = RateBaselines(1, 2)
    _feed(base, 20 / 3600, 60.0, 12)
    learnt = base.rate(np.array([0])).copy()
    base.ensure(100)
    assert np.array_equal(base.rate(np.array([0])), learnt)
    assert base.rate(np.array([99]))[0, 0] == base.a0 / base.b0
