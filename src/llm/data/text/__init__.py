"""On-the-fly text: records from files or hubs -> dedup -> tokens -> packed blocks, with exact cursors."""
