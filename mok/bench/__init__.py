"""The benchmark harness, shipped with mok so that `mok bench` and `mok tune` run where mok is
installed: the shapes, the timing method (harness), the systems (mok_step, standard_path, one_gpu,
gemms), the floors, the results table's rows (results) and charts (chart). benchmarks/README.md
holds the method and the standings; benchmarks/results.jsonl the committed rows."""
