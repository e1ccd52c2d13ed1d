"""What ``bench/bench_nvml_device.py`` and its checks share: the run log, the agent, the NVML tape recorder.

The tape format (``tape.json``) is what ``tests/collector/nvml_tape.py`` replays: per NVML call
(function and arguments, handles by GPU index), NVML's answers in order, run-length coded.
"""

from __future__ import annotations

import ctypes
import json
import os
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
