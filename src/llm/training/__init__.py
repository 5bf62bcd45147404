"""Training side of llm: config, tasks, model, checkpoints."""
