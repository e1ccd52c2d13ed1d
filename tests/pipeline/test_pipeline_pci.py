"""XID events that name only a PCI bus id find their GPU through the bus ids GPU samples carry."""

from __future__ import annotations

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
