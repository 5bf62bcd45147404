# ruff: noqa -- LitData README.md line 857 (Lightning-AI/litdata@bef28be), as written; only the litdata import changed
import llm.data as ld

def compress(index):
    return index, index**2

if __name__ == "__main__":
    # Add some data
    ld.optimize(
        fn=compress,
        inputs=list(range(100)),
        output_dir="./my_optimized_dataset",
        chunk_bytes="64MB",
        num_workers=1,
        compression="zstd"
    )
