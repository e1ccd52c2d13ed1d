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
import ctypes
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector.sources.nvml import NvmlSource  # noqa: E402


class PerFunctionNvmlSource(NvmlSource):
    """Every column through its own NVML function: the source before batching, for comparison."""

    fields = ()

#: nvidia-smi --query-gpu fields taken beside the source's rows (the schema's columns and a few labels)
SMI_QUERY = ("timestamp,index,uuid,pci.bus_id,name,driver_version,utilization.gpu,utilization.memory,"
             "memory.total,memory.reserved,memory.used,memory.free,temperature.gpu,temperature.memory,"
             "power.draw,power.limit,clocks.current.sm,clocks.current.memory,clocks_event_reasons.active,"
             "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,"
             "ecc.errors.corrected.aggregate.total,ecc.errors.uncorrected.aggregate.total,"
             "retired_pages.single_bit_ecc.count,retired_pages.double_bit.count,retired_pages.pending,"
             "remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure")

PATTERN = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for cycle in range(int(sys.argv[1])):
    end = time.time() + 25  # a training phase: full, or every other one at about half duty
    while time.time() < end:
        for _ in range(10):
            c = a @ b
        torch.cuda.synchronize()
        if cycle % 2:
            time.sleep(0.05)
    time.sleep(5)  # data loading / checkpoint: the GPU idles
print("pattern done", flush=True)
"""

LOAD = """
import sys, time, torch
end = time.time() + float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
hold = torch.empty(int(float(sys.argv[2]) * 2**30), dtype=torch.uint8, device="cuda")
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
print("load done", flush=True)
"""


# --------------------------------------------------------------------------- the recording proxy

def _ser(v: Any, handles: dict[int, int]) -> Any:
    """An NVML answer as JSON: structures and unions by field, byte strings as text, handles by index."""
    if not isinstance(v, int) and id(v) in handles:
        return {"handle": handles[id(v)]}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, bytes):
        return {"bytes": v.decode(errors="replace")}
    if isinstance(v, (list, tuple)):
        return {"list" if isinstance(v, list) else "tuple": [_ser(x, handles) for x in v]}
    if isinstance(v, ctypes.Array):
        return {"list": [_ser(x, handles) for x in v]}
    if isinstance(v, (ctypes.Structure, ctypes.Union)):
        return {"struct": {name: _ser(getattr(v, name), handles) for name, *_ in v._fields_}}
    if isinstance(v, ctypes._SimpleCData):  # noqa: SLF001 - a bare ctypes scalar
        return v.value
    return {"repr": repr(v)}


class RecordingNvml:
    """Wraps ``pynvml``: every ``nvml*`` call is passed through, timed, and written to a tape."""

    def __init__(self, nvml: Any) -> None:
        self._m = nvml
        self.handles: dict[int, int] = {}
        self._keep: list[Any] = []  # handles stay alive so their ids stay theirs
        self.tape: dict[str, list[list[Any]]] = defaultdict(list)
        self.time_s: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._m, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr
        return self._wrap(name, attr)

    def _key(self, name: str, args: tuple, kwargs: dict) -> str:
        norm = [f"h{self.handles[id(a)]}" if not isinstance(a, int) and id(a) in self.handles else a
                for a in args]
        norm += [f"{k}={v}" for k, v in sorted(kwargs.items())]
        return json.dumps([name, *norm], default=repr)

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            key = self._key(name, args, kwargs)
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            except self._m.NVMLError as e:
                self.time_s[name] += time.perf_counter() - t0
                self.calls[name] += 1
                self._record(key, {"err": getattr(e, "value", None)})
                raise
            self.time_s[name] += time.perf_counter() - t0
            self.calls[name] += 1
            if name == "nvmlDeviceGetHandleByIndex" and not isinstance(out, int):
                self.handles[id(out)] = int(args[0])
                self._keep.append(out)
            self._record(key, {"ok": _ser(out, self.handles)})
            return out
        return call

    def _record(self, key: str, outcome: dict) -> None:
        runs = self.tape[key]
        if runs and runs[-1][0] == outcome:
            runs[-1][1] += 1
        else:
            runs.append([outcome, 1])


# --------------------------------------------------------------------------- steps

class Run:
    def __init__(self, out: Path, fake: bool) -> None:
        self.out, self.fake = out, fake
        out.mkdir(parents=True, exist_ok=True)
        self.log = (out / "log.txt").open("a")

    def say(self, msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        self.say(f"step {name}: start")
        try:
            res = fn()
        except Exception:  # noqa: BLE001 - one step's failure must not cost the others
            self.say(f"step {name}: FAILED\n{traceback.format_exc()}")
            return None
        self.say(f"step {name}: done in {time.perf_counter() - t0:.1f} s")
        return res

    def nvml_module(self) -> Any:
        if self.fake:
            sys.path.insert(0, str(ROOT / "tests" / "collector"))
            from fake_nvml import FakeGpu, FakeNvml
            return FakeNvml([FakeGpu()])
        import pynvml
        return pynvml

    def smi(self, *args: str, timeout: float = 30) -> str:
        if self.fake:
            return ""
        p = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout)
        return p.stdout + (f"\n[stderr] {p.stderr}" if p.stderr.strip() else "")


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


class AgentRun:
    """``gpuops agent --sink stdout`` on this node: ``--once``, then a 1 s run in the background."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.cli = [sys.executable, "-c", "from api.cli import main; main()", "agent", "--sink", "stdout",
                    "--node", "h200-device", "--health-file", ""]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.txt = (run.out / "agent.txt").open("a")
        self.proc: subprocess.Popen | None = None

    def once(self, sources: str) -> None:
        p = subprocess.run([*self.cli, "--once", "--sources", sources], capture_output=True, text=True,
                           timeout=120, cwd=ROOT, env=self.env)
        self.txt.write(f"## --once --sources {sources}: rc={p.returncode}\n{p.stdout[-5000:]}\n"
                       f"[stderr]\n{p.stderr[-3000:]}\n")
        self.txt.flush()
        self.run.say(f"agent --once --sources {sources}: rc={p.returncode}, {len(p.stdout.splitlines())} lines")

    def start(self, sources: str = "nvml") -> None:
        self.rows = (self.run.out / "agent_rows.jsonl").open("w")
        self.proc = subprocess.Popen([*self.cli, "--sources", sources, "--interval", "1"], stdout=self.rows,
                                     stderr=subprocess.PIPE, text=True, cwd=ROOT, env=self.env)
        time.sleep(10)  # past the imports and NVML start-up: what follows is the steady state
        self.t0, self.cpu0 = time.perf_counter(), _proc_cpu_s(self.proc.pid)

    def stop(self) -> None:
        assert self.proc is not None
        wall, cpu = time.perf_counter() - self.t0, _proc_cpu_s(self.proc.pid) - self.cpu0
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        self.rows.close()
        n = sum(1 for _ in (self.run.out / "agent_rows.jsonl").open())
        self.txt.write(f"## --interval 1, stopped by SIGTERM: rc={self.proc.returncode}, "
                       f"{n} records; steady state {wall:.1f} s wall, {cpu:.3f} s CPU (user+sys, all threads) "
                       f"= {cpu / wall * 100:.2f} % of one core\n[stderr]\n{err[-3000:]}\n")
        self.txt.flush()
        self.run.say(f"agent 1 s run: rc={self.proc.returncode} records={n} steady {wall:.1f}s wall "
                     f"{cpu:.3f}s cpu = {cpu / wall * 100:.2f}% of a core")


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pattern(run: Run, cycles: int) -> None:
    """A training-like on/off load (25 s compute, 5 s idle; every other phase at about half duty)."""
    p = subprocess.run([sys.executable, "-c", PATTERN, str(cycles)], capture_output=True, text=True,
                       timeout=cycles * 40 + 60)
    run.say(f"pattern rc={p.returncode}: {(p.stdout + p.stderr).strip()[-500:]}")
    time.sleep(20)


def reset_safety(run: Run) -> None:
    """Would the agent reset a GPU a job is using? Real NVML process list, recorded (not run) reset."""
    import uuid

    from collector.command_handler import CommandHandler
    from collector.commands import Command, sign
    from collector.gpu_reset import NvmlGpuOps

    m = run.nvml_module()
    m.nvmlInit()
    would_run: list[list[str]] = []

    def recorder(argv: list[str], **_: Any) -> subprocess.CompletedProcess:
        would_run.append(list(argv))  # never runs nvidia-smi --gpu-reset
        return subprocess.CompletedProcess(argv, 0, "recorded, not run", "")

    key = b"k" * 32
    ops = NvmlGpuOps(m, run=recorder)
    results: list[Any] = []
    handler = CommandHandler("h200-device", key, ops, time, results.append)

    def command() -> bytes:
        now = time.time()
        return sign(Command(id=f"act-{uuid.uuid4().hex[:8]}", verb="gpu_reset", node="h200-device", gpu=0,
                            issued_at=now, expires_at=now + 300, nonce=uuid.uuid4().hex,
                            reason="device check: is the GPU idle?"), key)

    out: dict[str, Any] = {"idle_pids": ops.compute_processes(0)}
    r = handler.handle(command())
    out["idle_answer"] = [r.status.value, r.detail] if r else None
    out["idle_would_run"] = list(would_run)
    would_run.clear()
    load = subprocess.Popen([sys.executable, "-c", LOAD, "25", "8"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    h = m.nvmlDeviceGetHandleByIndex(0)
    deadline = time.time() + 90
    while time.time() < deadline and m.nvmlDeviceGetMemoryInfo(h).used < 6 * 2**30:
        time.sleep(0.5)
    out["load_pid"] = load.pid
    out["busy_pids"] = ops.compute_processes(0)
    out["busy_smi_compute_apps"] = run.smi("--query-compute-apps=pid,process_name,used_memory", "--format=csv")
    r = handler.handle(command())
    out["busy_answer"] = [r.status.value, r.detail] if r else None
    out["busy_would_run"] = list(would_run)
    load.communicate(timeout=120)
    out["after_pids"] = ops.compute_processes(0)
    (run.out / "reset_safety.json").write_text(json.dumps(out, indent=1))
    run.say(f"reset safety: {json.dumps(out)}")


BAD_POINTER = """
import cupy as cp
k = cp.RawKernel(r'''extern "C" __global__ void bad(int* p) { p[threadIdx.x * 1024] = 1; }''', "bad")
try:
    k((1,), (32,), (cp.uint64(0x10),))
    cp.cuda.runtime.deviceSynchronize()
    print("no fault")
except Exception as e:
    print("fault:", type(e).__name__, e)
"""

CHECK = """
import torch
a = torch.randn(4096, 4096, device="cuda")
print("matmul after the fault:", float((a @ a).abs().sum()) > 0)
"""


def xid(run: Run) -> None:
    """An application XID on the real GPU, through the agent's kernel-log source (nothing reset)."""
    agent = AgentRun(run)
    agent.rows = (run.out / "agent_rows.jsonl").open("w")
    agent.proc = subprocess.Popen([*agent.cli, "--sources", "kmsg,nvml", "--interval", "1"], stdout=agent.rows,
                                  stderr=subprocess.PIPE, text=True, cwd=ROOT, env=agent.env)
    time.sleep(8)
    fault = subprocess.run([sys.executable, "-c", BAD_POINTER], capture_output=True, text=True, timeout=120)
    time.sleep(6)
    agent.proc.send_signal(signal.SIGTERM)
    _, err = agent.proc.communicate(timeout=60)
    agent.rows.close()
    events = [json.loads(line) for line in (run.out / "agent_rows.jsonl").open() if '"type":"event"' in line
              or '"type": "event"' in line]
    dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30)
    nvrm = [line for line in dmesg.stdout.splitlines() if "NVRM" in line or "Xid" in line]
    check = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    out = {"fault_process": (fault.stdout + fault.stderr)[-2000:], "agent_events": events,
           "agent_stderr": err[-3000:], "dmesg_rc": dmesg.returncode, "dmesg_nvrm_lines": nvrm[-50:],
           "dmesg_stderr": dmesg.stderr[-500:], "after": (check.stdout + check.stderr)[-1000:],
           "smi_after": run.smi("--query-gpu=index,pci.bus_id,clocks_event_reasons.active",
                                "--format=csv")}
    (run.out / "xid.json").write_text(json.dumps(out, indent=1))
    run.say(f"xid: {json.dumps(out)[:3000]}")


#: field ids worth knowing about for later columns: (name, NVML constant)
PROBE_FIELDS = ("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST",
                "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
                "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN", "NVML_FI_DEV_PERF_POLICY_THERMAL",
                "NVML_FI_DEV_PERF_POLICY_POWER", "NVML_FI_DEV_POWER_AVERAGE", "NVML_FI_DEV_POWER_INSTANT",
                "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                "NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER", "NVML_FI_DEV_MEMORY_TEMP")


def fields(run: Run) -> None:
    """Which field ids the driver serves, idle and at the end of a 20 s load."""
    from collector.sources.nvml import _value_of

    m = run.nvml_module()
    m.nvmlInit()
    h = m.nvmlDeviceGetHandleByIndex(0)
    names = [n for n in PROBE_FIELDS if hasattr(m, n)]

    def read() -> dict[str, Any]:
        vals = m.nvmlDeviceGetFieldValues(h, [getattr(m, n) for n in names])
        return {n: (float(_value_of(v)) if v.nvmlReturn == m.NVML_SUCCESS else f"error {v.nvmlReturn}")
                for n, v in zip(names, vals)}

    out: dict[str, Any] = {"idle": read(), "t_idle": time.time()}
    load = subprocess.Popen([sys.executable, "-c", LOAD, "20", "4"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    time.sleep(17)
    out["loaded"], out["t_loaded"] = read(), time.time()
    out["throttle_loaded"] = int(m.nvmlDeviceGetCurrentClocksEventReasons(h))
    load.communicate(timeout=120)
    (run.out / "fields.json").write_text(json.dumps(out, indent=1))
    run.say(f"fields: {json.dumps(out)}")


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
