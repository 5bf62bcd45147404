"""The run ledger: what each step trained on, committed with the checkpoint, and its audit."""
