"""The real GPU operations behind a ``gpu_reset`` command: NVML for processes, nvidia-smi for the reset.

NVML (and so pynvml) has no reset call; ``nvidia-smi --gpu-reset -i N`` is NVIDIA's
supported way, and it refuses by itself when anything still holds the GPU. ``N`` is
the NVML index, which is also the index nvidia-smi uses (both order by PCI bus id).
The NVML module and the command runner are injected, so tests use the fake NVML at our
boundary (``tests/collector/fake_nvml.py``) and never touch a GPU.

A reset needs root (or CAP_SYS_ADMIN) and no process on the GPU, including
persistence-mode clients such as nvidia-persistenced on some drivers, and on NVLink
systems without NVSwitch the peers may have to be reset together; nvidia-smi's refusal
is passed on word for word in the result's detail.
"""

from __future__ import annotations

import logging
import subprocess
from typing import Any, Callable, Sequence

from collector.call_thread import CallThread

log = logging.getLogger(__name__)

#: Seconds one reset may take. A reset finishes in a few seconds; 120 s covers a slow
#: driver teardown on an 8-GPU node, and the command's expiry is longer still.
RESET_TIMEOUT_S = 120.0

#: Seconds one NVML call of a command (count the GPUs, list a GPU's processes) may take. They
#: answer in milliseconds; a GPU off the bus can hold the driver for minutes, and a command loop
#: stuck in NVML would answer no command after it.
NVML_TIMEOUT_S = 10.0


class GpuOpsError(RuntimeError):
    """A GPU operation failed; the message says which and why (NVML error, nvidia-smi output)."""


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def reset_gpu(index: int, *, nvidia_smi: str = "nvidia-smi", timeout_s: float = RESET_TIMEOUT_S,
              run: Runner = subprocess.run) -> None:
    """Reset GPU *index* with ``nvidia-smi --gpu-reset -i <index>``; :class:`GpuOpsError` if it did not.

    The argument list is fixed (no shell); *index* must be an ``int``.
    """
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise GpuOpsError(f"GPU index must be a non-negative int, got {index!r}")
    argv = [nvidia_smi, "--gpu-reset", "-i", str(index)]
    try:
        done = run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise GpuOpsError(f"`{' '.join(argv)}` did not finish within {timeout_s:g} s") from None
    except OSError as e:  # not installed, not executable
        raise GpuOpsError(f"cannot run `{' '.join(argv)}`: {e}") from None
    if done.returncode != 0:
        said = " ".join(((done.stdout or "") + " " + (done.stderr or "")).split())[:300]
        raise GpuOpsError(f"`{' '.join(argv)}` exited {done.returncode}: {said or 'no output'}")


class NvmlGpuOps:
    """:class:`~collector.command_handler.GpuOps` on a real node: NVML processes, nvidia-smi reset.

    *nvml* is the ``pynvml`` module (or the tests' fake), already initialised by the NVML
    source or initialised here; *run* runs nvidia-smi (``subprocess.run``). Each NVML call
    runs in one thread of its own (:class:`~collector.call_thread.CallThread`) and is waited
    for at most *nvml_timeout_s*: one that does not answer fails its command with
    :class:`GpuOpsError`, and until it returns every later call fails at once, so the
    command loop goes on answering.
    """

    def __init__(self, nvml: Any = None, *, nvidia_smi: str = "nvidia-smi", timeout_s: float = RESET_TIMEOUT_S,
                 run: Runner = subprocess.run, nvml_timeout_s: float = NVML_TIMEOUT_S) -> None:
        self.nvidia_smi, self.timeout_s, self._run = nvidia_smi, timeout_s, run
        self.nvml_timeout_s = nvml_timeout_s
        self._calls = CallThread("gpuops-commands-nvml")
        if nvml is None:
            from collector.sources.nvml import _import_pynvml  # the same import and message as the source

            nvml = _import_pynvml()
            try:
                started, _ = self._calls.call(nvml.nvmlInit, nvml_timeout_s)
            except nvml.NVMLError as e:
                raise GpuOpsError(f"NVML cannot start ({e}): GPU reset commands need the NVIDIA driver") from None
            if not started:  # the agent still starts: its telemetry matters more than its resets
                log.warning("NVML has not started within %g s (a GPU off the bus can hold the driver); GPU reset "
                            "commands fail as gpu_check_failed until it answers", nvml_timeout_s)
        self._nvml = nvml

    def _bounded(self, what: str, fn: Callable[[], Any]) -> Any:
        """*fn*'s value, or :class:`GpuOpsError` when NVML does not answer in ``nvml_timeout_s``."""
        if self._calls.busy and not self._calls.returned:
            raise GpuOpsError(f"cannot {what}: NVML has not answered an earlier call for "
                              f"{self._calls.running_s():.0f} s (a GPU off the bus can hold the driver)")
        done, value = self._calls.call(fn, self.nvml_timeout_s)
        if not done:
            raise GpuOpsError(f"cannot {what}: NVML did not answer within {self.nvml_timeout_s:g} s "
                              "(a GPU off the bus can hold the driver)")
        return value

    def gpu_count(self) -> int:
        """GPUs NVML sees on this node."""
        try:
            return int(self._bounded("count GPUs", self._nvml.nvmlDeviceGetCount))
        except self._nvml.NVMLError as e:
            raise GpuOpsError(f"NVML cannot count GPUs: {e}") from None

    def compute_processes(self, gpu: int) -> list[int]:
        """PIDs of the compute processes on GPU *gpu* (``nvmlDeviceGetComputeRunningProcesses``)."""
        m = self._nvml
        try:
            procs: Sequence[Any] = self._bounded(
                f"list the processes on GPU {gpu}",
                lambda: m.nvmlDeviceGetComputeRunningProcesses(m.nvmlDeviceGetHandleByIndex(gpu)))
        except m.NVMLError as e:
            raise GpuOpsError(f"NVML cannot list the processes on GPU {gpu}: {e}") from None
        return sorted(int(p.pid) for p in procs)

    def reset(self, gpu: int) -> None:
        """Reset GPU *gpu* (:func:`reset_gpu`)."""
        reset_gpu(gpu, nvidia_smi=self.nvidia_smi, timeout_s=self.timeout_s, run=self._run)
