"""deploy/Dockerfile, which cannot be built here (no registry): its inputs exist, its commands are real."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    lines = [ln for ln in DOCKERFILE.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def _gpuops_commands() -> set[str]:
    out = subprocess.run([sys.executable, "-c", "from api.cli import main; main()", "--help"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"^│ ([a-z-]+)\s", out.stdout, re.M))


def test_every_path_the_dockerfile_copies_from_the_context_exists() -> None:
    copies = [args for op, args in _instructions() if op == "COPY" and not args.startswith("--from")]
    assert copies
    for args in copies:
        *sources, _dest = args.split()
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"


def test_packages_copied_are_the_ones_setuptools_packages() -> None:
    copied = {args.split()[0] for op, args in _instructions() if op == "COPY" and not args.startswith("--from")}
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in include} <= copied


def test_entrypoint_and_cmd_are_real_gpuops_commands_and_the_charts_args_too() -> None:
    ops = dict(_instructions())
    assert json.loads(ops["ENTRYPOINT"]) == ["gpuops"]
    commands = _gpuops_commands()
    assert {"serve", "agent"} <= commands, commands
    assert json.loads(ops["CMD"])[0] in commands
    chart_args = set()
    for tpl in (ROOT / "deploy" / "helm" / "gpuops" / "templates").glob("*.*"):
        chart_args |= set(re.findall(r'args: \["([a-z]+)"', tpl.read_text()))
    assert chart_args == {"serve", "agent"} and chart_args <= commands


def test_the_chart_names_this_image() -> None:
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "gpuops" / "values.yaml").read_text())
    assert values["image"]["repository"] in DOCKERFILE.read_text()
