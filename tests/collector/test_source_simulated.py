"""The simulated source plays one node tick by tick, with the simulator's data, stamped live."""

from __future__ import annotations

from collector.schema import validate_record
from collector.sources.base import SourceOptions, build_sources
from collector.simulator import SimConfig, Simulator


def test_simulated_source_gives_one_tick_of_its_node_per_sample_valid_per_contract():
    (src,) = build_sources(["simulated"], SourceOptions(node="demo-node-7"))
    batches = [src.sample(1_800_000_000.0 + 10 * k) for k in range(400)]  # crosses a chunk boundary
    assert all(len(b.gpu) == 8 and len(b.net) == 8 for b in batches)
    assert {r["node"] for b in batches for r in b.gpu} == {"demo-node-7"}
    assert batches[3].gpu[0]["ts"] == 1_800_000_030.0
    assert all(validate_record(r, "gpu") is None for r in batches[0].gpu)
    assert all(validate_record(r, "net") is None for r in batches[0].net)


def test_simulated_source_values_equal_the_recording_simulator_for_the_same_seed():
    (src,) = build_sources(["simulated"], SourceOptions(node="gpu-node-001"))
    live = [r["temp_gpu_c"] for k in range(5) for r in src.sample(float(k)).gpu]
    sim = Simulator(SimConfig(nodes=1, names=("gpu-node-001",), hours=24 * 365, seed=0))
    first = next(sim.chunks()).gpu.column("temp_gpu_c").to_pylist()[:40]
    assert live == first
