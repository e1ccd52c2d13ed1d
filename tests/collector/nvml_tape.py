"""Replays a real GPU's NVML answers (a tape from ``bench/bench_nvml_device.py``) as a ``pynvml``.

The tape holds, per call (function and arguments, handles by GPU index), NVML's answers in
order, run-length coded. :class:`TapeNvml` answers each call with the next recorded answer:
structures come back as attribute namespaces, byte strings as bytes, NVML errors as
``pynvml.NVMLError`` with the recorded code. A call the tape never saw fails the test with a
message, rather than getting an invented answer.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml


class Handle:
    """A GPU handle, as ``nvmlDeviceGetHandleByIndex`` returned it on the recorded node."""

    def __init__(self, index: int) -> None:
        self.index = index


class TapeNvml:
    """Stands in for the ``pynvml`` module, answering from a recorded tape."""

    def __init__(self, path: Path) -> None:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            tape = json.load(f)
        self.ticks = int(tape["ticks"])
        self._runs: dict[str, list[list[Any]]] = {k: [list(r) for r in v] for k, v in tape["calls"].items()}
        self._at: dict[str, int] = {k: 0 for k in self._runs}  # answers given per call
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlMemory_v")):
                setattr(self, name, getattr(pynvml, name))

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvml"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._answer(name, args, kwargs)

    def unanswered(self) -> dict[str, int]:
        """Per call, recorded answers nobody asked for (> 0) or calls made past the recording (< 0);
        empty when the replay asked exactly what the recorded GPU was asked."""
        left = {k: sum(n for _, n in runs) - self._at[k] for k, runs in self._runs.items()}
        return {k: n for k, n in left.items() if n != 0}

    def _answer(self, name: str, args: tuple, kwargs: dict) -> Any:
        norm = [f"h{a.index}" if isinstance(a, Handle) else a for a in args]
        norm += [f"{k}={v}" for k, v in sorted(kwargs.items())]
        key = json.dumps([name, *norm], default=repr)
        if key not in self._runs:
            raise AssertionError(f"the tape has no answer for {key}: NvmlSource now asks what the "
                                 "recorded GPU was never asked; re-record with bench/bench_nvml_device.py")
        k, total = self._at[key], 0
        self._at[key] = k + 1
        for outcome, n in self._runs[key]:
            total += n
            if k < total:
                break  # past the end, the last answer repeats
        if "err" in outcome:
            raise pynvml.NVMLError(outcome["err"])
        return _value(outcome["ok"])


def _value(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    if "handle" in v:
        return Handle(v["handle"])
    if "bytes" in v:
        return v["bytes"].encode()
    if "list" in v:
        return [_value(x) for x in v["list"]]
    if "tuple" in v:
        return tuple(_value(x) for x in v["tuple"])
    if "struct" in v:
        return SimpleNamespace(**{k: _value(x) for k, x in v["struct"].items()})
    return v["repr"]
