"""Thin recordings: keep every k-th sample of each GPU and port, events and incidents whole.

    python bench/thin_recording.py RECORDING K [K ...]      # writes RECORDING-everyK beside it

A recording sampled at 5 s thinned by 12 reads as the same fleet at 60 s. Ports are thinned by
the same k, so a world that samples ports at twice the GPU interval ends at twice the thinned GPU
interval. This is how the thinned tuning set of bench/results/robustness.md (tenth session) was
made:

- tune-302, 303, 304 and 312: k = 3 and 12;
- tune-301: k = 6; tune-x3-311: k = 4; tune-power-321: k = 2;
- home 11 and 12: k = 6.

An existing ``-everyK`` directory is kept (delete it to rebuild).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_resample import thinned  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recording", type=Path)
    ap.add_argument("k", type=int, nargs="+", help="keep every k-th sample (k >= 2)")
    a = ap.parse_args()
    if not (a.recording / "manifest.json").is_file():
        ap.error(f"{a.recording}: not a recording (no manifest.json)")
    if any(k < 2 for k in a.k):
        ap.error("k must be 2 or more (1 is the recording itself)")
    for k in a.k:
        print(thinned(a.recording, k), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
