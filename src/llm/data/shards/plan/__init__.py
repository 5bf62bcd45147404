"""The order as pure functions: the batch schedule, shuffles (one per file), subsets and splits."""
