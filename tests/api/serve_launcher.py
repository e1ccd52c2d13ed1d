"""``serve --config FILE`` for tests that need a scheduler shared by several processes.

``python -m tests.api.serve_launcher --config FILE`` runs the real service, with the
file-backed test cluster (tests/api/file_cluster.py) as its adapter when
``GPUOPS_TEST_CLUSTER_FILE`` names a file: the adapter registry holds only real back-ends.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> None:
    from api.commands.serve import run_service

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path)
    args = ap.parse_args(argv)
    kw: dict[str, Any] = {}
    if os.environ.get("GPUOPS_TEST_CLUSTER_FILE"):
        from tests.api.file_cluster import FileClusterAdapter

        kw["adapter"] = FileClusterAdapter(os.environ["GPUOPS_TEST_CLUSTER_FILE"])
    run_service(args.config, **kw)


if __name__ == "__main__":
    main(sys.argv[1:])
