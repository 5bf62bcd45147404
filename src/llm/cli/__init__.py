"""Command-line entry points: `llm-train` and `llm-data`."""
