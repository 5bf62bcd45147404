# ruff: noqa -- LitData README.md line 1028 (Lightning-AI/litdata@bef28be), as written; only the litdata import changed
from llm.data import StreamingDataset

dataset = StreamingDataset(input_dir="local:/data/shared-drive/some-data")
