"""The package layering of DESIGN.md holds: imports run one way, hardware and Kafka stay at the edges."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_of_pyproject_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    cmd = [str(lint)] if lint.exists() else ["lint-imports"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "broken" in res.stdout and ", 0 broken" in res.stdout


def test_nothing_is_built_at_import_time_in_the_cli():
    # importing the CLI must not parse args, open files or build the app
    res = subprocess.run([sys.executable, "-c", "import api.cli, sys; print('cli' in dir(api.cli))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stdout + res.stderr
