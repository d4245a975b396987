"""N ranks of an EP group on one GPU (mok.testing.OneDeviceGroup): the whole group's passes, timed.

    torchrun --standalone --nproc-per-node=1 -m mok.bench.one_gpu --out FILE.jsonl
        [--ranks 1 2 4 8] [--shapes qwen3-235b] [--precisions bf16 mxfp8]

HBM stands in for NVLink here, and every rank's GEMMs share one GPU: this measures mok's
multi-rank machinery (routing all-gather, barriers, schedules, pulls and pushes between the ranks'
workspaces, the status exchange), not EP speed. Each rank has the shape's per-rank sizes (its T
tokens, E experts); the forward (schedule + forward) and the backward of all ranks are captured in
one CUDA graph each and replayed, so the host's threads are not timed. `median_ms` is one replay of
the whole group and `tflops` counts every rank's FLOPs. `vs_baseline` is N x (the 1-rank group's
time) / (the N-rank group's time), from the same run: 1.0 means N ranks cost what N single-rank
steps cost back to back; below 1 is the price of the exchanges and barriers.

Rows: system `mok_bf16_1gpu_cg` / `mok_mxfp8_1gpu_cg`, `ep` = N, `gpu_count` 1, and a note saying
that the ranks shared one GPU (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist

from mok import functional as F
from mok.bench import harness, mok_step, results
from mok.bench.shapes import SHAPES, flops
from mok.testing import OneDeviceGroup

NOTE = "{n} ranks on one GPU (mok.testing.OneDeviceGroup): HBM stands in for NVLink"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON-lines file the rows go to")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["qwen3-235b"])
    p.add_argument("--precisions", nargs="+", choices=["bf16", "mxfp8"], default=["bf16"])
    p.add_argument("--budget-s", type=float, default=1.0, help="timed seconds per measurement")
    p.add_argument("--max-iters", type=int, default=50)
    return p.parse_args(argv)


class GroupStep:
    """Every rank's step on a one-GPU group: weights and inputs per rank, and the two passes
    captured in one CUDA graph each."""

    def __init__(self, d: harness.Dist, shape, ranks: int, mxfp8: bool):
        self.config = F.MoKConfig(schedule_capacity_multiplier=mok_step.capacity_multiplier(ranks))
        self.group = OneDeviceGroup(ranks, self.config, device=d.device,
                                    num_local_tokens=shape.tokens, hidden_size=shape.hidden,
                                    topk=shape.topk)  # fmt: skip
        self.experts = shape.experts
        self.inputs, self.forms, self.shared = [], [], []
        for rank in range(ranks):
            rank_d = harness.Dist(rank, ranks, d.device, d.group)
            self.inputs.append(harness.make_inputs(shape, rank_d, 0))
            weights = harness.make_weights(shape, rank, d.device)
            self.forms.append(mok_step._weight_forms(weights, mxfp8))
            self.shared.append(weights.shared or (None, None, None))
        self.contexts: list = [None] * ranks

    def forward(self, rank: int, ws):
        inputs, (fwd_w, _) = self.inputs[rank], self.forms[rank]
        schedule = F.build_schedule(ws, self.config, inputs.top, num_local_experts=self.experts)
        out, ctx = F.forward(self.config, ws, schedule, inputs.x, inputs.rw, *self.shared[rank],
                             *fwd_w)  # fmt: skip
        self.contexts[rank] = (schedule, ctx)
        return out

    def backward(self, rank: int, ws):
        inputs, (_, bwd_w), (schedule, ctx) = (
            self.inputs[rank],
            self.forms[rank],
            self.contexts[rank],
        )
        return F.backward(self.config, ws, schedule, ctx, inputs.grad, inputs.x, inputs.rw,
                          *self.shared[rank], *bwd_w)  # fmt: skip

    def graphs(self) -> tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph]:
        """(forward, backward) of every rank, each warmed up eagerly once, then captured."""
        self.group.run(self.forward)
        self.group.run(self.backward)
        self.group.run(lambda rank, ws: F.check_status(ws))  # an overflow voids the numbers
        torch.cuda.synchronize()
        fwd, bwd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        self.group.capture(fwd, self.forward)
        self.group.capture(bwd, self.backward)
        return fwd, bwd


def measure(d, timer, shape, ranks: int, precision: str) -> dict:
    step = GroupStep(d, shape, ranks, precision == "mxfp8")
    fwd_graph, bwd_graph = step.graphs()
    return {"fwd": timer.measure(fwd_graph.replay), "bwd": timer.measure(bwd_graph.replay)}


def rows(env, shape, ranks, precision, timings, single, *, system=None, note=None,
         ranks_share_gpu=True) -> list[dict]:  # fmt: skip
    """Table rows of one measurement (results.py's schema); `single`: the 1-rank timings.
    `system` and `note` default to this module's; `ranks_share_gpu=False`: the ranks were
    processes with a GPU each (mok tune under torchrun), so a row's FLOPs and GPU count are one
    rank's."""
    context = results.context(env, None, ranks)
    flops_ranks = ranks if ranks_share_gpu else 1
    out = []
    for phase, count in zip(results.PASSES, flops(shape), strict=True):
        ref = single[phase].median_ms * ranks if single and single[phase].median_ms else None
        base = {**context, "system": system or f"mok_{precision}_1gpu_cg",
                "precision": precision, "pass": phase, "shape": shape.name,
                "hidden": shape.hidden, "inter": shape.inter, "topk": shape.topk,
                "experts": shape.experts, "tokens": shape.tokens,
                "shared": shape.shared}  # fmt: skip
        if ranks_share_gpu:
            base["gpu_count"] = 1
        row = results.timed(base, dataclasses.asdict(timings[phase]), count * flops_ranks, None,
                            ref)  # fmt: skip
        out.append({**row, "gpu_busy_ms": None, "check": None,
                    "note": note or NOTE.format(n=ranks)})  # fmt: skip
    return out


@dataclasses.dataclass
class Measured:
    rows: list[dict]
    single: dict | None  # the timings, kept as the baseline of larger groups
    summary: str


def _measured_rows(d, timer, env, shape, ranks: int, precision: str, single) -> Measured:
    """One group size's rows; a failure (out of memory, say) becomes rows with no timings and
    the error as their note, so the sizes after it still run."""
    try:
        timings = measure(d, timer, shape, ranks, precision)
    except Exception as error:  # recorded in the table, as run.py records a failed system
        message = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        empty = {p: harness.Timing(None, None, None, 0, 0) for p in results.PASSES}
        table = rows(env, shape, ranks, precision, empty, None)
        for row in table:
            row["note"] = f"{row['note']}; failed: {message}"
        return Measured(table, None, f"failed: {message}")
    finally:
        torch.cuda.empty_cache()
    table = rows(env, shape, ranks, precision, timings, single)
    summary = ", ".join(
        f"{r['pass']} {r['median_ms']:.3f} ms (x{r['vs_baseline'] or 1.0:.3f} of 1-rank steps)"
        for r in table
    )
    return Measured(table, timings, summary)


def main(argv=None) -> int:
    args = parse_args(argv)
    d = harness.setup_distributed(cpu=False, timeout_s=120.0)
    try:
        if dist.get_world_size() != 1:
            raise SystemExit("one_gpu.py runs in one process: --nproc-per-node=1")
        timer = harness.Timer(d, warmup_s=0.3, budget_s=args.budget_s, max_iters=args.max_iters)
        env = harness.environment(d)
        for name in args.shapes:
            for precision in args.precisions:
                single = None
                for ranks in sorted(args.ranks):
                    table = _measured_rows(d, timer, env, SHAPES[name], ranks, precision, single)
                    single = table.single if ranks == 1 else single
                    results.append(args.out, table.rows)
                    print(f"{name} {precision} {ranks} ranks on one GPU: {table.summary}",
                          flush=True)  # fmt: skip
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
