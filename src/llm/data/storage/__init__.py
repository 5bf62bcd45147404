"""Where bytes live: local paths (durable writes, directory fsync, the one-writer lock)."""
