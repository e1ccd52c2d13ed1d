"""Up-front checks that an optional extra is installed, before a command starts its work.

A command that needs a package the base install lacks (the node agent's install: no pandas,
scikit-learn, numba, matplotlib) says so at once, with the pip command that fixes it, instead of
failing after minutes of work.
"""

from __future__ import annotations

import importlib.util

#: Which extra brings each optional top-level module.
EXTRA_OF = {"matplotlib": "report", "pandas": "service", "sklearn": "service", "numba": "service",
            "scipy": "service", "fastapi": "service", "uvicorn": "service", "sqlalchemy": "service"}


class MissingExtra(RuntimeError):
    """A package of an optional extra is not installed; the message names the pip command."""


def missing(*modules: str) -> list[str]:
    """The *modules* that cannot be imported here (looked up, not imported)."""
    out = []
    for m in modules:
        try:
            found = importlib.util.find_spec(m) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(m)
    return out


def require(purpose: str, *modules: str) -> None:
    """Raise :class:`MissingExtra` if any of *modules* is absent, saying what *purpose* needs."""
    absent = missing(*modules)
    if absent:
        extras = sorted({EXTRA_OF.get(m, "service") for m in absent})
        raise MissingExtra(f"{purpose} needs {', '.join(absent)}, which is not installed: "
                           f"pip install 'gpuops[{','.join(extras)}]'")
