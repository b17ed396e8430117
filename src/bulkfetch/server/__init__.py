"""The reference file server behind `bulkfetch serve`: the seed API, synthetic or real data,
and deterministic fault switches."""
