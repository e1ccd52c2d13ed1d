"""Packaging: every import declared, every declared dependency used, and the node agent's install small.

``pip install gpuops[agent]`` (the base install) must run the agent without pandas, scikit-learn
or numba (issue 11): a static walk of the agent's module-level imports, and a real agent run in a
subprocess whose import system refuses the service's packages.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("collector", "pipeline", "models", "remediation", "api")
#: What the agent must never load (the service's heavy packages).
SERVICE_ONLY = ("sklearn", "numba", "pandas", "scipy", "joblib", "threadpoolctl", "fastapi", "uvicorn",
                "sqlalchemy", "alembic", "psycopg", "apscheduler", "kubernetes", "prometheus_client", "matplotlib")
#: Declared dependencies that no module imports by name, and why they are declared anyway.
USED_INDIRECTLY = {
    "crc32c": "kafka-python checks record CRCs with it when it is installed (collector/sinks/kafka.py)",
    "lz4": "the Kafka producer's compression_type='lz4' (collector/sinks/kafka.py)",
}
#: The agent's entry points: the CLI, the agent command, and the sources it can be given.
AGENT_ROOTS = ("api.cli", "api.commands.agent", "collector.sources.nvml", "collector.sources.infiniband",
               "collector.sources.kmsg", "collector.sources.dcgm", "collector.sinks.kafka", "collector.sinks.stdout")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _dist(req: str) -> str:
    return re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0].lower().replace("_", "-")


def _declared(*groups: str) -> set[str]:
    proj = _pyproject()["project"]
    out = {_dist(r) for r in proj["dependencies"]} if "base" in groups else set()
    for g in groups:
        out |= {_dist(r) for r in proj["optional-dependencies"].get(g, [])}
    return out


def _module_path(mod: str) -> Path | None:
    base = ROOT / Path(*mod.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _imports(path: Path, module_level_only: bool) -> set[str]:
    """Absolute module names *path* imports (relative ones resolved); module level only if asked."""
    tree = ast.parse(path.read_text(), str(path))
    pkg = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name == "__init__.py":
        pkg = pkg.rsplit(".", 1)[0] + ".__init__"
    out: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.rsplit(".", node.level)[0]
                    name = f"{base}.{node.module}" if node.module else base
                else:
                    name = node.module or ""
                out.add(name)
                out.update(f"{name}.{a.name}" for a in node.names if _module_path(f"{name}.{a.name}"))
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and module_level_only:
                continue
            elif hasattr(node, "body"):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit([n for n in getattr(node, field, []) if isinstance(n, ast.AST)])

    visit(tree.body)
    return out


def _third_party_dists(tops: set[str]) -> dict[str, str]:
    dists = importlib.metadata.packages_distributions()
    stdlib = sys.stdlib_module_names
    out = {}
    for top in tops:
        if top in stdlib or top in FIRST_PARTY or top == "__future__":
            continue
        names = dists.get(top)
        assert names, f"{top} is imported but no installed distribution provides it"
        out[top] = names[0].lower().replace("_", "-")
    return out


def _all_code_imports() -> set[str]:
    tops: set[str] = set()
    for pkg in FIRST_PARTY:
        for path in (ROOT / pkg).rglob("*.py"):
            tops |= {m.split(".")[0] for m in _imports(path, module_level_only=False)}
    return tops


def test_every_import_of_the_package_is_a_declared_dependency() -> None:
    declared = _declared("base", "service", "report", "test")
    missing = {top: d for top, d in _third_party_dists(_all_code_imports()).items() if d not in declared}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_every_declared_runtime_dependency_is_imported_or_says_why_not() -> None:
    used = set(_third_party_dists(_all_code_imports()).values())
    unused = _declared("base", "service", "report") - used - set(USED_INDIRECTLY)
    assert not unused, f"declared but never imported: {sorted(unused)}"


def test_agent_extra_is_the_base_install_without_the_service_packages() -> None:
    proj = _pyproject()["project"]
    assert proj["optional-dependencies"]["agent"] == []
    base = _declared("base")
    for heavy in ("scikit-learn", "numba", "pandas", "scipy", "fastapi", "sqlalchemy"):
        assert heavy not in base and heavy in _declared("service"), heavy


def test_agent_module_level_import_closure_needs_only_the_base_install() -> None:
    seen: set[str] = set()
    todo = list(AGENT_ROOTS)
    third: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        path = _module_path(mod)
        assert path is not None, f"{mod}: no such module in this tree"
        parts = mod.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts)) if _module_path(".".join(parts[:i]))]
        for name in _imports(path, module_level_only=True):
            top = name.split(".")[0]
            if top in FIRST_PARTY:
                if _module_path(name):
                    todo.append(name)
            else:
                third.add(top)
    dists = _third_party_dists(third)
    outside = {t: d for t, d in dists.items() if d not in _declared("base")}
    assert not outside, f"the agent's modules import what gpuops[agent] does not install: {outside}"


BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not installed with gpuops[agent]")
sys.meta_path.insert(0, Refuse())
sys.argv = ["gpuops", *sys.argv[2:]]
from api.cli import main
main()
"""


def test_agent_runs_with_the_service_packages_absent(shared_fixtures: Path) -> None:
    h100 = shared_fixtures / "infiniband" / "sysfs" / "gpud_h100_node" / "sys"
    out = subprocess.run(
        [sys.executable, "-c", BLOCKER, ",".join(SERVICE_ONLY), "agent", "--once", "--sink", "stdout",
         "--sources", "infiniband,kmsg,dcgm", "--sysfs-root", str(h100),
         "--kmsg-file", str(shared_fixtures / "xid/gpud/dmesg.0.log"),
         "--dcgm-url", str(shared_fixtures / "dcgm_exporter/scrapes/datadog_dcgm_fixture_metrics.txt"),
         "--node", "h100-a"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(out.stdout.splitlines()) == 21   # 1 gpu + 9 net + 11 event records (test_agent_cli.py)


def test_blocker_really_refuses_a_service_package() -> None:
    out = subprocess.run([sys.executable, "-c", BLOCKER, "pandas", "replay", "--help"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    code = "import pandas"
    probe = subprocess.run([sys.executable, "-c", BLOCKER.replace("from api.cli import main\nmain()", code),
                            "pandas"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert probe.returncode != 0 and "not installed with gpuops[agent]" in probe.stderr
    assert out.returncode == 0  # --help imports no heavy package either


@pytest.mark.parametrize("extra", ["service", "report", "test"])
def test_extras_are_listed(extra: str) -> None:
    assert _pyproject()["project"]["optional-dependencies"][extra]


@pytest.mark.filterwarnings("ignore:Support for `\\[tool.setuptools\\]`")
def test_pyproject_is_valid_for_setuptools_and_every_requirement_parses() -> None:
    from packaging.requirements import Requirement
    from setuptools.config.pyprojecttoml import read_configuration

    proj = read_configuration(ROOT / "pyproject.toml")["project"]   # validates against the schema
    for req in proj["dependencies"] + sum(proj["optional-dependencies"].values(), []):
        Requirement(req)


def test_serve_on_the_agent_install_stops_at_once_naming_the_service_extra() -> None:
    out = subprocess.run([sys.executable, "-c", BLOCKER, ",".join(SERVICE_ONLY), "serve"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "gpuops serve needs pandas, sklearn, numba" in out.stderr and "pip install 'gpuops[service]'" in out.stderr
