"""The benchmark harness, shipped with mok so that `mok bench` and `mok tune` run where mok is
installed: the shapes, the timing method (harness), the systems (mok_step, standard_path, one_gpu,
gemms), the floors, the results table's rows (results) and charts (chart), `mok bench`'s run
(run) and `mok tune`'s sweep (tune), and their progress display (progress). benchmarks/README.md
holds the method and the standings; benchmarks/results.jsonl the committed rows."""
