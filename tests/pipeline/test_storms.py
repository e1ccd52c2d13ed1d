"""A GPU's corrected-ECC rate over 10 minutes against its own 2-hour peak and its own hour before (pipeline.storms)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.settings import PipelineSettings
from pipeline.storms import SbeStorm
from pipeline.stream import FeaturePipeline
from tests.pipeline.synth import Fleet, gpu_frame

ONE = np.array([0])


def feed(storm: SbeStorm, per_min: list[float], step_s: float = 60.0, t0: float = 600_000.0,
         parts: np.ndarray = ONE) -> list[tuple[float, float]]:
    """Feed *per_min* errors per minute as windows of *step_s*; (rate, ratio) after each minute."""
    out = []
    k = int(round(60.0 / step_s))
    for m, e in enumerate(per_min):
        for j in range(k):
            now = t0 + m * 60.0 + (j + 1) * step_s
            r, q, _ = storm.update(parts, now, np.full(len(parts), e / k), np.full(len(parts), step_s))
        out.append((float(r[0]), float(q[0])))
    return out


def test_the_rate_is_the_last_ten_minutes_per_hour_whatever_the_tick():
    per_min = [0.0] * 5 + [6.0] * 20
    by_minute = feed(SbeStorm(1), per_min, step_s=60.0)
    by_half = feed(SbeStorm(1), per_min, step_s=30.0)           # two windows add up in one bucket
    assert by_minute[-1][0] == pytest.approx(360.0)             # 6 a minute = 360 an hour
    assert by_minute[9][0] == pytest.approx(5 * 6.0 / 600 * 3600)  # 5 of the last 10 minutes erred
    assert [r for r, _ in by_half] == pytest.approx([r for r, _ in by_minute])


def test_a_storm_that_tails_off_falls_under_its_peak_and_a_growing_one_does_not():
    tail = [100.0] * 20 + [100.0 * np.exp(-m / 20.0) for m in range(1, 60)]
    ratios = [q for _, q in feed(SbeStorm(1), tail)]
    assert ratios[19] == 1.0                                     # at its peak
    assert ratios[-1] < 0.2 and min(ratios[30:]) < 0.6           # falling for an hour
    assert np.all(np.diff(ratios[25:]) <= 1e-12)
    growing = [float(m) for m in range(80)]
    assert all(q == pytest.approx(1.0) for _, q in feed(SbeStorm(1), growing)[1:])


def test_the_peak_is_forgotten_after_two_hours_and_errors_that_come_back_climb_to_it():
    s = SbeStorm(1)
    feed(s, [60.0] * 10)                                         # a peak of 3,600 an hour
    quiet = feed(s, [1.0] * 60, t0=600_000.0 + 600)              # an hour of 1 a minute: 1/60 of the peak
    assert quiet[-1][1] == pytest.approx(1 / 60)
    back = feed(s, [60.0] * 10, t0=600_000.0 + 4200)             # the errors come back
    assert back[-1][1] == pytest.approx(1.0)
    later = feed(s, [1.0] * 130, t0=600_000.0 + 4800)            # two hours later the peak is a new one
    assert later[-1][1] == pytest.approx(1.0)


def test_no_errors_read_one_no_exposure_reads_nan_and_a_gap_reads_only_what_is_recent():
    s = SbeStorm(2)
    r, q, _ = s.update(np.array([0, 1]), 600_060.0, np.array([0.0, np.nan]), np.array([60.0, np.nan]))
    assert (r[0], q[0]) == (0.0, 1.0)                             # nothing to fall from
    assert np.isnan(r[1]) and np.isnan(q[1])                      # no counter: unknown, not quiet
    feed(s, [30.0] * 10, t0=600_060.0)
    r, q, _ = s.update(ONE, 600_060.0 + 600 + 1800, np.array([0.0]), np.array([60.0]))  # 30 min silent, then a window
    assert r[0] == 0.0 and q[0] == 0.0                            # the old minutes are not in the window
    r, q, _ = s.update(ONE, 600_060.0 + 600 + 7200 + 600, np.array([0.0]), np.array([60.0]))
    assert q[0] == 1.0                                            # ... nor, two hours on, the old peak


def test_a_repaired_gpu_starts_afresh_and_the_state_grows_with_the_fleet():
    s = SbeStorm(1)
    feed(s, [100.0] * 10 + [10.0] * 10)
    s.restart(ONE)
    assert feed(s, [10.0], t0=600_000.0 + 1200)[0] == pytest.approx((600.0, 1.0))
    s.ensure(3)
    r, q, _ = s.update(np.array([0, 2]), 600_000.0 + 1320, np.array([0.0, 5.0]), np.array([60.0, 60.0]))
    assert r[1] == pytest.approx(300.0) and q[1] == 1.0 and s.nbytes == 3 * (10 * 3 + 12 * 4) * 8


def test_the_pipeline_reads_a_falling_storm_on_its_gpu_and_not_on_its_neighbour():
    fleet = Fleet(nodes=1, gpus=2, ports=0, samples=6 * 90, interval_s=10.0, seed=3)
    g = gpu_frame(fleet)
    k = ((g["ts"] - fleet.t0) // 10).to_numpy()
    minute = k // 6
    per_sample = np.where(minute < 20, 20.0, 20.0 * np.exp(-(minute - 20) / 15.0))  # a storm that tails off
    for gpu, rate in ((0, per_sample), (1, np.zeros(len(g)))):
        rows = (g["gpu"] == gpu).to_numpy()
        g.loc[rows, "ecc_sbe_vol"] = np.cumsum(rate[rows])
    g["ecc_sbe_agg"] = g["ecc_sbe_vol"]
    pipe = FeaturePipeline(PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=600))
    pipe.ingest_frames(g, None, None)
    ratio = {gpu: [] for gpu in (0, 1)}
    for b in pipe.flush():
        for gpu in (0, 1):
            ratio[gpu].append(float(b.column("ecc_sbe_10m_of_peak")[b.gpu == gpu][0]))
    assert min(ratio[0][:15]) == pytest.approx(1.0)                # rising, then at its peak
    assert ratio[0][60] < 0.3                                      # 40 minutes into its tail
    assert ratio[1][5:] == pytest.approx([1.0] * len(ratio[1][5:]))  # a quiet neighbour: nothing to fall from


def growth(storm: SbeStorm, per_min: list[float], t0: float = 600_000.0) -> list[float]:
    """Growth after each minute of *per_min* errors per minute (one window a minute)."""
    out = []
    for m, e in enumerate(per_min):
        _, _, g = storm.update(ONE, t0 + (m + 1) * 60.0, np.array([e]), np.array([60.0]))
        out.append(float(g[0]))
    return out


def test_a_steady_storm_reads_one_a_growing_one_more_and_a_quiet_hour_is_floored():
    steady = growth(SbeStorm(1), [2.0] * 150)                     # 120 an hour for 2.5 hours
    # the hour before is whole 10-minute buckets ended 10-20 min ago: three of them (30 min) after 40 minutes
    assert all(np.isnan(g) for g in steady[:40]) and steady[40] == pytest.approx(1.0)
    assert steady[-1] == pytest.approx(1.0)
    # a failing part's errors: 3 an hour growing 200-fold over 6 hours, the slowest the field ranges give
    per_min = [3.0 / 60 * 200 ** (m / 360) for m in range(360)]
    rising = growth(SbeStorm(1), per_min)
    assert min(rising[120:]) > 1.5                                # about 1.8 all the way
    fresh = growth(SbeStorm(1), [0.0] * 90 + [0.5] * 10)          # 30 an hour after a quiet hour and more
    assert fresh[-1] == pytest.approx(30.0)                       # over the floor of 1 an hour: rising
    stop = growth(SbeStorm(1), [2.0] * 90 + [0.0] * 10)
    assert stop[-1] == 0.0                                        # stopped: 0, whatever came before


def test_growth_compares_with_the_hour_that_ended_ten_to_twenty_minutes_ago_whatever_the_tick():
    per_min = [1.0] * 80 + [4.0] * 10                             # 60 an hour, then 240 for 10 minutes
    by_minute = growth(SbeStorm(1), per_min)
    assert by_minute[-1] == pytest.approx(4.0)                    # the hour before holds none of the new minutes
    s = SbeStorm(1)
    for m, e in enumerate(per_min):                                # two 30 s windows a minute
        for j in (1, 2):
            _, _, g = s.update(ONE, 600_000.0 + m * 60.0 + j * 30.0, np.array([e / 2]), np.array([30.0]))
    assert float(g[0]) == pytest.approx(4.0)
    s.restart(ONE)                                                 # a repaired GPU has no hour before
    assert np.isnan(growth(s, [4.0], t0=600_000.0 + 90 * 60.0)[0])
