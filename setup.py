"""The one compiled module: the run ledger's row kernel (src/llm/data/ledger/_rows.c).

Everything else is in pyproject.toml. The kernel is optional: where no C compiler is found the install goes on
and the ledger takes the NumPy path to the same checksums (llm/data/ledger/checksums.py), only slower.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("llm.data.ledger._rows", ["src/llm/data/ledger/_rows.c"], optional=True,
                             extra_compile_args=["-O3"])])
