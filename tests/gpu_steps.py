"""One MoE step on the CUDA GPUs of the GPU tier, shared by tests/gpu/test_functional_cuda.py (a
torch.distributed group, one process per rank) and tests/gpu/test_ep_group.py (whichever group
the machine has: the torchrun world, or N ranks on one GPU): the cases, each rank's inputs, the
step through mok.functional, and the comparison with the reference backend's tolerances
(DESIGN.md section 7).
"""

from __future__ import annotations

import os
import time

import torch

from mok import functional as F
from mok import ops

# name: (tokens per rank, hidden, intermediate, local experts, topk, routing)
CASES = {
    "smallest": (1, 128, 128, 1, 1, "uniform"),
    "dsv4-like": (256, 7168, 3072, 2, 6, "uniform"),
    "qwen3-235b-like": (512, 4096, 1536, 4, 8, "uniform"),
    "all-to-one-expert": (300, 1024, 512, 3, 1, "one-expert"),
    "empty-experts": (200, 1024, 512, 4, 2, "first-half"),
    "one-rank-receives-all": (256, 1024, 512, 2, 4, "rank0"),
}
TOLERANCE = {"bf16": (0.5, 0.01), "mxfp8": (1.0, 0.1)}
GRAD_NAMES = ("d_x", "d_router_weights", "d_gate", "d_up", "d_down", "d_sgate", "d_sup", "d_sdown")
# Long reductions: weight gradients sum over every row of an expert, router-weight gradients over
# H. Their magnitude (and bf16's spacing) grows with that length, so their max bound is relative
# to the largest reference value.
REDUCTIONS = {"d_router_weights", "d_gate", "d_up", "d_down", "d_sgate", "d_sup", "d_sdown"}
# MXFP8: the two backends' bf16 inputs to a quantizer can differ by one bf16 step (the interim
# engine rounds d_h to bf16), which can move an element to the next e4m3 value: 1/8 relative.
REDUCTION_TOLERANCE = {"bf16": (0.02, 0.01), "mxfp8": (0.15, 0.1)}
MIN_AVERAGED = 64  # elements below which a relative sum is one sample, not an average


def drawn_seed() -> int:
    """MOK_TEST_SEED if set, else a fresh one (the caller prints it, and makes every process of
    a group agree on it)."""
    return int(os.environ.get("MOK_TEST_SEED", time.time_ns() % 2**31))


def _pool(kind, experts_total, local):
    """How many experts the routing picks from (the first `pool` global experts)."""
    return {
        "uniform": experts_total,
        "first-half": max(experts_total // 2, 1),
        "rank0": local,
        "one-expert": 1,
    }[kind]


def _routing(kind, tokens, topk, pool, generator):
    scores = torch.rand(tokens, pool, generator=generator, device="cuda")
    if kind == "one-expert":
        return torch.zeros(tokens, topk, dtype=torch.int64, device="cuda")
    return scores.topk(topk, dim=1).indices


def make(case, seed, rank, ep):
    """Rank `rank`'s inputs of `case` in a group of `ep`: its tokens, routing and router weights
    and its experts' weights from its own stream of `seed`, the shared expert from `seed`."""
    tokens, hidden, inter, local, topk, kind = case
    pool = _pool(kind, ep * local, local)
    topk = topk if kind == "one-expert" else min(topk, pool)
    shared_gen = torch.Generator(device="cuda").manual_seed(seed)
    local_gen = torch.Generator(device="cuda").manual_seed(seed + 1 + rank)

    def weight(*shape, generator=local_gen):
        scale = shape[-1] ** -0.5
        return (torch.randn(*shape, generator=generator, device="cuda") * scale).bfloat16()

    return {
        "top": _routing(kind, tokens, topk, pool, local_gen),
        "x": torch.randn(tokens, hidden, generator=local_gen, device="cuda").bfloat16(),
        "rw": torch.randn(tokens, topk, generator=local_gen, device="cuda"),
        "grad": torch.randn(tokens, hidden, generator=local_gen, device="cuda").bfloat16(),
        "shared": (
            weight(inter, hidden, generator=shared_gen),
            weight(inter, hidden, generator=shared_gen),
            weight(hidden, inter, generator=shared_gen),
        ),
        "routed": (
            weight(local, inter, hidden),
            weight(local, inter, hidden),
            weight(local, hidden, inter),
        ),
    }


def weights(routed, mode):
    if mode == "bf16":
        return routed, routed
    forms = [ops.mxfp8_quantize(w, True, True) for w in routed]
    fwd = [tuple(f[:2]) for f in forms]
    return fwd, [tuple(forms[0]), tuple(forms[1]), tuple(forms[2][2:])]


def workspace(group, data, config=None):
    """(config, a CUDA workspace sized for `data`, make()'s inputs); `config` defaults to
    MoKConfig()."""
    config = config or F.MoKConfig()
    tokens, hidden = data["x"].shape
    ws = F.create_workspace(config, group, device=torch.device("cuda"), num_local_tokens=tokens,
                            hidden_size=hidden, topk=data["top"].shape[1])  # fmt: skip
    return config, ws


def step(ws, config, data, mode, limit=8.0, *, capturable=False, edit_schedule=None):
    """Schedule, forward and backward; returns ([out, *grads], schedule). The buffers are poisoned
    first and the device status checked last, unless `capturable` (for a CUDA-graph capture:
    check_status's host sync cannot be captured). `edit_schedule` maps the built schedule to
    the one the passes get."""
    fwd_w, bwd_w = weights(data["routed"], mode)
    if not capturable:
        for buffer in (ws.combine_buffer, ws.d_x_routed_buffer):
            buffer.fill_(float("nan"))
    local = data["routed"][0].shape[0]
    schedule = F.build_schedule(ws, config, data["top"], num_local_experts=local)
    if edit_schedule is not None:
        schedule = edit_schedule(schedule)
    out, ctx = F.forward(
        config, ws, schedule, data["x"], data["rw"], *data["shared"], *fwd_w, swiglu_limit=limit
    )
    grads = F.backward(
        config,
        ws,
        schedule,
        ctx,
        data["grad"],
        data["x"],
        data["rw"],
        *data["shared"],
        *bwd_w,
        swiglu_limit=limit,
    )
    if not capturable:
        F.check_status(ws)
    return [out, *grads], schedule


def compare(name, got, ref, mode, where=""):
    """`got` against the reference backend's `ref` for output or gradient `name`; `where` (e.g.
    "rank 3 ") prefixes the failure message."""
    max_bound, rel_bound = (REDUCTION_TOLERANCE if name in REDUCTIONS else TOLERANCE)[mode]
    if name in REDUCTIONS:
        max_bound *= max(float(ref.abs().max()), 1.0)
    assert torch.isfinite(got.float()).all(), f"{where}{name}: non-finite values"
    diff = (got.double() - ref.double()).abs()
    rel = float(diff.sum() / ref.double().abs().sum().clamp(min=1e-30))
    if name in REDUCTIONS and got.numel() < MIN_AVERAGED:
        # A handful of dot products: Σ|diff|/Σ|ref| then measures the cancellation inside each
        # sum (the interim engine rounds d_h to bf16 before d_router_weights), not an average
        # error; the elementwise max bound above still holds them.
        rel = 0.0
    assert float(diff.max()) <= max_bound and rel <= rel_bound, (
        f"{where}{name}: max|diff| {float(diff.max()):.4f} (bound {max_bound}), rel {rel:.2e} "
        f"(bound {rel_bound})"
    )
