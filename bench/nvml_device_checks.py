"""The device checks of ``bench/bench_nvml_device.py --steps reset|xid|fields`` (see its docstring).

None of them resets the GPU or changes its settings: the reset goes to a recorder, the XID is
an application's own fault (the driver kills that context), the field probe only reads.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Any

from nvml_device_lib import LOAD, ROOT, AgentRun, Run


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
