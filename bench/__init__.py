"""Side-by-side benchmarks of llm.data against LitData, MosaicML Streaming, HF datasets and the limits."""
