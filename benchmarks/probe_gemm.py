"""One expert GEMM alone, for ncu at its fixed clock or a quick timing at the power cap.

    python3 benchmarks/probe_gemm.py --shape qwen3.5 --gemm down --system mxfp8_nt [--time]

    ncu --metrics sm__cycles_elapsed.max,smsp__inst_executed.sum -k regex:^device_kernel$ \\
        --launch-skip 2 --launch-count 1 python3 benchmarks/probe_gemm.py ...

The problem is a shape's (`mok.bench.shapes`) per-rank experts with `rows_per_expert` rows each:
`gate` multiplies [rows, H] by W [E, I, H]^T, `down` [rows, I] by W [E, H, I]^T. The weight is
quantized once (mok's `mxfp8_quantize`), and every system multiplies the same values: `mxfp8_nt`
reads the E4M3 pair as stored (`grouped_gemm.linear_mx`), `bf16_nt` (`grouped_gemm.linear`) and
`torch` (`torch._grouped_mm`) its `mxfp8_dequantize` bf16 values. Without `--time` the GEMM is
launched `--launches` times (ncu profiles the last with the command above: mok's grouped GEMMs and
`_grouped_mm` are both CUTLASS `device_kernel`s); with it, the median of 30 timings of 5
back-to-back launches (CUDA events) and its TFLOP/s are printed. docs/grouped-gemm.md's cycle
counts come from ncu this way: its clock is fixed, so cycles compare across processes and sessions
(M_GROUPED_MXFP8_NT on Qwen3.5's down: 882.2 K, 883.5 K, 884.1 K in three sessions' runs), while a
timing at the power cap follows the GPU's state, which the processes run before it leave behind.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from mok.bench import harness, shapes

SYSTEMS = ("mxfp8_nt", "bf16_nt", "torch")
GEMMS = ("gate", "down")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(shapes.SHAPES), required=True)
    p.add_argument("--gemm", choices=GEMMS, required=True)
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--launches", type=int, default=3, help="launches without --time (default 3)")
    p.add_argument("--time", action="store_true", help="print the median time and TFLOP/s")
    args = p.parse_args(argv)
    if args.launches < 1:
        p.error(f"--launches must be >= 1, got {args.launches}")
    return args


def dims(shape: shapes.Shape, gemm: str) -> tuple[int, int, int, int]:
    """(experts, rows per expert, K, N) of the problem."""
    k, n = (shape.hidden, shape.inter) if gemm == "gate" else (shape.inter, shape.hidden)
    return shape.experts, int(shape.rows_per_expert), k, n


def problem(shape: shapes.Shape, gemm: str, system: str):
    """(FLOPs, a callable that launches the GEMM once) on fresh unit-normal operands."""
    from mok.backends.cuda import grouped_gemm, mxfp8

    experts, rows, k, n = dims(shape, gemm)
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn((experts * rows, k), generator=gen, device="cuda").bfloat16()
    w = (torch.randn((experts, n, k), generator=gen, device="cuda") / k**0.5).bfloat16()
    data, scales, _, _ = mxfp8.mxfp8_quantize(w, True, False)
    values = mxfp8.mxfp8_dequantize(data, scales)
    counts = torch.full((experts,), rows, dtype=torch.int32, device="cuda")
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    mx = grouped_gemm.MxWeight(data, scales)
    launch = {
        "mxfp8_nt": lambda: grouped_gemm.linear_mx(a, [mx], counts),
        "bf16_nt": lambda: grouped_gemm.linear(a, [values], counts),
        "torch": lambda: torch._grouped_mm(a, values.transpose(-2, -1), offs=offs),
    }[system]
    return 2 * experts * rows * k * n, launch


def median_ms(launch, timings: int = 30, repeats: int = 5) -> float:
    """Median over `timings` of the mean time of `repeats` back-to-back launches, after 20."""
    for _ in range(20):
        launch()

    def launches() -> None:
        for _ in range(repeats):
            launch()

    return statistics.median(harness.local_ms(launches) / repeats for _ in range(timings))


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_gemm: needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2
    flop, launch = problem(shapes.SHAPES[args.shape], args.gemm, args.system)
    record = {"shape": args.shape, "gemm": args.gemm, "system": args.system, "flop": flop,
              "gpu": torch.cuda.get_device_name()}  # fmt: skip
    if args.time:
        ms = median_ms(launch)
        record |= {"median_ms": ms, "tflops": flop / ms / 1e9}
    else:
        for _ in range(args.launches):
            launch()
        torch.cuda.synchronize()
        record["launches"] = args.launches
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
