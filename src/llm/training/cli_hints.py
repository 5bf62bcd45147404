"""The data layer's hints in llm-train's words: a `(CLI: --flag)` hint names an `llm-data` flag llm-train lacks.

The data modules speak to both their Python callers (`text_column=...`) and `llm-data`
(`--text-column`); an error that reaches `llm-train` is reworded here so that it names what
this command takes (`--set data.text_column=...`), never a flag it would reject.
"""

from __future__ import annotations

# the data layer's clause -> llm-train's (tests/training/test_cli_hints.py checks that no other flag is left)
HINTS = {
    "set text_column (CLI: --text-column)":
        "set data.text_column in the YAML or pass --set data.text_column=COLUMN",
    "pass allow_empty=True (CLI: --allow-empty) to write an empty dataset":
        "give data.dataset_path files that hold records",
    "pass wait=True (CLI: --wait)": "run llm-train again once it is done",
    "pass mode='append' or mode='overwrite' (CLI: --mode)":
        "remove the folder or set data.cache_dir to another one",
}


def for_llm_train(message: str) -> str:
    """`message` with each data-layer hint replaced by the way to do the same with llm-train."""
    for clause, ours in HINTS.items():
        message = message.replace(clause, ours)
    return message
