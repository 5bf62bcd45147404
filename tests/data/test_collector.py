"""`collector_paused()` holds the garbage collector off in its block and leaves it as it found it, errors included."""

import gc
import re

import pytest

from llm.data.collector import collector_paused
from llm.data.tokenize.tokenizers import load_tokenizer


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_in_the_block_and_left_as_found(enabled):
    (gc.enable if enabled else gc.disable)()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(KeyError), collector_paused():
            raise KeyError("x")
        assert gc.isenabled() is enabled
    finally:
        gc.enable()


def test_loading_a_tokenizer_leaves_the_collector_on_even_when_the_file_is_refused_by_name(tmp_path):
    assert gc.isenabled()
    load_tokenizer("simple")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=re.escape(f"tokenizer file {bad} is not a tokenizer.json")):
        load_tokenizer(str(bad))
    assert gc.isenabled()
