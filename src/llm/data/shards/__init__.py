"""Optimized shards: prepare once (`optimize`), stream many times (`StreamingDataset`)."""
