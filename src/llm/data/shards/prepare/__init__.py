"""Prepare shards once: `optimize()` over any inputs, text preparation, local and remote outputs."""
