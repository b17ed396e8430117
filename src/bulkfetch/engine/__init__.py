"""The download engine: listing in the main process, fetching in worker processes."""
