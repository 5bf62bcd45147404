"""Suite-wide settings: hypothesis without per-example deadlines (CI machines are small and shared)."""

from hypothesis import settings

settings.register_profile("llm", deadline=None, max_examples=60)
settings.load_profile("llm")
