"""`llm.data.tokenizers`: the guide's import path, kept for its users; the code lives in `llm.data.tokenize`."""

import sys

from llm.data.tokenize import tokenizers as _tokenizers

# The same module object under both names: patches and isinstance checks see one module.
sys.modules[__name__] = _tokenizers
