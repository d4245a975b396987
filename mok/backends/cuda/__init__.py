"""The CUDA engine: mok's kernels for every stage (comm, schedule, GEMMs, epilogues)."""
