"""The NVML source on a real GPU: what each call costs, what it returns, and whether nvidia-smi agrees.

Run on a GPU node (or the device machine) from the repository root:

    python bench/bench_nvml_device.py --out DIR [--load-s 30]

It writes into DIR:

- ``facts.json``   driver, NVML and nvidia-ml-py versions, GPU names, supported event types;
- ``tape.json``    every NVML call ``NvmlSource`` made and what NVML answered (run-length coded),
  replayable through ``tests/collector/nvml_tape.py`` as a fixture of a real GPU;
- ``rows.jsonl``   the GPU rows the source produced, idle and under a matrix-multiply load;
- ``smi.csv``      ``nvidia-smi --query-gpu`` taken right after some of those rows;
- ``timing.json``  wall and CPU time per ``sample()`` and per NVML function, for the batched
  source and for one that reads every column through its own function, and how far apart the
  two read the same columns in the same tick;
- ``agent.txt``    ``gpuops agent`` end to end on this GPU: one ``--once`` run, a 1 s-interval run
  through the load and a training-like on/off pattern to SIGTERM with its steady-state CPU
  time, then the kernel-log source;
- ``agent_rows.jsonl``  what that 1 s agent run printed (one JSON record per line);
- ``smi_q.txt``    ``nvidia-smi -q`` as the driver reports the GPU (``--smi-q``);
- ``reset_safety.json``  the agent's GPU-reset check (``--steps reset``): what
  ``nvmlDeviceGetComputeRunningProcesses`` lists with the GPU idle and with a CUDA process on
  it, and what the command handler answers a signed reset command each time. The reset itself
  goes to a recorder, never to ``nvidia-smi --gpu-reset``: the GPU is not reset;
- ``xid.json``     (``--steps xid``) a real application XID end to end: a CUDA kernel writes
  through a bad pointer (the driver kills that context: an MMU fault, XID 31, RESTART_APP in
  NVIDIA's catalogue; nothing is reset), the agent follows ``/dev/kmsg`` meanwhile, and the
  file holds the kernel's NVRM lines, the agent's events and whether the GPU still computes;
- ``fields.json``  (``--steps fields``) which NVML field ids this driver serves beside the ones the
  source batches: the per-reason clock-event times (the exact time each throttle reason held
  the clocks, whatever the sampling interval), NVLink totals, power averages; idle and under load.

``--fake`` runs the same steps on the test suite's fake NVML (no GPU, no nvidia-smi), so the
script can be checked anywhere before spending GPU time on it. Each step is guarded: a failing
step is written to ``log.txt`` and the next one still runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from nvml_device_checks import fields, reset_safety, xid
from nvml_device_lib import LOAD, PATTERN, AgentRun, PerFunctionNvmlSource, RecordingNvml, Run, _ser

from collector.sources.nvml import NvmlSource  # (nvml_device_lib put this checkout first on sys.path)


SMI_QUERY = ("timestamp,index,uuid,pci.bus_id,name,driver_version,utilization.gpu,utilization.memory,"
             "memory.total,memory.reserved,memory.used,memory.free,temperature.gpu,temperature.memory,"
             "power.draw,power.limit,clocks.current.sm,clocks.current.memory,clocks_event_reasons.active,"
             "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,"
             "ecc.errors.corrected.aggregate.total,ecc.errors.uncorrected.aggregate.total,"
             "retired_pages.single_bit_ecc.count,retired_pages.double_bit.count,retired_pages.pending,"
             "remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure")

def facts(run: Run) -> None:
    m = run.nvml_module()
    m.nvmlInit()
    f: dict[str, Any] = {"python": sys.version, "platform": platform.platform(),
                         "pynvml_file": getattr(m, "__file__", "fake")}
    for name in ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion"):
        try:
            v = getattr(m, name)()
            f[name] = v.decode() if isinstance(v, bytes) else v
        except Exception as e:  # noqa: BLE001
            f[name] = f"error: {e}"
    try:
        from importlib.metadata import version
        f["nvidia-ml-py"] = version("nvidia-ml-py")
    except Exception as e:  # noqa: BLE001
        f["nvidia-ml-py"] = f"error: {e}"
    gpus = []
    for i in range(m.nvmlDeviceGetCount()):
        h = m.nvmlDeviceGetHandleByIndex(i)
        g: dict[str, Any] = {"index": i}
        for key, fn in (("name", "nvmlDeviceGetName"), ("serial", "nvmlDeviceGetSerial"),
                        ("vbios", "nvmlDeviceGetVbiosVersion"), ("arch", "nvmlDeviceGetArchitecture"),
                        ("ecc_mode", "nvmlDeviceGetEccMode"), ("mig_mode", "nvmlDeviceGetMigMode"),
                        ("persistence", "nvmlDeviceGetPersistenceMode"),
                        ("event_types", "nvmlDeviceGetSupportedEventTypes"),
                        ("max_pcie_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
                        ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth")):
            try:
                v = getattr(m, fn)(h)
                g[key] = _ser(v, {})
            except Exception as e:  # noqa: BLE001
                g[key] = f"error: {e}"
        links = {}
        for link in range(getattr(m, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                links[link] = m.nvmlDeviceGetNvLinkState(h, link)
            except Exception as e:  # noqa: BLE001
                links[link] = f"error: {e}"
        g["nvlink_state"] = links
        gpus.append(g)
    f["gpus"] = gpus
    (run.out / "facts.json").write_text(json.dumps(f, indent=1, default=repr))
    run.say(f"facts: {json.dumps({k: v for k, v in f.items() if k != 'gpus'}, default=repr)}")
    run.say(f"gpus: {[(g['index'], g.get('name')) for g in gpus]}")


def sampling(run: Run, load_s: float, load_gib: float) -> None:
    """Rows idle, then under load, through the recording proxy; nvidia-smi beside some of them."""
    rec = RecordingNvml(run.nvml_module())
    src = NvmlSource(node="h200-device", nvml=rec)
    legacy = PerFunctionNvmlSource(node="h200-device", nvml=run.nvml_module())
    diffs: dict[str, float] = defaultdict(float)
    legacy_ms: list[float] = []
    rows_f = (run.out / "rows.jsonl").open("w")
    smi_f = (run.out / "smi.csv").open("w")
    header_done = False
    per_tick = []

    def tick(phase: str, with_smi: bool) -> None:
        nonlocal header_done
        now = time.time()
        w0, c0 = time.perf_counter(), time.process_time()
        rows = src.sample(now).gpu
        per_tick.append({"phase": phase, "wall_ms": (time.perf_counter() - w0) * 1e3,
                         "cpu_ms": (time.process_time() - c0) * 1e3})
        c1 = time.process_time()
        old = legacy.sample(now).gpu
        legacy_ms.append((time.process_time() - c1) * 1e3)
        for r, o in zip(rows, old):
            rows_f.write(json.dumps({"phase": phase, **r}) + "\n")
            for col, v in r.items():
                if isinstance(v, float) or isinstance(o.get(col), float):
                    d = abs((v if v is not None else float("nan")) - (o[col] if o[col] is not None else float("nan")))
                    diffs[col] = max(diffs[col], d) if d == d else (diffs[col] if v is None and o[col] is None else float("inf"))
        if with_smi and not run.fake:
            text = run.smi(f"--query-gpu={SMI_QUERY}", "--format=csv")
            lines = text.strip().splitlines()
            if not header_done and lines:
                smi_f.write("phase,sample_ts," + lines[0] + "\n")
                header_done = True
            for line in lines[1:]:
                smi_f.write(f"{phase},{now:.3f},{line}\n")

    for _ in range(5):
        tick("idle", True)
        time.sleep(1.0)
    load = None
    if not run.fake:
        load = subprocess.Popen([sys.executable, "-c", LOAD, str(load_s), str(load_gib)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t_end = time.time() + load_s + 8
    n = 0
    while time.time() < t_end:
        tick("load", n % 5 == 2)
        n += 1
        time.sleep(1.0)
    if load is not None:
        out, _ = load.communicate(timeout=60)
        run.say(f"load process rc={load.returncode}: {out.strip()[-500:]}")
    for _ in range(5):
        tick("after", True)
        time.sleep(1.0)
    rows_f.close()
    smi_f.close()
    src.close()
    legacy.close()
    tape = {"about": "NVML calls made by collector.sources.nvml.NvmlSource and NVML's answers, in order "
                     "per call; each entry [outcome, times in a row]. Written by bench/bench_nvml_device.py.",
            "ticks": len(per_tick), "calls": dict(rec.tape)}
    calls = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in rec.tape.items())
    head = json.dumps({k: v for k, v in tape.items() if k != "calls"})[:-1]
    (run.out / "tape.json").write_text(f'{head}, "calls": {{\n{calls}\n}}}}\n')
    timing = {"per_tick": per_tick,
              "per_fn": {k: {"calls": rec.calls[k], "total_ms": rec.time_s[k] * 1e3,
                             "us_per_call": rec.time_s[k] / rec.calls[k] * 1e6}
                         for k in sorted(rec.calls, key=lambda k: -rec.time_s[k])},
              "field_errors": dict(src.field_errors), "unsupported": sorted(map(list, src._unsupported)),
              "batched_columns": [c for c, _, _ in src._batched[0]] if src._batched else [],
              "max_abs_diff_batched_vs_per_function_same_tick": dict(diffs),
              "per_function_tick_cpu_ms_median": sorted(legacy_ms)[len(legacy_ms) // 2]}
    for label, cls in (("batched", NvmlSource), ("per_function", PerFunctionNvmlSource)):
        bare = cls(node="h200-device", nvml=run.nvml_module())
        bare.sample(time.time())
        walls, cpus = [], []
        for _ in range(200):
            w0, c0 = time.perf_counter(), time.process_time()
            bare.sample(time.time())
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        bare.close()
        walls.sort()
        cpus.sort()
        timing[f"bare_200_samples_{label}"] = {
            "wall_ms_median": walls[100] * 1e3, "wall_ms_p95": walls[190] * 1e3,
            "cpu_ms_median": cpus[100] * 1e3, "cpu_ms_mean": sum(cpus) / 200 * 1e3}
    (run.out / "timing.json").write_text(json.dumps(timing, indent=1))
    run.say(f"ticks={len(per_tick)} unsupported={timing['unsupported']} field_errors={timing['field_errors']}")
    run.say(f"bare sample batched: {timing['bare_200_samples_batched']}")
    run.say(f"bare sample per function: {timing['bare_200_samples_per_function']}")
    run.say(f"batched columns: {timing['batched_columns']}")
    run.say(f"max |batched - per function|: {timing['max_abs_diff_batched_vs_per_function_same_tick']}")
    top = list(timing["per_fn"].items())[:8]
    run.say("costliest NVML functions: " + "; ".join(f"{k} {v['calls']}x {v['us_per_call']:.0f}us" for k, v in top))


def pattern(run: Run, cycles: int) -> None:
    """A training-like on/off load (25 s compute, 5 s idle; every other phase at about half duty)."""
    p = subprocess.run([sys.executable, "-c", PATTERN, str(cycles)], capture_output=True, text=True,
                       timeout=cycles * 40 + 60)
    run.say(f"pattern rc={p.returncode}: {(p.stdout + p.stderr).strip()[-500:]}")
    time.sleep(20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--load-s", type=float, default=30.0, help="seconds of matrix-multiply load")
    ap.add_argument("--load-gib", type=float, default=40.0, help="GPU memory the load holds")
    ap.add_argument("--cycles", type=int, default=5, help="30 s on/off cycles after the load")
    ap.add_argument("--smi-q", action="store_true", help="also save nvidia-smi -q")
    ap.add_argument("--steps", default="all", help="'all' (default), 'reset' (the reset-safety check), 'xid' (an application XID) "
                    "or 'fields' (which field ids the driver serves)")
    ap.add_argument("--fake", action="store_true", help="use the tests' fake NVML (no GPU needed)")
    a = ap.parse_args()
    run = Run(a.out, a.fake)
    run.step("facts", lambda: facts(run))
    if a.steps == "reset":
        run.step("reset safety", lambda: reset_safety(run))
        return 0
    if a.steps == "xid":
        run.step("xid", lambda: xid(run))
        return 0
    if a.steps == "fields":
        run.step("fields", lambda: fields(run))
        return 0
    if a.smi_q:
        run.step("smi -q", lambda: (a.out / "smi_q.txt").write_text(run.smi("-q")))
    agent = None if a.fake else AgentRun(run)
    if agent:
        run.step("agent once", lambda: agent.once("nvml"))
        run.step("agent start", agent.start)
    run.step("sampling", lambda: sampling(run, 3.0 if a.fake else a.load_s, a.load_gib))
    if agent:
        run.step("pattern", lambda: pattern(run, a.cycles))
        run.step("agent stop", agent.stop)
        run.step("agent kmsg", lambda: agent.once("kmsg"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
