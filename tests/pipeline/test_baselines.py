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


def _feed_events(base: RateBaselines, times_s: list[float], start_s: float, end_s: float, interval_s: float) -> list[float]:
    """Events at *times_s* reported every *interval_s* from *start_s* to *end_s*, one part: the
    CUSUM's excess after each report."""
    parts, out, t = np.array([0]), [], start_s
    while t < end_s:
        k = sum(t <= e < t + interval_s for e in times_s)
        base.update(parts, t + interval_s, np.array([[float(k)]]), np.array([[interval_s]]))
        out.append(float(base.cusum_excess(parts)[0, 0]))
        t += interval_s
    return out


def test_one_or_two_stray_errors_on_a_quiet_part_never_show_in_the_cusum() -> None:
    base = RateBaselines(1, 4)
    _feed(base, 0.0, 60.0, 6)                   # a quiet part, its rate learnt
    after = _feed_events(base, [6 * 3600 + 100, 6 * 3600 + 700], 6 * 3600, 12 * 3600, 60.0)
    assert max(after) == 0.0


def test_errors_that_keep_coming_show_and_the_sampling_interval_does_not_matter() -> None:
    """A precursor at one error every 5 min on a part that usually has none: the CUSUM
    crosses its alarm level within the half hour, at 2 s, 10 s or 60 s reports alike."""
    crossed = []
    for interval in (2.0, 10.0, 60.0):
        base = RateBaselines(1, 4)
        _feed(base, 0.0, interval, 6)
        start = 6 * 3600
        events = [start + 150 + 300 * i for i in range(12)]
        out = _feed_events(base, events, start, start + 3600, interval)
        first = next(i for i, v in enumerate(out) if v > 0)
        crossed.append((first + 1) * interval)
        assert out[-1] > 5.0, interval
    assert max(crossed) < 1800 and max(crossed) - min(crossed) <= 120, crossed


def test_a_noisy_part_at_its_usual_rate_shows_nothing_but_ten_times_it_does() -> None:
    base = RateBaselines(1, 4)
    _feed(base, 30 / 3600, 60.0, 24)           # thirty errors an hour is this port's normal
    rng = np.random.default_rng(7)
    usual = _feed_events(base, sorted(24 * 3600 + rng.uniform(0, 3600, 30)), 24 * 3600, 25 * 3600, 60.0)
    assert max(usual) == 0.0
    ten_x = _feed_events(base, sorted(25 * 3600 + rng.uniform(0, 3600, 300)), 25 * 3600, 26 * 3600, 60.0)
    assert ten_x[-1] > 0.0


def test_the_cusum_waits_for_an_hour_of_baseline_is_unknown_without_exposure_and_restarts_with_the_part() -> None:
    base = RateBaselines(1, 4)
    parts = np.array([0])
    assert np.isnan(base.cusum_excess(parts)[0, 0])
    early = _feed_events(base, [60.0 * i for i in range(1, 40)], 0.0, 2400.0, 60.0)  # 1/min from the start
    assert max(early) == 0.0                    # the prior's guess is not the part's rate yet
    steady = _feed_events(base, [2400.0 + 60.0 * i for i in range(1, 200)], 2400.0, 4 * 3600.0, 60.0)
    assert max(steady) == 0.0                   # warm now, and 1/min is what it learnt
    rise = _feed_events(base, [4 * 3600.0 + 6.0 * i for i in range(1, 200)], 4 * 3600.0, 4 * 3600.0 + 1200, 60.0)
    assert rise[-1] > 0.0                       # 10/min: ten times its own rate
    base.restart(parts)
    assert base.cusum_excess(parts)[0, 0] == 0.0 and base.s[0, 0] == 0.0


def test_a_straggler_trend_builds_with_busy_time_while_a_power_cap_dip_fades() -> None:
    from pipeline.baselines import DeficitTrend

    trend = DeficitTrend(4)
    parts = np.array([0, 1, 2])
    seen = []
    for k in range(40):   # part 0 30 % slow; part 1 dips 12 % one tick in ten (DVFS at its cap); part 2 12 % slow
        out = trend.update(parts, 60.0 * (k + 1), 60.0, np.array([0.3, 0.12 if k % 10 == 3 else 0.0, 0.12]))
        seen.append(out.copy())
    seen = np.array(seen)
    assert seen[0, 0] < 0.05                       # one slow tick is not a straggler
    first = int(np.argmax(seen[:, 0] >= 0.15))     # 0.3 (1 - exp(-t / 10 min)) >= 0.15: t = 10 min x ln 2
    assert 6 <= first + 1 <= 8
    assert abs(seen[-1, 0] - 0.3 * (1 - np.exp(-40 / 10))) < 1e-9
    assert seen[:, 1].max() < 0.02
    assert seen[:, 2].max() < 0.12                 # a shallow deficit never reaches its own depth


def test_a_trend_reads_nan_while_idle_decays_over_an_idle_spell_and_restarts_with_its_part() -> None:
    from pipeline.baselines import DeficitTrend

    trend = DeficitTrend(2)
    p = np.array([0])
    for k in range(1, 41):
        trend.update(p, 60.0 * k, 60.0, np.array([0.3]))
    held = trend.value[0]
    assert np.isnan(trend.update(p, 2460.0, 60.0, np.array([np.nan]))[0])   # idle this tick
    assert trend.value[0] == held                                             # ... and nothing learnt
    back = trend.update(p, 2580.0, 60.0, np.array([0.3]))[0]                  # busy again after 2 idle min
    assert 0.8 * held < back < held
    assert trend.update(p, 2580.0 + 6 * 3600, 60.0, np.array([0.0]))[0] < 1e-6  # hours of idle: as new
    trend.update(p, 30000.0, 60.0, np.array([0.3]))
    trend.restart(p)
    assert trend.update(p, 30060.0, 60.0, np.array([0.0]))[0] == 0.0
    # a muted tick does not learn
    assert trend.update(p, 30120.0, 60.0, np.array([0.5]), frozen=np.array([True]))[0] == 0.0


def test_a_trend_grows_to_hold_new_parts() -> None:
    from pipeline.baselines import DeficitTrend

    trend = DeficitTrend(1)
    trend.ensure(5)
    assert abs(trend.update(np.array([4]), 60.0, 60.0, np.array([0.1]))[0] - 0.1 * (1 - np.exp(-0.1))) < 1e-12


def test_a_trend_skips_a_minute_without_a_reading_so_its_level_does_not_follow_the_sampling_interval() -> None:
    from pipeline.baselines import DeficitTrend

    every, sparse = DeficitTrend(1), DeficitTrend(1)
    p = np.array([0])
    for k in range(1, 61):            # an hour of a GPU 12 % slower than its busy peers
        a = every.update(p, 60.0 * k, 60.0, np.array([0.12]))[0]
        unread = k % 3 == 0          # sampled every 90 s: every third minute holds no sample
        b = sparse.update(p, 60.0 * k, 60.0, np.array([np.nan if unread else 0.12]), unread=np.array([unread]))[0]
        assert np.isnan(b) == unread  # nothing to read that minute
    read = 40                         # minutes the sparse GPU was read
    assert abs(sparse.value[0] - 0.12 * (1 - np.exp(-read / 10))) < 1e-9   # the read minutes, none decayed
    assert abs(a - 0.12 * (1 - np.exp(-6))) < 1e-9 and sparse.value[0] > 0.10 # both past the straggler line
    # without the flag an unread minute decays it as idle time would: it levels off under 0.10
    idle = DeficitTrend(1)
    for k in range(1, 61):
        idle.update(p, 60.0 * k, 60.0, np.array([np.nan if k % 3 == 0 else 0.12]))
    assert idle.value[0] < 0.085
    # a read minute of idling still decays it, unread or not before it
    held = sparse.value[0]
    sparse.update(p, 3660.0, 60.0, np.array([np.nan]), unread=np.array([False]))
    after = sparse.update(p, 3720.0, 60.0, np.array([0.12]), unread=np.array([False]))[0]
    assert after < held


def test_a_trend_of_two_columns_reads_as_two_trends_on_one_clock() -> None:
    from pipeline.baselines import DeficitTrend

    both, deficit, slow = DeficitTrend(2, columns=2), DeficitTrend(2), DeficitTrend(2)
    p = np.array([0, 1])
    for k in range(1, 41):            # GPU 0 slow every other minute, idle every fifth; GPU 1 unread every third
        d0 = np.nan if k % 5 == 0 else (0.15 if k % 2 else 0.0)
        d = np.array([d0, np.nan if k % 3 == 0 else 0.02])
        s = np.where(np.isnan(d), np.nan, d >= 0.1)
        unread = np.array([False, k % 3 == 0])
        got = both.update(p, 60.0 * k, 60.0, np.column_stack([d, s]), unread=unread)
        one = np.column_stack([deficit.update(p, 60.0 * k, 60.0, d, unread=unread),
                               slow.update(p, 60.0 * k, 60.0, s, unread=unread)])
        assert np.array_equal(got, one, equal_nan=True)
    assert 0.4 < both.value[0, 1] < 0.6 and both.value[1, 1] == 0.0   # a share of slow minutes
