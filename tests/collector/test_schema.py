"""The telemetry contract: every kind of bad record is rejected with its reason; extras are kept."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collector.schema import (
    FaultClass,
    RecordType,
    arrow_schema,
    empty_frame,
    validate_frame,
    validate_incident,
    validate_record,
)


def good_gpu(**kw):
    rec = {"ts": 1767225600.0, "node": "gpu-node-001", "gpu": 3, "util_gpu": 97.0, "ecc_sbe_vol": 4.0}
    rec.update(kw)
    return rec


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"ts": None}, "missing required field 'ts'"),
        ({"node": None}, "missing required field 'node'"),
        ({"gpu": None}, "missing required field 'gpu'"),
        ({"ts": float("inf")}, "non-finite timestamp"),
        ({"ts": float("nan")}, "non-finite timestamp"),
        ({"node": "bad node"}, "malformed node name"),
        ({"node": "-leading-dash"}, "malformed node name"),
        ({"node": 17}, "must be a string"),
        ({"ts": "1767225600"}, "must be a number"),
        ({"util_gpu": "97"}, "must be a number"),
        ({"gpu": 1.5}, "must be an integer"),
        ({"ecc_sbe_vol": True}, "must be a number"),
    ],
)
def test_bad_gpu_record_is_rejected_with_its_reason(change, reason):
    assert reason in (validate_record(good_gpu(**change), RecordType.GPU) or "")


def test_good_record_with_unknown_extra_fields_and_nulls_is_accepted():
    assert validate_record(good_gpu(vendor_field="x", temp_gpu_c=None), "gpu") is None


def test_event_and_port_records_need_their_own_keys():
    assert "missing required field 'kind'" in validate_record(
        {"ts": 1.0, "node": "n1", "source": "kmsg"}, "event")
    assert "missing required field 'device'" in validate_record({"ts": 1.0, "node": "n1", "port": 1}, "net")
    assert validate_record({"ts": 1.0, "node": "n1", "source": "kmsg", "kind": "xid", "code": 79}, "event") is None


def test_frame_validation_rejects_each_bad_row_with_reason_and_keeps_the_rest():
    df = pd.DataFrame({
        "ts": [1.0, np.inf, 3.0, 4.0, 5.0, np.nan, 7.0],
        "node": ["a", "b", "bad node", "c", None, "e", "f"],
        "gpu": [0, 1, 2, 3, 4, 5, 6],
        "util_gpu": [1.0, 2.0, 3.0, "x", 5.0, 6.0, 7.0],
        "my_extra": list("abcdefg"),
    })
    res = validate_frame(df, RecordType.GPU)
    assert res.valid["ts"].tolist() == [1.0, 7.0]
    assert res.valid["my_extra"].tolist() == ["a", "g"]
    reasons = res.rejected.set_index("ts", drop=False)["reason"].tolist()
    assert reasons == ["non-finite timestamp", "malformed node name 'bad node'",
                       "field 'util_gpu' must be a number", "missing required field 'node'",
                       "missing required field 'ts'"]


def test_frame_validation_adds_missing_optional_columns_as_null_with_contract_dtypes():
    res = validate_frame(pd.DataFrame({"ts": [1.0], "node": ["n"], "gpu": [0]}), RecordType.GPU)
    assert list(res.valid.columns) == list(RecordType.GPU.column_names)
    assert np.isnan(res.valid["ecc_dbe_vol"].iloc[0])
    assert res.valid["gpu"].dtype == np.int16 and res.valid["util_gpu"].dtype == np.float32


def test_frame_without_a_required_column_rejects_every_row():
    res = validate_frame(pd.DataFrame({"ts": [1.0, 2.0], "gpu": [0, 1]}), RecordType.GPU)
    assert res.valid.empty and set(res.rejected["reason"]) == {"missing required field 'node'"}


def test_empty_frame_and_arrow_schema_follow_the_contract():
    assert list(empty_frame("net").columns) == list(RecordType.NET.column_names)
    schema = arrow_schema("gpu")
    assert schema.field("throttle_reasons").type.bit_width == 64
    assert not schema.field("ts").nullable and schema.field("temp_gpu_c").nullable


def test_incident_validation_names_the_problem():
    ok = {"node": "n1", "fault": "hbm_ecc", "failure_ts": 10.0, "onset_ts": None}
    assert validate_incident(ok) is None
    assert "unknown fault class" in validate_incident(ok | {"fault": "gremlins"})
    assert "missing 'failure_ts'" in validate_incident({"node": "n1", "fault": "pcie"})
    assert FaultClass.APP_ERROR not in [f for f in FaultClass if f.is_node_fault]
