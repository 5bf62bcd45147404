"""`llm.data.presets`: the guide's import path, kept for its users; the code lives in `llm.data.text.presets`."""

from llm.data.text.presets import *  # noqa: F403
from llm.data.text.presets import __all__  # noqa: F401
