"""Each expert GEMM alone: mok's grouped GEMM kernels against `torch._grouped_mm` on the same
problem (the same rows, segments and weights) in the same run, as TFLOP/s per rank.

Problems (R received rows in E ragged segments, H hidden, I intermediate):
| name       | torch                                   | mok (mok.backends.cuda_gemm)      |
|------------|-----------------------------------------|-----------------------------------|
| gate_up    | rows @ [E, 2I, H]^T -> bf16 [R, 2I]     | linear, one [E, 2I, H] weight     |
| down       | hidden @ [E, H, I]^T -> bf16 [R, H]     | linear                            |
| dgrad_down | d_y @ [E, H, I] -> bf16 [R, I]          | linear_transposed (fp32 out)      |
| wgrad_down | d_y^T @ hidden per segment -> [E, H, I] | weight_grads                      |

Each timed call runs the GEMM REPEATS times back to back, for both systems: the GPU queue stays
fed as in a real step, so the rate is the kernels' and not the host's launch latency (mok's
launch goes through Python, torch's through C++). The mok columns are absent where the GPU's
module has no grouped GEMMs (not sm_90a).
"""

from __future__ import annotations

import harness
import torch

from mok.backends import cuda_gemm

REPEATS = 5


def rates(timer: harness.Timer, rows: torch.Tensor, offs: torch.Tensor, gate_up, down) -> dict:
    """rows bf16 [R, H]; offs int32 [E] cumulative segment ends; gate_up [E, 2I, H]; down
    [E, H, I] (bf16, contiguous)."""
    n, hidden, inter = rows.shape[0], rows.shape[1], down.shape[2]
    counts = torch.diff(offs, prepend=offs.new_zeros(1)).to(torch.int32)
    gen = torch.Generator(device=rows.device).manual_seed(n)
    h_rows = torch.randn(n, inter, device=rows.device, generator=gen).bfloat16()
    d_y = torch.randn(n, hidden, device=rows.device, generator=gen).bfloat16()
    mok = cuda_gemm.available(rows.device)
    problems = {
        "gate_up": (
            2 * n * 2 * inter * hidden,
            lambda: torch._grouped_mm(rows, gate_up.transpose(-2, -1), offs=offs),
            lambda: cuda_gemm.linear(rows, [gate_up], counts),
        ),
        "down": (
            2 * n * hidden * inter,
            lambda: torch._grouped_mm(h_rows, down.transpose(-2, -1), offs=offs),
            lambda: cuda_gemm.linear(h_rows, [down], counts),
        ),
        "dgrad_down": (
            2 * n * hidden * inter,
            lambda: torch._grouped_mm(d_y, down, offs=offs),
            lambda: cuda_gemm.linear_transposed(d_y, down, counts),
        ),
        "wgrad_down": (
            2 * n * hidden * inter,
            lambda: torch._grouped_mm(d_y.T, h_rows, offs=offs),
            lambda: cuda_gemm.weight_grads([(d_y, h_rows)], counts),
        ),
    }
    out: dict[str, float] = {"grouped_mm_rows": n}

    def tflops(flop: int, fn) -> float:
        ms = timer.measure(lambda: [fn() for _ in range(REPEATS)]).median_ms
        return REPEATS * flop / ms / 1e9

    with torch.no_grad():
        for name, (flop, torch_fn, mok_fn) in problems.items():
            baseline = tflops(flop, torch_fn)
            out[f"grouped_mm_{name}_tflops"] = baseline
            if mok:
                mine = tflops(flop, mok_fn)
                out[f"mok_gemm_{name}_tflops"] = mine
                out[f"mok_gemm_{name}_vs_grouped_mm"] = mine / baseline
    return out
