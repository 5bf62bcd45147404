"""Stream shards: `StreamingDataset`, `StreamingDataLoader`, sample access, collation, the loader state."""
