"""`llm.data.dedup`: the guide's import path, kept for its users; the code lives in `llm.data.text.dedup`."""

from llm.data.text.dedup import *  # noqa: F403
