"""The functional path on the CUDA backend against the reference backend, on the same GPUs.

Run: torchrun --nproc-per-node=N -m pytest tests/gpu/test_functional_cuda.py (N = 1 or 2; the
multi-rank cases need N >= 2). Every case draws fresh random data (seed printed), compares the
CUDA backend's output and gradients with the reference backend's (MOK_BACKEND=reference) using
the tolerances of DESIGN.md §7, and poisons the workspace buffers between runs.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from gpu_helpers import poison_cached_memory
from gpu_steps import CASES, GRAD_NAMES, compare, drawn_seed, make, step, workspace

from mok import functional as F
from mok import passes
from mok.backends.cuda.experimental import f16_rows, swiglu_epilogue

# Rank-count agnostic: the 1-rank pass runs them at EP=1, the multi-GPU pass at EP=N.
pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]


def _seed() -> int:
    tensor = torch.tensor([drawn_seed()], device="cuda")
    dist.broadcast(tensor, 0)
    print(f"seed {int(tensor)} (replay with MOK_TEST_SEED)")
    return int(tensor)


def _make(case, seed):
    return make(case, seed, dist.get_rank(), dist.get_world_size())


def _workspace(group, data):
    config = F.MoKConfig(fwd_num_comm_sms=16, bwd_num_comm_sms=16, schedule_capacity_multiplier=1.0)
    return workspace(group, data, config)


def _check_against_reference(group, monkeypatch, case, mode, shared):
    data = _make(case, _seed())
    if not shared:
        data["shared"] = (None, None, None)
    config, ws = _workspace(group, data)
    got, schedule = step(ws, config, data, mode)
    monkeypatch.setenv("MOK_BACKEND", "reference")
    ref, _ = step(ws, config, data, mode)
    for name, g, r in zip(("out", *GRAD_NAMES), got, ref, strict=True):
        if g is None or r is None:
            assert g is None and r is None, f"{name}: present in one backend only"
            continue
        compare(name, g, r, mode)
    empty = schedule.tokens_per_expert == 0
    for name, grad in zip(("d_gate", "d_up", "d_down"), got[3:6], strict=True):
        assert not grad[empty].any(), f"{name}: experts without tokens must get exact zeros"


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "no-shared"])
@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_reference(nccl_group, monkeypatch, case, mode, shared):
    _check_against_reference(nccl_group, monkeypatch, case, mode, shared)


# The benchmark's sizes per rank (mok/bench/harness.py SHAPES: 4096 tokens, ~2048 rows per
# expert), with or without the shared expert as there; CASES keeps the same H, I and top-k at
# fewer tokens for the rest of the matrix.
FULL_SIZE = {
    "dsv4-pro": ((4096, 7168, 3072, 12, 6, "uniform"), True),
    "qwen3-235b": ((4096, 4096, 1536, 16, 8, "uniform"), False),
}


@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
@pytest.mark.parametrize("name", FULL_SIZE)
def test_full_size_matches_reference(nccl_group, monkeypatch, name, mode):
    case, shared = FULL_SIZE[name]
    _check_against_reference(nccl_group, monkeypatch, case, mode, shared)


@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_bitwise_deterministic(nccl_group, mode):
    data = _make(CASES["qwen3-235b-like"], _seed())
    config, ws = _workspace(nccl_group, data)
    first, _ = step(ws, config, data, mode)
    for _ in range(4):
        again, _ = step(ws, config, data, mode)
        for name, a, b in zip(("out", *GRAD_NAMES), first, again, strict=True):
            assert torch.equal(a, b), f"{name} changed between identical runs"


# NaN (which a max may skip) and a large finite value (which a block's scale may not).
STALE = pytest.mark.parametrize("stale", [float("nan"), 3.0e4], ids=["nan", "large"])


@STALE
@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
@pytest.mark.parametrize("case", ["qwen3-235b-like", "empty-experts", "one-rank-receives-all"])
def test_stale_memory_changes_no_bit(nccl_group, case, mode, stale):
    """The step reads nothing it did not write: with every cached block of the allocator
    filled with `stale` first, it gives the bits of a run on whatever memory it had before
    (test_bitwise_deterministic repeats runs on the same allocations, so it cannot see this)."""
    _check_stale_memory(nccl_group, case, mode, stale)


@STALE
@pytest.mark.parametrize(
    ("mode", "variable"), [("bf16", "MOK_SWIGLU_EPILOGUE"), ("mxfp8", "MOK_MXFP8_F16")]
)
def test_stale_memory_changes_no_bit_in_opt_ins(nccl_group, monkeypatch, mode, variable, stale):
    """The same for the opt-in kernels (M_GROUPED_BF16_NT_SWIGLU's SwiGLU epilogue,
    M_GROUPED_MXFP8_NT_F16_ROWS's rebased rows)."""
    monkeypatch.setenv(variable, "1")
    _check_stale_memory(nccl_group, "qwen3-235b-like", mode, stale)


def _check_stale_memory(nccl_group, case, mode, stale):
    data = _make(CASES[case], _seed())
    config, ws = _workspace(nccl_group, data)
    first, _ = step(ws, config, data, mode)
    poison_cached_memory(stale)
    again, _ = step(ws, config, data, mode)
    for name, a, b in zip(("out", *GRAD_NAMES), first, again, strict=True):
        assert torch.equal(a, b), f"{name} depends on what its memory held before the step"


@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_background_exchanges_change_no_bit(nccl_group, monkeypatch, mode):
    """Exchanges overlapped with the shared expert give the bits of foreground ones; one CTA
    (overlap_ctas=1) makes them run long, so a missing wait or an early free would show."""
    data = _make(CASES["dsv4-like"], _seed())
    assert passes.overlaps_shared(data["shared"], data["top"].shape[1]), "case must overlap"
    config, ws = _workspace(nccl_group, data)
    foreground, _ = step(ws, dataclasses.replace(config, overlap_ctas=0), data, mode)
    background, _ = step(ws, dataclasses.replace(config, overlap_ctas=1), data, mode)
    for name, a, b in zip(("out", *GRAD_NAMES), foreground, background, strict=True):
        assert torch.equal(a, b), f"{name}: background exchanges changed the result"


def _switch_changes_no_bit(nccl_group, monkeypatch, case, mode, variable, target):
    """The whole step with the config's switch `variable` off, then on; both must give the
    same bits, and `target` = (module, function) must not run with it off. Returns (whether
    it ran with it on, the workspace)."""
    data = _make(CASES[case], _seed())
    config, ws = _workspace(nccl_group, data)
    module, name = target
    launches = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        launches.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    off, _ = step(ws, dataclasses.replace(config, **{variable: False}), data, mode)
    assert not launches, f"{name} ran although {variable} is off"
    on, _ = step(ws, dataclasses.replace(config, **{variable: True}), data, mode)
    for output, a, b in zip(("out", *GRAD_NAMES), off, on, strict=True):
        assert torch.equal(a, b), f"{output}: {variable}=1 changed the result"
    return bool(launches), ws


@pytest.mark.parametrize("case", ["qwen3-235b-like", "smallest"])
def test_swiglu_epilogue_changes_no_bit(nccl_group, monkeypatch, case):
    """The gate/up GEMM with SwiGLU in its epilogue (swiglu_epilogue=True) gives the bits of
    the GEMM + SwiGLU kernel pair; "smallest" (I = 128) runs it, as qwen3-235b-like does."""
    target = (swiglu_epilogue, "linear_swiglu")
    ran, _ = _switch_changes_no_bit(nccl_group, monkeypatch, case, "bf16", "swiglu_epilogue",
                                    target)  # fmt: skip
    assert ran, "swiglu_epilogue=True did not run the SwiGLU epilogue"


@pytest.mark.parametrize("case", ["dsv4-like", "smallest"])
def test_mxfp8_f16_rows_change_no_bit(nccl_group, monkeypatch, case):
    """The MXFP8 forward's gate/up GEMM on f16 rows rebased per row (M_GROUPED_MXFP8_NT_F16_ROWS,
    mxfp8_f16_rows=True, at EP 1) gives the bits of M_GROUPED_MXFP8_NT on bf16 rows (the
    default) for the whole step."""
    target = (f16_rows, "linear_mx_f16")
    ran, ws = _switch_changes_no_bit(nccl_group, monkeypatch, case, "mxfp8", "mxfp8_f16_rows",
                                     target)  # fmt: skip
    assert ran == (ws.ep_size == 1), "the f16 GEMM runs at EP 1 only (rebased rows are local)"


# dsv4-like's shared expert is large enough for background exchanges (a forked stream in the
# graph), qwen3-235b-like's is not.
@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
@pytest.mark.parametrize("case", ["qwen3-235b-like", "dsv4-like"])
def test_cuda_graph_step_replays_with_new_inputs(nccl_group, case, mode):
    seed = _seed()
    data = _make(CASES[case], seed)
    config, ws = _workspace(nccl_group, data)
    static = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in data.items()}
    step(ws, config, static, mode)  # warm-up: module load, pointer tables, allocator
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured, _ = step(ws, config, static, mode, capturable=True)
    fresh = _make(CASES[case], seed + 1000)
    for key in ("top", "x", "rw", "grad"):
        static[key].copy_(fresh[key])
    graph.replay()
    torch.cuda.synchronize()
    eager, _ = step(
        ws, config, {**fresh, "shared": static["shared"], "routed": static["routed"]}, mode
    )
    for name, a, b in zip(("out", *GRAD_NAMES), captured, eager, strict=True):
        assert torch.equal(a, b), f"{name}: graph replay differs from eager"


# DESIGN.md invariant 3 on the GPU: torch.compile(fullgraph=True) traces the whole step (no
# graph break, no host sync) through the ops' fake implementations, and the compiled step runs
# the same kernels: inductor compiles only the torch ops around mok's.
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_compiled_step_matches_eager(nccl_group, mode, backend):
    data = _make(CASES["qwen3-235b-like"], _seed())
    config, ws = _workspace(nccl_group, data)
    eager, _ = step(ws, config, data, mode)
    for buffer in (ws.combine_buffer, ws.d_x_routed_buffer):
        buffer.fill_(float("nan"))
    torch._dynamo.reset()
    compiled = torch.compile(_capturable_step, fullgraph=True, backend=backend)
    traced = compiled(ws, config, data, mode)
    F.check_status(ws)
    for name, a, b in zip(("out", *GRAD_NAMES), eager, traced, strict=True):
        assert torch.equal(a, b), f"{name}: the step compiled with {backend} differs from eager"


def _capturable_step(ws, config, data, mode):
    return step(ws, config, data, mode, capturable=True)[0]
