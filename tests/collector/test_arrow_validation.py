"""Validating a recording window on its Arrow arrays gives exactly what validate_frame gives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from collector.recording.arrow_validation import validate_table
from collector.schema import RecordType, validate_frame


def bad_gpu_table():
    df = pd.DataFrame({
        "ts": [1.0, np.inf, 3.0, np.nan, 5.0, 6.0, 7.0, 8.0],
        "node": ["a", "b", "bad node", "c", None, "e", "a", "f"],
        "gpu": [0.0, 1.0, 2.0, 3.0, 4.0, 5.5, 6.0, 7.0],
        "util_gpu": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, None, 8.0],
        "throttle_reasons": [4, None, 8, 0, 0, 0, 0, 32],
        "my_extra": list("abcdefgh"),
    })
    return pa.Table.from_pandas(df, preserve_index=False)


def test_bad_rows_get_the_reasons_validate_frame_gives_them():
    tbl = bad_gpu_table()
    fast, slow = validate_table(tbl, RecordType.GPU), validate_frame(tbl.to_pandas(), RecordType.GPU)
    assert fast.rejected["reason"].tolist() == slow.rejected["reason"].tolist()
    assert fast.rejected["ts"].tolist() == pytest.approx(slow.rejected["ts"].tolist(), nan_ok=True)


@pytest.mark.parametrize("make", [bad_gpu_table, lambda: bad_gpu_table().slice(6)], ids=["some-bad", "all-good"])
def test_valid_rows_have_the_same_values_and_contract_dtypes(make):
    tbl = make()
    fast, slow = validate_table(tbl, RecordType.GPU).valid, validate_frame(tbl.to_pandas(), RecordType.GPU).valid
    assert list(fast.columns) == list(slow.columns)
    for c in fast.columns:
        a, b = fast[c], slow[c]
        if isinstance(a.dtype, pd.CategoricalDtype) or a.dtype == object:
            assert a.astype(object).where(a.notna(), None).tolist() == b.astype(object).where(b.notna(), None).tolist()
        else:
            assert a.dtype == b.dtype, c
            np.testing.assert_array_equal(a.to_numpy(np.float64, na_value=np.nan),
                                          b.to_numpy(np.float64, na_value=np.nan))


def test_dictionary_encoded_names_become_categories_in_order_of_first_appearance():
    names = pa.array(["n2", None, "n1", "n2", "bad node", "n3"]).dictionary_encode()
    tbl = pa.table({"ts": [1.0] * 6, "node": names, "gpu": pa.array([0] * 6, pa.int16())})
    res = validate_table(tbl, RecordType.GPU)
    assert res.valid["node"].cat.categories.tolist() == ["n2", "n1", "n3"]
    assert res.valid["node"].tolist() == ["n2", "n1", "n2", "n3"]
    assert sorted(res.rejected["reason"]) == ["malformed node name 'bad node'", "missing required field 'node'"]


def test_column_selection_keeps_required_keys_and_the_named_columns_only():
    res = validate_table(bad_gpu_table().drop_columns(["my_extra"]), RecordType.GPU, columns={"util_gpu", "xid_last"})
    assert list(res.valid.columns) == ["ts", "node", "gpu", "util_gpu", "xid_last"]
    assert res.valid["xid_last"].isna().all() and res.valid["xid_last"].dtype == np.float32


def test_unusual_column_types_take_the_general_path_with_the_same_rules():
    tbl = pa.table({"ts": [1.0, 2.0], "node": ["a", "b"], "gpu": [0, 1], "gpu_uuid": pa.nulls(2)})
    res = validate_table(tbl, RecordType.GPU)
    assert len(res.valid) == 2 and res.valid["gpu_uuid"].isna().all() and res.n_rejected == 0
    assert list(validate_table(tbl, RecordType.GPU, columns={"gpu_uuid"}).valid.columns) == ["ts", "node", "gpu",
                                                                                             "gpu_uuid"]
