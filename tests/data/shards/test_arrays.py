"""The read path's NumPy helpers give what NumPy itself gives."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from llm.data.shards.arrays import distinct


@given(st.lists(st.integers(-(2**40), 2**40), max_size=200))
def test_distinct_is_numpys_unique(values):
    arr = np.array(values, dtype=np.int64)
    assert distinct(arr) == np.unique(arr).tolist()
    assert all(type(v) is int for v in distinct(arr))


def test_distinct_takes_any_shape():
    assert distinct(np.array([[3, 1], [3, 2]])) == [1, 2, 3]
