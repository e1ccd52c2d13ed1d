"""Run ``gpuops serve`` as a subprocess from a test: write its config, start it, read its URL and token.

The process runs this worktree's code (``python -m api.cli serve``, from the repository
root); until the API and scoring work lands it runs the test stand-ins instead
(tests/api/serve_standins.py). Its output goes to a log file the test prints on failure.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]


def real_parts() -> bool:
    try:
        import api.app  # noqa: F401
        import api.scoring  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


@dataclass
class ServeProcess:
    """One running ``serve``: its process, log, URL and admin token (when it printed one)."""

    proc: subprocess.Popen
    log: Path
    url: str = ""
    token: str = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def terminate(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


def start_serve(config: dict[str, Any], workdir: Path, name: str, env: dict[str, str] | None = None,
                timeout_s: float = 90.0) -> ServeProcess:
    """Write *config* and start ``serve`` on it; returns once it printed its URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    log = workdir / f"{name}.log"
    cmd = ([sys.executable, "-m", "api.cli", "serve", "--config", str(cfg_path)] if real_parts() else
           [sys.executable, "-m", "tests.api.serve_standins", "--config", str(cfg_path)])
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    sp = ServeProcess(proc, log)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"serve {name} exited with {proc.returncode}:\n{sp.output()[-4000:]}")
        m = re.search(r"serving on (http://\S+)", sp.output())
        if m:
            sp.url = m.group(1)
            t = re.search(r"admin token: (\S+)", sp.output())
            sp.token = t.group(1) if t else ""
        return bool(m)

    wait_until(up, timeout_s=timeout_s, interval_s=0.2, message=f"serve {name} printed its URL")
    return sp
