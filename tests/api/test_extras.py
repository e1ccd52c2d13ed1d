"""Commands that need an optional extra say so before their work, not after it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.extras import MissingExtra, missing, require

ROOT = Path(__file__).resolve().parents[2]
WITHOUT_MATPLOTLIB = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("matplotlib is not installed")
sys.meta_path.insert(0, Refuse())
sys.argv = ["gpuops", *sys.argv[1:]]
from api.cli import main
main()
"""


def test_require_names_the_missing_module_and_the_pip_command() -> None:
    with pytest.raises(MissingExtra, match=r"--html needs no_such_module_xyz.*pip install 'gpuops\[service\]'"):
        require("--html", "no_such_module_xyz")
    assert missing("json", "no_such_module_xyz") == ["no_such_module_xyz"]


def test_replay_html_without_matplotlib_fails_before_replaying(tmp_path: Path) -> None:
    recording = tmp_path / "rec"
    recording.mkdir()   # never read: the check comes first
    report = tmp_path / "report.json"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", WITHOUT_MATPLOTLIB, "replay", str(recording), "--report", str(report),
                          "--html", str(tmp_path / "r.html")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert "matplotlib" in out.stderr and "pip install 'gpuops[report]'" in out.stderr
    assert not report.exists()
    assert time.monotonic() - t0 < 60
