"""On-disk format v1: token and item shards plus the `index.json` manifest that names them."""
