"""llm: training text to a PyTorch training step, streamed and exactly resumable."""

__version__ = "0.1.0"
