"""Recording frames become the same column batches however their columns are typed."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.samples import GPU_VALUE_COLUMNS, NET_STATE_COUNTERS, frame_block
from pipeline.recordings import RECORDING_COLUMNS, gpu_rows_from_frame, net_rows_from_frame
from pipeline.registry import Keys


def net_frame(categorical: bool) -> pd.DataFrame:
    df = pd.DataFrame({
        "ts": [1.0, 1.0, 2.0, 2.0], "node": ["n2", "n1", "n2", "n1"], "device": ["mlx5_0"] * 4,
        "port": np.array([1, 1, 1, 1], np.int16), "link_state": ["4: ACTIVE", None, "1: DOWN", "ACTIVE"],
        "symbol_error": np.array([0.0, np.nan, 2.0, 3.0]), "link_downed": pd.array([1, None, 0, 0], dtype="Int64"),
    })
    if categorical:
        for c in ("node", "device", "link_state"):
            df[c] = df[c].astype("category")
    return df


def test_categorical_and_object_name_columns_give_the_same_port_rows():
    a, b = net_rows_from_frame(net_frame(False), Keys()), net_rows_from_frame(net_frame(True), Keys())
    assert a.active.tolist() == b.active.tolist() == [1, -1, 0, 1]
    np.testing.assert_array_equal(a.port, b.port)
    np.testing.assert_array_equal(a.vals, b.vals)


def test_value_block_casts_each_column_and_reads_absent_or_null_values_as_nan():
    block = frame_block(net_frame(False), NET_STATE_COUNTERS)
    j = NET_STATE_COUNTERS.index
    assert np.isnan(block[j("port_xmit_wait")]).all()
    np.testing.assert_array_equal(block[j("link_downed")], [1.0, np.nan, 0.0, 0.0])
    np.testing.assert_array_equal(block[j("symbol_error")], [0.0, np.nan, 2.0, 3.0])


def test_gpu_rows_keep_float32_values_exactly_and_are_writable():
    ts = np.array([5.0])
    ts.flags.writeable = False  # the reader may hand out read-only views of Arrow buffers
    df = pd.DataFrame({"ts": ts, "node": ["n1"], "gpu": np.array([3], np.int16),
                       "util_gpu": np.array([0.1], np.float32), "throttle_reasons": np.array([8], np.int64)}, copy=False)
    assert not df["ts"].to_numpy().flags.writeable
    rows, bad = gpu_rows_from_frame(df, Keys(), 8)
    assert bad == 0 and rows.ts.flags.writeable
    assert rows.vals[GPU_VALUE_COLUMNS.index("util_gpu"), 0] == np.float64(np.float32(0.1))
    assert rows.vals[GPU_VALUE_COLUMNS.index("throttle_reasons"), 0] == 8.0


def test_replay_reads_every_column_the_conversions_use():
    assert set(GPU_VALUE_COLUMNS) < set(RECORDING_COLUMNS["gpu"])
    assert set(NET_STATE_COUNTERS) | {"link_state", "device", "port"} < set(RECORDING_COLUMNS["net"])


def test_slots_are_numbered_as_if_the_registry_saw_every_row():
    """The registries number new GPUs in (node, gpu) order and new ports in order of first
    appearance, looking each distinct key up once: the same slots as one lookup per row."""
    rng = np.random.default_rng(0)
    nodes = rng.integers(0, 5, 400).astype(np.int32)
    gpu, port = rng.integers(0, 8, 400), rng.integers(1, 3, 400)
    devices = pd.Categorical(rng.choice(["mlx5_1", "mlx5_0", None], 400))
    gpu_ref = {k: i for i, k in enumerate(sorted(set(zip(nodes.tolist(), gpu.tolist()))))}
    dev_names = [None if isinstance(d, float) else d for d in np.asarray(devices, object)]  # NaN → None
    rows = list(zip(nodes.tolist(), dev_names, port.tolist()))
    port_ref: dict = {}
    for k in rows:
        port_ref.setdefault(k, len(port_ref))
    by_row = [port_ref[k] for k in rows]
    direct, names = Keys(), Keys()
    for k in (direct, names):
        for i in range(5):
            k.nodes.id_of(f"n{i}")
    np.testing.assert_array_equal(direct.gpus.slots_of(nodes, gpu),
                                  [gpu_ref[k] for k in zip(nodes.tolist(), gpu.tolist())])
    np.testing.assert_array_equal(direct.ports.slots_of(nodes, devices, port), by_row)
    np.testing.assert_array_equal(names.ports.slots_of(nodes, np.asarray(devices, object), port), by_row)
    assert direct.ports.keys == names.ports.keys == list(port_ref) and direct.gpus.n == len(gpu_ref) == 40
