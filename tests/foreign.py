"""Rewrite a recording as another tool following spec/recording.md might write it.

Used by tests and bench/: pandas only, other node names, rows shuffled and split over a
directory of Parquet files, some optional columns dropped, NaN for fields the "device"
does not support, JSONL gzip-compressed, no net.parquet if asked.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

DROPPED = ("gpu_uuid", "temp_mem_c", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending")
UNSUPPORTED_ON_HALF = ("fb_used_mib", "fb_free_mib", "power_limit_w")


def rename(node: str) -> str:
    return "dgx-h100-r" + node.rsplit("-", 1)[-1] + ".cluster-a"


def write_foreign(src: Path, dst: Path, *, seed: int = 0, files: int = 3, keep_net: bool = True,
                  degrade: bool = False) -> Path:
    """Copy recording *src* to *dst* in a foreign but valid layout; returns *dst*.

    The layout changes (names, order, files, compression) never change what the data
    says; ``degrade=True`` also drops optional columns and sets fields to NaN as a less
    capable device or exporter would, which does change the data.
    """
    rng = np.random.default_rng(seed)
    shutil.rmtree(dst, ignore_errors=True)
    (dst / "gpu.parquet").mkdir(parents=True)
    man = json.loads((src / "manifest.json").read_text())
    man["nodes"] = [rename(n) for n in man["nodes"]]
    man["source"] = "foreign writer (pandas)"
    man.pop("simulator", None)
    (dst / "manifest.json").write_text(json.dumps(man))
    gpu = pd.read_parquet(src / "gpu.parquet")
    gpu["node"] = gpu["node"].map(rename)
    if degrade:
        gpu = gpu.drop(columns=[c for c in DROPPED if c in gpu.columns])
        half = gpu["gpu"] % 2 == 1
        for c in UNSUPPORTED_ON_HALF:
            gpu.loc[half, c] = np.nan
    gpu["vendor_extra"] = 1.0
    gpu = gpu.sample(frac=1.0, random_state=seed)
    for k, part in enumerate(np.array_split(np.arange(len(gpu)), files)):
        gpu.iloc[part].to_parquet(dst / "gpu.parquet" / f"part-{k:03d}.parquet", index=False)
    if keep_net and (src / "net.parquet").exists():
        net = pd.read_parquet(src / "net.parquet")
        net["node"] = net["node"].map(rename)
        net.sample(frac=1.0, random_state=seed + 1).to_parquet(dst / "net.parquet", index=False)
    for stem in ("events", "incidents"):
        p = src / f"{stem}.jsonl"
        if p.exists():
            rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
            for r in rows:
                r["node"] = rename(r["node"])
            rng.shuffle(rows)
            (dst / f"{stem}.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return dst
