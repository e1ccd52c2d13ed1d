"""XID events that name only a PCI bus id find their GPU through the bus ids GPU samples carry."""

from __future__ import annotations

import pandas as pd
import pytest

from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from tests.pipeline.synth import Fleet, events_frame, gpu_frame

SETTINGS = PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=1800)


@pytest.mark.parametrize("sample_form, xid_form", [
    ("00000000:{bus:02X}:00.0", "0000:{bus:02x}:00"),  # NVML samples, kernel line
    ("0000:{bus:02x}:00.0", "{bus:02X}:00"),          # short domain, upper case, no function
])
def test_an_xid_naming_only_its_pci_bus_id_is_counted_on_that_gpu(sample_form, xid_form):
    fleet = Fleet(nodes=1, gpus=4, samples=12, interval_s=10.0)
    g = gpu_frame(fleet)
    g["pci_bus_id"] = [sample_form.format(bus=0x18 + 0x20 * int(i)) for i in g["gpu"]]
    e = events_frame(fleet, [(15, 0, None, 79)])
    e["pci_bus_id"] = xid_form.format(bus=0x18 + 0x20 * 2)
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(g, None, e)
    f = pipe.flush()[0].to_frame().set_index("gpu")
    assert f.loc[2, "xid_off_bus_count_short"] == 1
    assert f["xid_off_bus_count_short"].sum() == 1
    assert f["node_xid_off_bus_count_short"].sum() == 0


def test_an_xid_whose_pci_bus_id_no_sample_named_counts_for_the_node():
    fleet = Fleet(nodes=1, gpus=4, samples=12, interval_s=10.0)
    e = events_frame(fleet, [(15, 0, None, 79)])
    e["pci_bus_id"] = "0000:99:00"
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(gpu_frame(fleet), None, e)
    f = pipe.flush()[0].to_frame()
    assert f["xid_off_bus_count_short"].sum() == 0
    assert (f["node_xid_off_bus_count_short"] == 1).all()


def test_an_xid_without_a_code_is_read_from_its_kernel_line_as_the_kmsg_source_reads_it():
    """Another writer may leave ``code`` (and the bus id) null: the raw line in ``message`` says both."""
    fleet = Fleet(nodes=1, gpus=4, samples=12, interval_s=10.0)
    g = gpu_frame(fleet)
    g["pci_bus_id"] = [f"00000000:{0x18 + 0x20 * int(i):02X}:00.0" for i in g["gpu"]]
    e = events_frame(fleet, [(15, 0, None, 79), (16, 0, None, 48), (17, 0, None, 13), (18, 0, None, 31),
                             (19, 0, None, 74), (20, 0, None, 74)])
    e["code"] = pd.array([None, None, None, 31, 74, 74], dtype="Int32")
    e["pci_bus_id"] = [None] * 6
    e["message"] = ["NVRM: Xid (PCI:0000:58:00): 79, pid=1234, GPU has fallen off the bus.",
                    "kernel: [ 812.3] NVRM: Xid (PCI:0000:38:00): 48, pid=99, An uncorrectable ECC error",
                    "NVRM: a line that names no XID", None,
                    "NVRM: Xid (PCI:0000:78:00): 74, pid=7, NVLink: fatal error",   # coded, bus id only here
                    "NVRM: Xid (PCI:0000:18:00): 79, pid=7, GPU has fallen off the bus."]  # another code's line
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(g, None, e)
    f = pipe.flush()[0].to_frame().set_index("gpu")
    assert f.loc[2, "xid_off_bus_count_short"] == 1 and f["xid_off_bus_count_short"].sum() == 1
    assert f.loc[1, "xid_dbe_count_short"] == 1 and f["xid_dbe_count_short"].sum() == 1
    assert f.loc[3, "xid_nvlink_count_short"] == 1 and f["xid_nvlink_count_short"].sum() == 1
    assert f["node_xid_app_count_short"].max() == 1  # the coded 31, on no GPU; the line without an XID: nothing
    assert f["node_xid_nvlink_count_short"].max() == 1  # the 74 whose line is about a 79: on no GPU, not a guess
