"""Each expert GEMM alone: mok's grouped GEMM kernels against `torch._grouped_mm` on the same
problem (the same rows, segments and weights) in the same run, as TFLOP/s per rank.

Problems (R received rows in E ragged segments, H hidden, I intermediate):
| name          | torch                                    | mok (mok.backends.cuda.grouped_gemm) |
|---------------|------------------------------------------|--------------------------------------|
| gate_up       | rows @ [E, 2I, H]^T -> bf16 [R, 2I]      | linear, one [E, 2I, H] weight        |
| down          | hidden @ [E, H, I]^T -> bf16 [R, H]      | linear                               |
| dgrad_down    | d_y @ [E, H, I] -> bf16 [R, I]           | linear_transposed (fp32 out)         |
| dgrad_gate_up | [d_g, d_u] @ [E, 2I, H] -> bf16 [R, H]   | linear_sum, (d_g, W_g) + (d_u, W_u)  |
| wgrad_down    | d_y^T @ hidden per segment -> [E, H, I]  | weight_grads                         |
| gate_up_swiglu| gate_up, then F.silu(gate) * up (bf16)   | linear_swiglu: SwiGLU in epilogue    |
| gate_up_mx    | gate_up on the MXFP8 values (bf16)       | linear_mx on the (E4M3, scales)      |
| down_mx       | down on the MXFP8 values (bf16)          | linear_mx                            |
| gate_up_mx_f16| gate_up_mx                               | linear_mx_f16: f16 rows rebased      |
| down_mx_f16   | down_mx                                  | linear_mx_f16                        |
| dgrad_down_mx | dgrad_down on the MXFP8 values of W_d^T  | linear_mx to fp32 on W_d^T's pair    |
| dgrad_gate_up_mx | dgrad_gate_up on W_g^T's, W_u^T's values | linear_mx_sum on the two pairs    |
| wgrad_gate_up_mx | [d_g, d_u]^T @ x per segment, x's MXFP8 values | weight_grads_mx on x's pair  |

The `_mx` problems quantize the weights once (mok's kernel) and give torch their dequantized bf16
values: the same products as mok's GEMM, which reads the MXFP8 pair as the MXFP8 forward stores it
(the `dgrad_*_mx` rows: the weights' transposed pairs, as the MXFP8 backward takes them;
`wgrad_gate_up_mx`: rows rounded as the forward rounds them, x's transposed pair read as stored on
the rows laid out as mok's schedule lays them, segments padded to 256 rows whose padding the row
sources mark). The `_mx_f16` rows give mok's f16 GEMM (M_GROUPED_MXFP8_NT_F16_ROWS) the rows
rebased (f16_rows.rebase_rows) and the weights prepared (rebase_weight) once, outside the timing,
as the quantization is.

Each timed call runs the GEMM REPEATS times back to back, for both systems, and its start event
waits behind a sleep kernel while the host enqueues them (`host_ahead`): the time is the kernels'
(each launch's table fill and GEMM, and the gaps between them), not the host's way to the first
launch (mok's goes through Python, torch's through C++), which a pass pays once behind other
work, not per GEMM. The two systems' calls alternate (`Timer.measure_interleaved`), so both meet
the clock the power cap leaves at that moment. The
mok columns are absent where the GPU's module has no grouped GEMMs (not sm_90a).
"""

from __future__ import annotations

import torch

from mok.backends.cuda import grouped_gemm, mxfp8
from mok.backends.cuda import weight_grads_mx as cuda_weight_grads_mx
from mok.backends.cuda.experimental import f16_rows, swiglu_epilogue
from mok.bench import harness

REPEATS = 5


def _halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate's and up's parts of a tensor stacked along dim 1 (weights [E, 2I, H], gradients
    [R, 2I]) as contiguous tensors."""
    return tuple(part.contiguous() for part in t.chunk(2, dim=1))


def rates(timer: harness.Timer, rows: torch.Tensor, offs: torch.Tensor, gate_up, down) -> dict:
    """rows bf16 [R, H]; offs int32 [E] cumulative segment ends; gate_up [E, 2I, H]; down
    [E, H, I] (bf16, contiguous)."""
    n, hidden, inter = rows.shape[0], rows.shape[1], down.shape[2]
    counts = torch.diff(offs, prepend=offs.new_zeros(1)).to(torch.int32)
    gen = torch.Generator(device=rows.device).manual_seed(n)
    h_rows = torch.randn(n, inter, device=rows.device, generator=gen).bfloat16()
    d_y = torch.randn(n, hidden, device=rows.device, generator=gen).bfloat16()
    d_gu = torch.randn(n, 2 * inter, device=rows.device, generator=gen).bfloat16()
    # mok's d_x reads gate's and up's gradients and weights as separate tensors, as a pass has them.
    d_terms = list(zip(_halves(d_gu), _halves(gate_up), strict=True))
    mok = grouped_gemm.available(rows.device)
    problems = {
        "gate_up": (
            2 * n * 2 * inter * hidden,
            lambda: torch._grouped_mm(rows, gate_up.transpose(-2, -1), offs=offs),
            lambda: grouped_gemm.linear(rows, [gate_up], counts),
        ),
        "down": (
            2 * n * hidden * inter,
            lambda: torch._grouped_mm(h_rows, down.transpose(-2, -1), offs=offs),
            lambda: grouped_gemm.linear(h_rows, [down], counts),
        ),
        "dgrad_down": (
            2 * n * hidden * inter,
            lambda: torch._grouped_mm(d_y, down, offs=offs),
            lambda: grouped_gemm.linear_transposed(d_y, down, counts),
        ),
        "dgrad_gate_up": (
            2 * n * 2 * inter * hidden,
            lambda: torch._grouped_mm(d_gu, gate_up, offs=offs),
            lambda: grouped_gemm.linear_sum(d_terms, counts),
        ),
        "wgrad_down": (
            2 * n * hidden * inter,
            lambda: torch._grouped_mm(d_y.T, h_rows, offs=offs),
            lambda: grouped_gemm.weight_grads([(d_y, h_rows)], counts),
        ),
    }
    gate_w, up_w = _halves(gate_up)
    problems["gate_up_swiglu"] = (
        2 * n * 2 * inter * hidden,
        lambda: _torch_swiglu(torch._grouped_mm(rows, gate_up.transpose(-2, -1), offs=offs)),
        lambda: swiglu_epilogue.linear_swiglu(rows, gate_w, up_w, counts),
    )
    if mok:
        problems.update(_mx_problems(rows, h_rows, gate_up, down, offs, counts))
        problems.update(_mx_dgrad_problems(d_y, d_gu, gate_up, down, offs, counts))
        problems["wgrad_gate_up_mx"] = _mx_wgrad_problem(rows, d_gu, offs, counts)
    out: dict[str, float] = {"grouped_mm_rows": n}

    def repeated(fn):
        return lambda: [fn() for _ in range(REPEATS)]

    with torch.no_grad():
        for name, (flop, torch_fn, mok_fn) in problems.items():
            # With mok's kernels both systems are timed in turns, so they share the clock.
            fns = [repeated(torch_fn), repeated(mok_fn)] if mok else [repeated(torch_fn)]
            timings = timer.measure_interleaved(fns, host_ahead=True)
            rate = [REPEATS * flop / t.median_ms / 1e9 for t in timings]
            out[f"grouped_mm_{name}_tflops"] = rate[0]
            if mok:
                out[f"mok_gemm_{name}_tflops"] = rate[1]
                out[f"mok_gemm_{name}_vs_grouped_mm"] = rate[1] / rate[0]
    return out


def _torch_swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU of a [R, 2I] gate|up product as a torch model writes it."""
    gate, up = gate_up.chunk(2, dim=1)
    return torch.nn.functional.silu(gate) * up


def _mx_problems(rows, h_rows, gate_up, down, offs, counts) -> dict:
    """gate_up_mx and down_mx: (FLOPs, torch on the dequantized values, mok's linear_mx)."""
    problems = {}
    for name, a, weight in (("gate_up_mx", rows, gate_up), ("down_mx", h_rows, down)):
        data, scales = mxfp8.mxfp8_quantize(weight)[:2]
        values_t = mxfp8.mxfp8_dequantize(data, scales).transpose(-2, -1)
        mx = grouped_gemm.MxWeight(data, scales)
        flops = 2 * a.shape[0] * a.shape[1] * weight.shape[1]
        torch_call = lambda a=a, w=values_t: torch._grouped_mm(a, w, offs=offs)  # noqa: E731
        problems[name] = (
            flops,
            torch_call,
            lambda a=a, w=mx: grouped_gemm.linear_mx(a, [w], counts),
        )
        rows, weight = f16_rows.rebase_rows(a), f16_rows.rebase_weight(mx)
        problems[name + "_f16"] = (
            flops,
            torch_call,
            lambda a=rows, w=weight: f16_rows.linear_mx_f16(a, [w], counts),
        )
    return problems


def _mx_dgrad_problems(d_y, d_gu, gate_up, down, offs, counts) -> dict:
    """dgrad_down_mx and dgrad_gate_up_mx: (FLOPs, torch on the dequantized values, mok on the
    weights' transposed MXFP8 pairs, W^T [E, N, K] with blocks along K)."""

    def transposed_pair(weight):  # [E, K, N] -> W^T's pair and W's dequantized values
        data, scales = mxfp8.mxfp8_quantize(weight.transpose(1, 2).contiguous())[:2]
        return grouped_gemm.MxWeightT(data, scales), mxfp8.mxfp8_dequantize(data, scales).mT

    down_t, down_values = transposed_pair(down)
    (gate_t, gate_values), (up_t, up_values) = (transposed_pair(w) for w in _halves(gate_up))
    stacked = torch.cat([gate_values, up_values], dim=1)  # [E, 2I, H], as torch's d_x reads it
    d_gate, d_up = _halves(d_gu)
    flops = 2 * d_y.shape[0] * d_y.shape[1] * down.shape[2]
    f32 = torch.float32
    return {
        "dgrad_down_mx": (
            flops,
            lambda: torch._grouped_mm(d_y, down_values, offs=offs),
            lambda: grouped_gemm.linear_mx(d_y, [down_t], counts, out_dtype=f32),
        ),
        "dgrad_gate_up_mx": (
            2 * flops,
            lambda: torch._grouped_mm(d_gu, stacked, offs=offs),
            lambda: grouped_gemm.linear_mx_sum([(d_gate, gate_t), (d_up, up_t)], counts),
        ),
    }


def _mx_wgrad_problem(rows, d_gu, offs, counts):
    """wgrad_gate_up_mx: (FLOPs, torch on the ragged rows' MXFP8 values, mok's K_GROUPED_MXFP8_TN on
    the same rows padded per segment to 256 as the schedule lays them, x read as its pair)."""
    padded = (counts + 255) // 256 * 256
    starts = torch.cumsum(padded, 0) - padded
    expert = torch.repeat_interleave(torch.arange(len(counts), device=rows.device), counts)
    within = torch.arange(rows.shape[0], device=rows.device) - (offs - counts)[expert]
    at = starts[expert] + within  # each received row's place in mok's layout
    total = int(padded.sum())
    source = torch.full((total,), -1, dtype=torch.int32, device=rows.device)
    source[at] = 0

    def laid_out(t: torch.Tensor) -> torch.Tensor:
        out = t.new_zeros((total, t.shape[1]))
        out[at] = t
        return out

    _, pair = mxfp8.mxfp8_round(laid_out(rows), transposed=True)
    values = mxfp8.mxfp8_dequantize(*pair).T[at].contiguous()  # the received rows' values
    d_gate, d_up = (laid_out(t) for t in _halves(d_gu))
    mx_pair = cuda_weight_grads_mx.MxRowsT(*pair)
    return (
        2 * rows.shape[0] * d_gu.shape[1] * rows.shape[1],
        lambda: torch._grouped_mm(d_gu.T, values, offs=offs),
        lambda: cuda_weight_grads_mx.weight_grads_mx(
            [(d_gate, mx_pair), (d_up, mx_pair)], padded.to(torch.int32), source
        ),
    )


def pass_gemms(timer: harness.Timer, rows, offs, gate_up, down, x, shared) -> dict:
    """One pass's GEMMs alone, back to back: {kernels: {"fwd": Timing, "bwd": Timing}}.

    The routed experts' GEMMs on this rank's received rows (`rows`, `offs`, gate_up, down as in
    `rates`) and, with `shared` = (gate_up [2I, H], down [H, I]), the shared expert's on the
    local tokens `x` (torch.mm): forward gate-up and down; backward d_h, d_x and the weight
    gradients (torch: gate and up stacked, as the baseline runs them), harness.flops's FLOPs.
    No communication, no elementwise work, operands of the right sizes with random values, timed
    with the host ahead of the GPU (as `rates`): what the passes' FLOPs cost on this GPU at the
    clock sustained load gives them, for "torch"
    (`_grouped_mm`, the baseline's kernels) and "mok" (mok's grouped GEMMs, where the module has
    them, launched as mok's passes launch them; the shared expert on torch.mm in both).
    """
    n, inter = rows.shape[0], down.shape[2]
    gen = torch.Generator(device=rows.device).manual_seed(n + 1)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, device=rows.device, generator=gen).bfloat16()

    h_rows, d_y, d_gu = randn(n, inter), randn(n, rows.shape[1]), randn(n, 2 * inter)
    counts = torch.diff(offs, prepend=offs.new_zeros(1)).to(torch.int32)
    kernels = {
        "torch": (
            lambda: (
                torch._grouped_mm(rows, gate_up.transpose(-2, -1), offs=offs),
                torch._grouped_mm(h_rows, down.transpose(-2, -1), offs=offs),
            ),
            lambda: (
                torch._grouped_mm(d_y, down, offs=offs),
                torch._grouped_mm(d_gu, gate_up, offs=offs),
                torch._grouped_mm(d_gu.T, rows, offs=offs),
                torch._grouped_mm(d_y.T, h_rows, offs=offs),
            ),
        ),  # fmt: skip
    }
    if grouped_gemm.available(rows.device):
        # mok's launches as its pass makes them: gate and up as two weights, d_x as two terms.
        w_gate, w_up = _halves(gate_up)
        d_gate, d_up = _halves(d_gu)
        kernels["mok"] = (
            lambda: (grouped_gemm.linear(rows, [w_gate, w_up], counts),
                     grouped_gemm.linear(h_rows, [down], counts)),
            lambda: (grouped_gemm.linear_transposed(d_y, down, counts, zero_rest=False),
                     grouped_gemm.linear_sum([(d_gate, w_gate), (d_up, w_up)], counts),
                     grouped_gemm.weight_grads([(d_gate, rows), (d_up, rows)], counts),
                     grouped_gemm.weight_grads([(d_y, h_rows)], counts)),
        )  # fmt: skip
    shared_fwd, shared_bwd = _shared_gemms(x, shared, randn)
    out: dict[str, dict] = {}
    with torch.no_grad():
        for name, (routed_fwd, routed_bwd) in kernels.items():
            out[name] = {
                "fwd": timer.measure(lambda f=routed_fwd: (shared_fwd(), f()), host_ahead=True),
                "bwd": timer.measure(lambda b=routed_bwd: (shared_bwd(), b()), host_ahead=True),
            }
    return out


def _shared_gemms(x: torch.Tensor, shared, randn):
    """(forward, backward) callables of the shared expert's GEMMs on x; no-ops without one."""
    if shared is None:
        return (lambda: None), (lambda: None)
    gate_up, down = shared
    tokens, inter = x.shape[0], down.shape[1]
    hidden, d_out, d_gu = randn(tokens, inter), randn(tokens, x.shape[1]), randn(tokens, 2 * inter)

    def forward():
        return x @ gate_up.T, hidden @ down.T

    def backward():
        return d_out @ down, d_gu @ gate_up, d_gu.T @ x, d_out.T @ hidden

    return forward, backward
