"""On-disk format v2 (v1 still read): token and item shards plus the `index.json` manifest that names them."""
