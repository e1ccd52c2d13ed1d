"""``GET /v1/coverage``, a node's ``blind_signals`` and ``gpuops_nodes_blind``: the precursor signals nodes do not send."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import numpy as np

from models.coverage import bits_of
from tests.api.conftest import FLEET, headers
from tests.api.test_metrics import promtool  # noqa: F401  (the fixture)
from tests.remediation.test_engine import fleet


def feed(api_ctx, ticks: list[dict[int, list[str]]]) -> None:
    """Ticks of the fixture's fleet whose nodes (by index) do not send the signals named."""
    t = api_ctx.clock.t
    for k, blind in enumerate(ticks):
        ns = fleet(FLEET, t + 60.0 * (k + 1), p=[0.0] * FLEET)
        api_ctx.nodes.update(replace(ns, blind=np.array([bits_of(blind.get(i, [])) for i in range(FLEET)])))


def test_a_node_shows_the_signals_it_did_not_send_on_its_last_three_ticks(client, api_ctx):
    node = lambda name: client.get(f"/v1/nodes/{name}", headers=headers("viewer")).json()  # noqa: E731
    assert node("n00003")["blind_signals"] is None                   # the scorer has not said
    feed(api_ctx, [{3: ["ecc", "nvlink"]}] * 2)
    assert node("n00003")["blind_signals"] is None                   # two ticks are not yet three
    feed(api_ctx, [{3: ["ecc", "nvlink"], 4: ["ib_ports"]}])           # n00004's ports missed one tick only
    assert node("n00003")["blind_signals"] == ["ecc", "nvlink"] and node("n00004")["blind_signals"] == []
    feed(api_ctx, [{3: ["ecc"], 4: ["ib_ports"]}])
    assert node("n00003")["blind_signals"] == ["ecc"]


def test_coverage_lists_per_signal_the_nodes_their_faults_and_what_to_enable(client, api_ctx):
    feed(api_ctx, [{3: ["ecc", "nvlink"], 5: ["ecc"]}] * 3)
    body = client.get("/v1/coverage", headers=headers("viewer")).json()
    by = {s["signal"]: s for s in body["signals"]}
    assert by["ecc"]["nodes"] == ["n00003", "n00005"] and by["ecc"]["count"] == 2 and by["ecc"]["faults"] == ["hbm_ecc"]
    assert by["nvlink"]["nodes"] == ["n00003"] and "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" in by["nvlink"]["enable"]
    assert by["pcie"]["count"] == 0 and body["nodes_known"] == FLEET and body["ts"] == api_ctx.nodes.ts


def test_metrics_count_the_nodes_not_sending_each_signal_and_pass_promtool(client, api_ctx, promtool):  # noqa: F811
    feed(api_ctx, [{3: ["ecc", "nvlink"], 5: ["ecc"]}] * 3)
    text = client.get("/metrics", headers=headers("viewer")).text
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    for line in ('gpuops_nodes_blind{signal="ecc"} 2.0', 'gpuops_nodes_blind{signal="nvlink"} 1.0',
                 'gpuops_nodes_blind{signal="pcie"} 0.0'):
        assert line in text, line
