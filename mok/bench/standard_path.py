"""The standard unfused path, written the way users write it (the original's `bench_nccl_torch`).

Forward, per rank:

1. routing -> per-expert counts -> `all_to_all_single` of the counts, then ONE host sync
   (`.tolist()`) for every split size the token exchange needs;
2. `argsort` of the routes by global expert (so by destination rank, then local expert), gather
   of the token rows, `all_to_all_single` of the rows (`torch.distributed.nn.functional`'s,
   which is `dist.all_to_all_single` with an autograd backward);
3. local `argsort` of the received rows by local expert; `torch._grouped_mm` with int32 device
   `offs` for the fused gate-up projection (one [E, 2I, H] weight), SwiGLU, `_grouped_mm` down;
4. un-permute, reverse `all_to_all_single`, un-permute to `token * k + slot` order, and the
   router-weighted sum over the top-k in fp32; plus the shared expert as dense `mm`s.

Backward is PyTorch autograd through those same ops: torch 2.11 registers a derivative for
`aten::_grouped_mm` (autograd node `GroupedMmBackward0`: dgrad and wgrad are grouped GEMMs with
the same `offs`), the autograd `all_to_all_single` reverses the exchange with swapped splits and
the index gathers scatter back. It yields every gradient mok's backward returns: d_x,
d_router_weights, the routed and the shared weight gradients. `_grouped_mm` also runs on CPU in
torch 2.11, so the CPU smoke run executes this exact code.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_autograd
import torch.nn.functional as F

from mok.bench import gemms, harness

NAME = "nccl_torch"


@dataclass(frozen=True, slots=True)
class Plan:
    """How this step's routes travel. Permutations are int64 device tensors; splits host lists."""

    order: torch.Tensor  # routes sorted by global expert (the send order)
    inverse: torch.Tensor  # send order -> token * k + slot
    input_splits: list[int]  # rows sent to each rank
    output_splits: list[int]  # rows received from each rank
    local_order: torch.Tensor  # received rows sorted by local expert
    local_inverse: torch.Tensor
    offs: torch.Tensor  # int32 [E]: cumulative rows per local expert (grouped_mm groups)


@dataclass(frozen=True, slots=True)
class BaselineWeights:
    """Leaves that autograd fills: fused gate-up [E, 2I, H], down [E, H, I], shared or None."""

    gate_up: torch.Tensor
    down: torch.Tensor
    shared_gate_up: torch.Tensor | None
    shared_down: torch.Tensor | None

    def leaves(self) -> list[torch.Tensor]:
        return [
            t
            for t in (self.gate_up, self.down, self.shared_gate_up, self.shared_down)
            if t is not None
        ]


def prepare_weights(w: harness.Weights) -> BaselineWeights:
    """Gate and up stacked once, outside the timed region, as a model would store them."""
    gate_up = torch.cat([w.gate, w.up], dim=1).requires_grad_()
    down = w.down.clone().requires_grad_()
    if w.shared is None:
        return BaselineWeights(gate_up, down, None, None)
    s_gate_up = torch.cat([w.shared[0], w.shared[1]], dim=0).requires_grad_()
    return BaselineWeights(gate_up, down, s_gate_up, w.shared[2].clone().requires_grad_())


def _inverse(permutation: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(permutation.numel(), device=permutation.device)
    return torch.empty_like(permutation).scatter_(0, permutation, positions)


def routing_plan(top: torch.Tensor, num_local_experts: int, group: dist.ProcessGroup) -> Plan:
    """Counts exchange, the host sync for the split sizes, and the two permutations."""
    ep, experts = dist.get_world_size(group), num_local_experts
    flat = top.reshape(-1)
    # scatter_add_ rather than bincount: bincount with a device input syncs for its max.
    counts = torch.zeros(ep * experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)  # [source rank, local expert]
    send_splits = counts.view(ep, experts).sum(1)
    recv_splits = recv_counts.view(ep, experts).sum(1)
    sizes = torch.cat([send_splits, recv_splits]).tolist()  # the one host sync
    input_splits, output_splits = sizes[:ep], sizes[ep:]
    order = torch.argsort(flat, stable=True)
    # Received rows arrive grouped by source rank, inside that by local expert.
    expert_ids = torch.arange(experts, device=flat.device).repeat(ep)
    row_expert = expert_ids.repeat_interleave(recv_counts, output_size=sum(output_splits))
    local_order = torch.argsort(row_expert, stable=True)
    offs = torch.cumsum(recv_counts.view(ep, experts).sum(0), 0).to(torch.int32)
    return Plan(
        order,
        _inverse(order),
        input_splits,
        output_splits,
        local_order,
        _inverse(local_order),
        offs,
    )


def _swiglu_experts(rows: torch.Tensor, w: BaselineWeights, offs: torch.Tensor) -> torch.Tensor:
    gate_up = torch._grouped_mm(rows, w.gate_up.transpose(-2, -1), offs=offs)
    gate, up = gate_up.chunk(2, dim=-1)
    return torch._grouped_mm(F.silu(gate) * up, w.down.transpose(-2, -1), offs=offs)


def _exchange(rows: torch.Tensor, output_splits, input_splits, group) -> torch.Tensor:
    """all_to_all_single of token rows; its autograd backward is the reverse exchange."""
    out = rows.new_empty((sum(output_splits), rows.shape[1]))
    return dist_autograd.all_to_all_single(out, rows, output_splits, input_splits, group=group)


def moe_forward(
    inputs: harness.Inputs, x: torch.Tensor, rw: torch.Tensor, w: BaselineWeights, group, experts
) -> torch.Tensor:
    """out bf16 [T, H] = shared(x) + sum_k rw[:, k] * expert_{top[:, k]}(x)."""
    tokens, topk = inputs.top.shape
    plan = routing_plan(inputs.top, experts, group)
    send = x[plan.order // topk]
    recv = _exchange(send, plan.output_splits, plan.input_splits, group)
    y = _swiglu_experts(recv[plan.local_order], w, plan.offs)
    back = _exchange(y[plan.local_inverse], plan.input_splits, plan.output_splits, group)
    routed = back[plan.inverse].view(tokens, topk, -1)
    out = (routed.float() * rw.unsqueeze(-1)).sum(1)
    if w.shared_gate_up is not None:
        gate, up = (x @ w.shared_gate_up.T).chunk(2, dim=-1)
        out = out + (F.silu(gate) * up) @ w.shared_down.T
    return out.to(torch.bfloat16)


def grouped_mm_rates(timer: harness.Timer, inputs: harness.Inputs, w: BaselineWeights, group):
    """Each expert GEMM alone on this rank's received rows of one step, torch._grouped_mm and
    mok's kernels (gemms): the yardstick "each >= 90% of _grouped_mm"; and each pass's
    GEMMs alone, back to back (`gemm_pass`: the time its FLOPs take under sustained load)."""
    experts = w.down.shape[0]
    with torch.no_grad():
        plan = routing_plan(inputs.top, experts, group)
        send = inputs.x[plan.order // inputs.top.shape[1]]
        rows = _exchange(send, plan.output_splits, plan.input_splits, group)[plan.local_order]
        gate_up, down = w.gate_up.detach().contiguous(), w.down.detach().contiguous()
    extra = gemms.rates(timer, rows, plan.offs, gate_up, down)
    shared = None
    if w.shared_gate_up is not None:
        shared = (w.shared_gate_up.detach(), w.shared_down.detach())
    passes = gemms.pass_gemms(timer, rows, plan.offs, gate_up, down, inputs.x, shared)
    extra["gemm_pass"] = {
        kernels: {phase: asdict(timing) for phase, timing in timings.items()}
        for kernels, timings in passes.items()
    }
    return extra


def _leaves(inputs: harness.Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    return inputs.x.detach().requires_grad_(), inputs.rw.detach().requires_grad_()


def run(d: harness.Dist, timer: harness.Timer, shape: harness.Shape, sets: list) -> dict:
    """Time forward and backward; return the timings and set 0's outputs and gradients."""
    w = prepare_weights(harness.make_weights(shape, d.rank, d.device))
    leaves = [_leaves(inputs) for inputs in sets]
    step = itertools.count()

    def forward(index: int | None = None) -> tuple[torch.Tensor, int]:
        i = next(step) % len(sets) if index is None else index
        x, rw = leaves[i]
        return moe_forward(sets[i], x, rw, w, d.group, shape.experts), i

    def forward_for_backward() -> tuple[torch.Tensor, int]:
        for t in (*w.leaves(), *(v for pair in leaves for v in pair)):
            t.grad = None
        return forward()

    def backward(state: tuple[torch.Tensor, int]) -> None:
        out, i = state
        out.backward(sets[i].grad)

    fwd = timer.measure(forward)
    bwd = timer.measure(backward, setup=forward_for_backward)
    # Set 0 once more, untimed, for the checks (grads were left by the last timed backward).
    for t in (*w.leaves(), *leaves[0]):
        t.grad = None
    out, _ = forward(0)
    out.backward(sets[0].grad)
    gate, up = w.gate_up.grad.chunk(2, dim=1)
    outputs = {
        "out": out.detach(),
        "d_x": leaves[0][0].grad,
        "d_rw": leaves[0][1].grad,
        "d_gate": gate,
        "d_up": up,
        "d_down": w.down.grad,
    }
    extra = grouped_mm_rates(timer, sets[0], w, d.group)
    return {"fwd": fwd, "bwd": bwd, "outputs": outputs, "extra": extra}
