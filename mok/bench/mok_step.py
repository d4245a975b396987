"""mok through its public functional API (build_schedule, forward, backward), BF16 and MXFP8.

Same inputs, weights and FLOPs as the baseline (no swiglu clamp, shared expert as the shape says).
The forward time includes `build_schedule` (the routing all-gather and the schedule), because the
baseline's forward includes its routing exchange too. The backward consumes a forward context
without changing it, so one untimed forward serves every timed backward. MXFP8 weights are
quantized once, outside the timed region, with `mok.ops.mxfp8_quantize(w, True, True)`.

Whatever backend mok picks for the device (the CUDA kernels, or the reference where a kernel does
not exist yet) is what is timed; the run records which one it was (harness.environment).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from pathlib import Path

import torch

from mok import functional as F
from mok import ops
from mok.bench import harness


def capacity_multiplier(ep: int) -> float:
    """Schedule rows = multiplier * EP * T * k. Uniform routing sends each rank T * k routes on
    average with a spread of ~1% at these sizes, so 1/EP + 1/8 can never overflow in practice
    (an overflow would raise at check_status), while the default 0.5 would at EP 2."""
    return 1.0 / ep + 0.125


def _weight_forms(w: harness.Weights, mxfp8: bool) -> tuple[tuple, tuple]:
    """(forward, backward) forms of the routed weights, as API.md specifies them per mode."""
    if not mxfp8:
        dense = (w.gate, w.up, w.down)
        return dense, dense
    gate, up, down = (ops.mxfp8_quantize(t, True, True) for t in (w.gate, w.up, w.down))
    forward = (tuple(gate[:2]), tuple(up[:2]), tuple(down[:2]))
    backward = (tuple(gate), tuple(up), tuple(down[2:]))
    return forward, backward


class Step:
    """One shape's workspace, weights and inputs, ready to time: `forward(index)` (schedule +
    forward) and `backward(state)` for a state that `forward` returned."""

    def __init__(self, d: harness.Dist, shape: harness.Shape, sets: list, *, mxfp8: bool,
                 knobs: dict | None = None):  # fmt: skip
        self.sets = sets
        multiplier = capacity_multiplier(d.world)
        self.config = F.MoKConfig(schedule_capacity_multiplier=multiplier, **(knobs or {}))
        self.ws = F.create_workspace(
            self.config,
            d.group,
            device=d.device,
            num_local_tokens=shape.tokens,
            hidden_size=shape.hidden,
            topk=shape.topk,
        )
        self.experts = shape.experts
        w = harness.make_weights(shape, d.rank, d.device)
        self.shared = w.shared if w.shared is not None else (None, None, None)
        self.fwd_w, self.bwd_w = _weight_forms(w, mxfp8)
        self._step = itertools.count()

    def forward(self, index: int | None = None):
        i = next(self._step) % len(self.sets) if index is None else index
        inputs = self.sets[i]
        schedule = F.build_schedule(
            self.ws, self.config, inputs.top, num_local_experts=self.experts
        )
        out, ctx = F.forward(self.config, self.ws, schedule, inputs.x, inputs.rw, *self.shared,
                             *self.fwd_w)  # fmt: skip
        return i, schedule, out, ctx

    def backward(self, state):
        i, schedule, _, ctx = state
        inputs = self.sets[i]
        return F.backward(self.config, self.ws, schedule, ctx, inputs.grad, inputs.x, inputs.rw,
                          *self.shared, *self.bwd_w)  # fmt: skip


def run(
    d: harness.Dist, timer: harness.Timer, shape: harness.Shape, sets: list, *, mxfp8: bool,
    knobs: dict | None = None,
) -> dict:  # fmt: skip
    """Time forward (schedule + forward) and backward with MoKConfig speed `knobs`; return
    timings, set 0's outputs and, in `extra`, each pass's GPU busy time (harness.Timer.busy_ms;
    None on CPU) and the knobs."""
    step = Step(d, shape, sets, mxfp8=mxfp8, knobs=knobs)
    fwd = timer.measure(step.forward)
    state = step.forward(0)
    bwd = timer.measure(lambda: step.backward(state))
    busy = {"fwd": timer.busy_ms(step.forward), "bwd": timer.busy_ms(lambda: step.backward(state))}
    grads = step.backward(state)
    # One host sync, outside the timings: a capacity overflow or a bad expert id would have
    # made the numbers meaningless, so it fails the measurement instead.
    F.check_status(step.ws)
    extra = {"gpu_busy_ms": busy, "knobs": knobs}
    return {"fwd": fwd, "bwd": bwd, "outputs": _outputs(state[2], grads), "extra": extra}


def _outputs(out, grads) -> dict:
    """The compared outputs: the forward's output and the backward's five gradients."""
    names = ("d_x", "d_rw", "d_gate", "d_up", "d_down")
    return {"out": out, **dict(zip(names, grads[:5], strict=True))}


def run_bf16(d, timer, shape, sets, knobs=None) -> dict:
    return run(d, timer, shape, sets, mxfp8=False, knobs=knobs)


def run_mxfp8(d, timer, shape, sets, knobs=None) -> dict:
    return run(d, timer, shape, sets, mxfp8=True, knobs=knobs)


def run_bf16_foreground(d, timer, shape, sets, knobs=None) -> dict:
    """BF16 with every exchange in the foreground on all SMs (overlap_ctas=0): what running
    them in the background of the shared expert buys, measured in the same run."""
    return run(d, timer, shape, sets, mxfp8=False, knobs={**(knobs or {}), "overlap_ctas": 0})


class GraphStep:
    """Step's two passes, each captured once in a CUDA graph over static inputs (mok's step has
    no host sync, so it can be): a call copies its input set into them and replays the graph,
    as a CUDA-graphed training step does. What the eager step's host time costs is its time
    minus this one's, measured in the same run."""

    def __init__(self, d: harness.Dist, shape: harness.Shape, sets: list, *, mxfp8: bool,
                 knobs: dict | None = None):  # fmt: skip
        self.sets = sets
        self.static = harness.Inputs(*(t.clone() for t in dataclasses.astuple(sets[0])))
        step = Step(d, shape, [self.static], mxfp8=mxfp8, knobs=knobs)
        self.ws = step.ws
        for _ in range(2):  # module load, pointer tables, allocator, cuBLAS heuristics
            step.backward(step.forward(0))
        torch.cuda.synchronize()
        self.fwd_graph, self.bwd_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.fwd_graph):
            self.state = step.forward(0)
        with torch.cuda.graph(self.bwd_graph):
            self.grads = step.backward(self.state)
        self._step = itertools.count()

    def _load(self, inputs: harness.Inputs, names: tuple[str, ...]) -> None:
        for name in names:
            getattr(self.static, name).copy_(getattr(inputs, name))

    def forward(self, index: int | None = None) -> None:
        i = next(self._step) % len(self.sets) if index is None else index
        self._load(self.sets[i], ("x", "top", "rw"))
        self.fwd_graph.replay()

    def backward(self, index: int = 0) -> None:
        self._load(self.sets[index], ("grad",))
        self.bwd_graph.replay()


def run_bf16_graph(d, timer, shape, sets, knobs=None) -> dict:
    """BF16, each pass replayed from a CUDA graph (GraphStep): the step without host time."""
    return _run_graph(d, timer, shape, sets, mxfp8=False, knobs=knobs)


def run_mxfp8_graph(d, timer, shape, sets, knobs=None) -> dict:
    """MXFP8 (routed weights quantized once beforehand), each pass replayed from a CUDA graph."""
    return _run_graph(d, timer, shape, sets, mxfp8=True, knobs=knobs)


def _run_graph(d, timer, shape, sets, *, mxfp8: bool, knobs: dict | None = None) -> dict:
    if not d.cuda:
        name = "mok_mxfp8_cg" if mxfp8 else "mok_bf16_cg"
        raise RuntimeError(f"{name} replays CUDA graphs: it needs a GPU")
    step = GraphStep(d, shape, sets, mxfp8=mxfp8, knobs=knobs)
    fwd = timer.measure(step.forward)
    step.forward(0)
    bwd = timer.measure(step.backward)
    step.backward(0)
    F.check_status(step.ws)  # outside the timings, as in run()
    return {"fwd": fwd, "bwd": bwd, "outputs": _outputs(step.state[2], step.grads),
            "extra": {"knobs": knobs}}  # fmt: skip


# ------------------------------------------------------------------- shared by the profilers


def profiler_parser(doc: str, top: int | None) -> argparse.ArgumentParser:
    """The options of benchmarks/profile_*.py and host_stamps.py: --out, --shapes, --mxfp8, and
    --top (rows of each printed table) unless `top` is None (a script that prints no tables)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", nargs="+", default=list(harness.SHAPES))
    p.add_argument("--mxfp8", action="store_true")
    if top is not None:
        p.add_argument("--top", type=int, default=top, help="rows of each printed table")
    return p


def warm_step(d: harness.Dist, shape: harness.Shape, mxfp8: bool, steps: int) -> Step:
    """A Step on input set 0 after `steps` untimed steps (allocator, cuBLAS heuristics)."""
    step = Step(d, shape, [harness.make_inputs(shape, d, 0)], mxfp8=mxfp8)
    for _ in range(steps):
        step.backward(step.forward())
    return step


def write_report(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
