"""benchmarks/host_stamps.py on CPU: the stamps it takes of a pass (the device run gives their
times on the GPU's host)."""

from __future__ import annotations

import torch
from bench_modules import load as _load

from mok import backends, functional, passes
from mok.backends.cuda import comm, extension
from mok.backends.cuda.engine import CudaEngine
from mok.bench import harness
from mok.bench import mok_step as bench_mok


def test_host_stamps_time_every_stage_of_a_pass(single_rank_group, monkeypatch):
    """benchmarks/host_stamps.py on CPU (one rank, the smoke shape; the reference backend makes
    no kernel launch): every wrapped stage is stamped on entry and return, in call order, with
    nondecreasing medians, and the wrappers leave the results alone."""
    stamps = _load("host_stamps")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    for module, name in ((extension, "launch"), (functional, "build_schedule"),
                         (functional, "validate_inputs"), (functional, "forward"),
                         (passes, "forward"), (passes, "backward"), (backends, "engine"),
                         (backends, "routed_gemms"), (CudaEngine, "use_sources"),
                         (CudaEngine, "pull_beside"), (comm, "pull_rows"),
                         (passes, "_shared_forward"), (passes, "_shared_backward")):  # fmt: skip
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    shape = harness.SMOKE_SHAPES["tiny"]
    d = harness.Dist(0, 1, torch.device("cpu"), single_rank_group)
    step = bench_mok.warm_step(d, shape, False, steps=1)
    want = step.forward(0)[2]
    stamps.install()
    got = stamps.stamps_of(lambda: step.forward(0), calls=3)
    labels = [label for label, _ in got]
    assert labels == [
        "mok.functional.build_schedule", "mok.functional.build_schedule done",
        "mok.functional.forward", "mok.functional.validate_inputs",
        "mok.functional.validate_inputs done", "mok.backends.engine", "mok.backends.engine done",
        "mok.passes.forward", "mok.passes._shared_forward", "mok.passes._shared_forward done",
        "mok.passes.forward done",
        "mok.functional.forward done", "return",
    ]  # fmt: skip
    times = [us for _, us in got]
    assert times == sorted(times) and times[0] >= 0
    assert torch.equal(step.forward(0)[2], want)
