"""`mok tune`: sweep MoKConfig's knobs for one layer's sizes and write the fastest config.

    mok tune --hidden 4096 --inter 1536 --topk 8 --experts 16 --tokens 4096 [--ep 8] [--mxfp8]
        [--shared] [--out DIR] [--knobs NAME ...] [--budget-s 0.3]
    torchrun --nproc-per-node=N -m mok.cli tune ...     # one process per GPU, EP = N

In one process the EP group is `--ep` ranks on one device (mok.testing.OneDeviceGroup: HBM stands
in for NVLink, every rank's GEMMs share the GPU); under torchrun each process is one rank on its
own GPU. Sizes are per rank, as MoKConfig and the workspace take them (E: local experts).

The sweep is a coordinate descent from the defaults: each knob in turn takes every value of its
candidates with the others at the best found so far, and keeps the fastest (forward + backward)
where it beats the current value by `--min-gain` (2%), so that noise does not move a knob.
A point's time is the median of its forward and backward, each replayed from a CUDA graph (on a
GPU; eager on CPU), on the slowest rank. A knob changes speed, never bits: every point's outputs
(every rank's forward output and gradients) must equal the first point's bit for bit, and the run
fails if one does not. DIR gets `config.json` (the fastest MoKConfig, for MoKConfig.from_json),
`sweep.jsonl` (every point) and `sweep.png` (one panel per knob; needs matplotlib); each point's
rows in the results table's schema (system `mok_<precision>_tune`) go to `--rows`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from mok import functional as F
from mok.bench import harness, mok_step, one_gpu, results
from mok.bench.progress import Progress
from mok.bench.shapes import Shape
from mok.config import MoKConfig

# Candidate values of each knob (the defaults among them). grouped_gemm is not swept: its
# alternatives are other GEMM implementations, held to the reference by tolerance, not to bits.
# The sweep starts with the dispatch overlapped (overlap_dispatch, which gives the comm SMs and
# the minibatch their effect) and tries it off last, against the knobs tuned for it.
CANDIDATES = {
    "overlap_ctas": (0, 16, 32, 64, 96, 128),
    "fwd_num_comm_sms": (2, 4, 8, 16, 24, 32, 40, 48, 64),
    "bwd_num_comm_sms": (2, 4, 8, 16, 20, 28, 36, 48),
    "minibatch_size": (256, 512, 1024, 2048, 4096, 8192),
    "macrobatch_size": (16384, 32768, 65536, 131072),
    "all_gather_top_experts_chunk_bytes": (512, 1024, 2048, 4096, 8192),
    "overlap_dispatch": (True, False),
}


def positive_int(text: str) -> int:
    """argparse's type for a count: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    sizes = p.add_argument_group("the layer, per rank")
    for name, meaning in (("hidden", "H"), ("inter", "I, the expert's intermediate size"),
                          ("topk", "k, experts per token"), ("experts", "E, local experts"),
                          ("tokens", "T, tokens")):  # fmt: skip
        sizes.add_argument(f"--{name}", type=positive_int, required=True, help=meaning)
    sizes.add_argument("--shared", action="store_true", help="with a shared expert")
    p.add_argument("--ep", type=positive_int,
                   help="ranks on this one device (default 1; under torchrun: N)")  # fmt: skip
    p.add_argument("--mxfp8", action="store_true", help="MXFP8 routed experts (default BF16)")
    every = ", ".join(CANDIDATES)
    p.add_argument("--knobs", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES),
                   metavar="NAME", help=f"the knobs to sweep (default: {every})")  # fmt: skip
    p.add_argument("--min-gain", type=float, default=0.02,
                   help="a knob moves only for a point this much faster")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("mok-tune"), help="directory of the results")
    p.add_argument("--rows", type=Path,
                   help="append each point's rows (the results table's schema) to this file "
                        "(default: DIR/rows.jsonl)")  # fmt: skip
    p.add_argument("--budget-s", type=float, default=0.3, help="timed seconds per pass and point")
    p.add_argument("--max-iters", type=positive_int, default=20,
                   help="iterations per pass and point")  # fmt: skip
    p.add_argument("--cpu", action="store_true", help="on CPU (the reference backend, gloo)")


def same_bits(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    """Whether the tensors are the same bits, one for one (compared where they are: copying a
    group's gradients to the host would take longer than timing them)."""
    return len(got) == len(want) and all(
        a.shape == b.shape and a.dtype == b.dtype
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
        for a, b in zip(got, want, strict=True)
    )  # fmt: skip


def _not_none(tensors) -> list[torch.Tensor]:
    return [t for t in tensors if t is not None]


class GroupOnOneDevice:
    """The EP group as ranks of this process (one_gpu.GroupStep); its config is swapped per
    point, its workspaces and inputs stay."""

    def __init__(self, d: harness.Dist, shape: Shape, ranks: int, mxfp8: bool):
        self.d, self.step = d, one_gpu.GroupStep(d, shape, ranks, mxfp8)

    def use(self, config: MoKConfig) -> None:
        self.step.config = config

    def outputs(self) -> list[torch.Tensor]:
        group = self.step.group
        outs, grads = group.run(self.step.forward), group.run(self.step.backward)
        group.run(lambda rank, ws: F.check_status(ws))  # an overflow voids the point
        return [*outs, *(g for per_rank in grads for g in _not_none(per_rank))]

    def passes(self):
        if self.d.cuda:
            fwd, bwd = self.step.graphs()
            return fwd.replay, bwd.replay
        group = self.step.group
        return (lambda: group.run(self.step.forward)), (lambda: group.run(self.step.backward))


class RankProcess:
    """This process as one rank of a torchrun group (mok_step.Step)."""

    def __init__(self, d: harness.Dist, shape: Shape, mxfp8: bool):
        self.d = d
        self.step = mok_step.Step(d, shape, [harness.make_inputs(shape, d, 0)], mxfp8=mxfp8)

    def use(self, config: MoKConfig) -> None:
        self.step.config = config

    def outputs(self) -> list[torch.Tensor]:
        state = self.step.forward(0)
        grads = self.step.backward(state)
        F.check_status(self.step.ws)
        return [state[2], *_not_none(grads)]

    def passes(self):
        state = self.step.forward(0)
        if not self.d.cuda:
            return (lambda: self.step.forward(0)), (lambda: self.step.backward(state))
        self.step.backward(state)
        torch.cuda.synchronize()
        fwd, bwd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(fwd):
            self._graph_state = self.step.forward(0)
        with torch.cuda.graph(bwd):
            self.step.backward(self._graph_state)
        return fwd.replay, bwd.replay


def candidates(knob: str, best: MoKConfig, sms: int | None) -> list[MoKConfig]:
    """The configs of `knob`'s sweep around `best`: each value that makes a valid config
    (comm SMs within the device's; a macrobatch a multiple of the minibatch)."""
    configs = []
    for value in CANDIDATES[knob]:
        if knob.endswith("comm_sms") and sms is not None and value > sms:
            continue
        try:
            configs.append(dataclasses.replace(best, **{knob: value}))
        except ValueError:
            continue
    return configs


class Sweep:
    """The coordinate descent: every point measured, the best config so far, the bits seen."""

    def __init__(self, runner, timer: harness.Timer, base: MoKConfig, min_gain: float,
                 on_point=None):  # fmt: skip
        """`on_point(point)` is called as each point is measured."""
        self.runner, self.timer, self.best, self.min_gain = runner, timer, base, min_gain
        self.on_point = on_point or (lambda point: None)
        self.points: list[dict] = []
        self.timings: list[dict[str, harness.Timing]] = []  # per point: {"fwd": .., "bwd": ..}
        self.reference: list[torch.Tensor] | None = None  # the first point's outputs

    def measure(self, knob: str, config: MoKConfig) -> dict:
        self.runner.use(config)
        outputs = self.runner.outputs()
        if self.reference is None:
            self.reference = [t.clone() for t in outputs]
        differs = not same_bits(outputs, self.reference)
        del outputs
        same = self.timer.agree_max(float(differs)) == 0.0
        fwd, bwd = self.runner.passes()
        timings = {"fwd": self.timer.measure(fwd), "bwd": self.timer.measure(bwd)}
        self.timings.append(timings)
        fwd_ms, bwd_ms = timings["fwd"].median_ms, timings["bwd"].median_ms
        point = {"knob": knob, "value": getattr(config, knob), "fwd_ms": fwd_ms,
                 "bwd_ms": bwd_ms, "total_ms": fwd_ms + bwd_ms, "same_bits": same,
                 "config": dataclasses.asdict(config)}  # fmt: skip
        self.points.append(point)
        return point

    def knob(self, knob: str, sms: int | None, progress: Progress) -> None:
        """Every candidate of `knob`; the fastest becomes the best config if it beats the
        current value's time by min_gain (run-to-run noise must not move a knob)."""
        measured = []
        for config in candidates(knob, self.best, sms):
            point = self.measure(knob, config)
            self.on_point(point)
            measured.append((point["total_ms"], config))
            progress.step(f"{knob}={point['value']}: {point['total_ms']:.3f} ms")
        fastest_ms, fastest = min(measured, key=lambda pair: pair[0])
        current = [ms for ms, config in measured if config == self.best]
        if not current or fastest_ms < current[0] * (1 - self.min_gain):
            self.best = fastest
        chosen = getattr(self.best, knob)
        for point in self.points[-len(measured) :]:
            point["chosen"] = point["value"] == chosen


def _shape(args) -> Shape:
    return Shape("tune", hidden=args.hidden, inter=args.inter, topk=args.topk,
                 experts=args.experts, tokens=args.tokens, shared=args.shared)  # fmt: skip


def _runner(args, d: harness.Dist, shape: Shape):
    """The group to time, and its EP size."""
    if d.world > 1 and args.ep not in (None, d.world):
        raise ValueError(f"--ep {args.ep}: under torchrun the EP group is the {d.world} ranks")
    ep = d.world if d.world > 1 else args.ep or 1
    if shape.topk > shape.experts * ep:
        raise ValueError(f"--topk {shape.topk} picks more experts than the group holds "
                         f"(--experts x EP = {shape.experts * ep})")  # fmt: skip
    if d.world > 1:
        return RankProcess(d, shape, args.mxfp8), ep
    return GroupOnOneDevice(d, shape, ep, args.mxfp8), ep


def _total(args, sms: int | None) -> int:
    base = MoKConfig()
    return sum(len(candidates(k, base, sms)) for k in args.knobs)


def tune(args) -> int:
    """The sweep; rank 0 writes DIR/config.json, sweep.jsonl and sweep.png. 1 if a point's
    bits differed from the first's."""
    d = harness.setup_distributed(cpu=args.cpu, timeout_s=300.0)
    try:
        shape = _shape(args)
        runner, ep = _runner(args, d, shape)
        sms = torch.cuda.get_device_properties(d.device).multi_processor_count if d.cuda else None
        timer = harness.Timer(d, warmup_s=0.05, budget_s=args.budget_s, max_iters=args.max_iters)
        context = _context(args, d, shape, ep)
        env = harness.environment(d)
        if d.rank == 0:  # a new sweep.jsonl, filled as the points come
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "sweep.jsonl").write_text("")
        base = dataclasses.replace(runner.step.config, overlap_dispatch=True)
        sweep = Sweep(runner, timer, base, args.min_gain,
                      lambda point: _append(args, d, context, point))  # fmt: skip
        with Progress(_total(args, sms), "tune", enabled=d.rank == 0) as progress:
            for knob in args.knobs:
                sweep.knob(knob, sms, progress)
        if d.rank == 0:
            results.append(args.rows or args.out / "rows.jsonl", _rows(args, env, context, sweep))
            _write(args, context, sweep)
    finally:
        torch.distributed.destroy_process_group()
    return 0 if all(p["same_bits"] for p in sweep.points) else 1


def _rows(args, env: dict, context: dict, sweep: Sweep) -> list[dict]:
    """Every point as rows of the results table (system mok_<precision>_tune, the point's config
    in `config`)."""
    precision = "mxfp8" if args.mxfp8 else "bf16"
    shape, ep, ranks_share_gpu = Shape(**context["shape"]), context["ep"], context["processes"] == 1
    rows = []
    for point, timings in zip(sweep.points, sweep.timings, strict=True):
        note = f"mok tune: {point['knob']}={point['value']}"
        if ranks_share_gpu:
            note += f"; {one_gpu.NOTE.format(n=ep)}"
        for row in one_gpu.rows(env, shape, ep, precision, timings, None,
                                system=f"mok_{precision}_tune", note=note,
                                ranks_share_gpu=ranks_share_gpu):  # fmt: skip
            rows.append({**row, "config": point["config"]})
    return rows


def _context(args, d: harness.Dist, shape: Shape, ep: int) -> dict:
    """What every row of sweep.jsonl says about the run."""
    return {"shape": dataclasses.asdict(shape), "ep": ep, "mxfp8": args.mxfp8,
            "gpu": torch.cuda.get_device_name(d.device) if d.cuda else "CPU",
            "processes": d.world}  # fmt: skip


def _append(args, d: harness.Dist, context: dict, point: dict) -> None:
    """A point into sweep.jsonl as soon as it is measured (a run cut short keeps its points;
    the finished run rewrites the file with the kept values marked)."""
    if d.rank != 0:
        return
    with (args.out / "sweep.jsonl").open("a") as rows:
        rows.write(json.dumps({**context, **point}) + "\n")


def _write(args, context: dict, sweep: Sweep) -> None:
    (args.out / "config.json").write_text(sweep.best.to_json())
    shape, ep = Shape(**context["shape"]), context["ep"]
    with (args.out / "sweep.jsonl").open("w") as rows:
        for point in sweep.points:
            rows.write(json.dumps({**context, **point}) + "\n")
    differing = [f"{p['knob']}={p['value']}" for p in sweep.points if not p["same_bits"]]
    verdict = "same bits at every point" if not differing else f"BITS DIFFER at {differing}"
    first, last = sweep.points[0]["total_ms"], min(p["total_ms"] for p in sweep.points)
    print(f"{len(sweep.points)} points, {verdict}; fastest {last:.3f} ms (fwd + bwd) against "
          f"{first:.3f} ms at the first point")  # fmt: skip
    print(f"config: {args.out / 'config.json'}")
    try:
        from mok.bench import chart
    except ImportError as error:
        print(f"no chart: {error} (pip install 'mok[cli]' or matplotlib)")
        return
    precision = "MXFP8" if args.mxfp8 else "BF16"
    title = (f"mok tune: H {shape.hidden}, I {shape.inter}, k {shape.topk}, E {shape.experts}, "
             f"T {shape.tokens}, EP {ep}, {precision}, {context['gpu']}")  # fmt: skip
    print(f"chart: {chart.plot_sweep(sweep.points, title, args.out / 'sweep.png')}")
