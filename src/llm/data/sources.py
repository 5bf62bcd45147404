"""`llm.data.sources`: the guide's import path, kept for its users; the code lives in `llm.data.text.sources`."""

from llm.data.text.sources import *  # noqa: F403
