"""Tests for llm.training: config, model, checkpoints, tasks, trainer, DDP, the CLI."""
