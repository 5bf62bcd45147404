"""Mix several optimized datasets: `CombinedStreamingDataset` holds its sources."""
