"""`llm.data.presets`: the guide's import path, kept for its users; the code lives in `llm.data.inputs.presets`."""

from llm.data.inputs.presets import *  # noqa: F403
from llm.data.inputs.presets import __all__  # noqa: F401
