"""Float64 oracles for the MoE layer, written from the contract and sharing no code with mok.

- `dense(name, ep)`: the layer's math exactly (DESIGN.md §4), per token and route:
  out[t] = shared(x_t) + sum_k rw[t, k] * expert_{e(t, k)}(x_t), SwiGLU experts
  W_d (silu(min(W_g x, L)) * clamp(W_u x, -L, L)), expert e on rank e // E; gradients by
  torch.autograd. What bf16 storage costs is the tolerance of the tests that use it.
- `rounded(name, ep)`: the same math in float64, but rounded to bf16 (fp32 for d_h and the
  router-scaled d_h the SwiGLU backward reads) and MX-quantized exactly where the table in
  mok/experts.py says a kernel stores or quantizes a tensor, with the routed rows of each expert
  in the documented schedule order (MXFP8 weight gradients quantize blocks of 32 schedule rows).
  What is left is fp32-vs-float64 accumulation, so the tests that use it are tight. It is
  the contract a CUDA kernel is held to.

Each oracle returns, per rank, {"out": [T, H], "grads": {name: tensor}} in float64 (GRAD_NAMES;
None for an absent shared expert).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from moe_scenarios import GRAD_NAMES, LOCAL_EXPERTS, SCENARIOS, TOPK, make_inputs

MX_BLOCK, E4M3_MAX = 32, 448.0


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float | None) -> torch.Tensor:
    """silu(min(gate, L)) * clamp(up, -L, L); clamp's gradient is zero where it is active."""
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return F.silu(gate) * up


def expected_schedule(top: torch.Tensor, ep: int, dest: int) -> list[list[tuple[int, int]]]:
    """Per local expert of rank `dest`, its routes as (source rank, token * k + slot): the j-th
    route of every source before the (j+1)-th of any, sources in rank order, each source's
    routes in token * k + slot order (DESIGN.md §4; reference.schedule's docstring)."""
    segments = []
    for local in range(LOCAL_EXPERTS):
        expert = dest * LOCAL_EXPERTS + local
        queues = [
            (top[src].reshape(-1) == expert).nonzero().flatten().tolist() for src in range(ep)
        ]
        depth = max(len(q) for q in queues)
        segments.append(
            [(src, q[i]) for i in range(depth) for src, q in enumerate(queues) if i < len(q)]
        )
    return segments


# ------------------------------------------------------------------------ dense + autograd


def _expert(x, gate_w, up_w, down_w, limit):
    return swiglu(x @ gate_w.T, x @ up_w.T, limit) @ down_w.T


def _routed(x_r, top_r, rw_r, routed, limit, ep):
    """sum_k rw[t, k] * expert_{e(t, k)}(x_t) for one rank's tokens, route by route."""
    total = torch.zeros_like(x_r)
    for slot in range(TOPK):
        ids = top_r[:, slot]
        expert_out = torch.zeros_like(x_r)
        for expert in ids.unique().tolist():
            if not 0 <= expert < ep * LOCAL_EXPERTS:
                continue  # an invalid id: its route contributes nothing
            owner, local = divmod(expert, LOCAL_EXPERTS)
            rows = (ids == expert).nonzero().flatten()
            weights = [routed[name][owner][local] for name in ("gate", "up", "down")]
            expert_out = expert_out.index_put((rows,), _expert(x_r[rows], *weights, limit))
        total = total + rw_r[:, slot, None] * expert_out
    return total


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.double().requires_grad_()


def _grad(leaf: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(leaf) if leaf.grad is None else leaf.grad


@functools.cache
def dense(name: str, ep: int) -> list[dict]:
    scenario, inputs = SCENARIOS[name], make_inputs(name, ep)
    x, rw = _leaf(inputs["x"]), _leaf(inputs["rw"])
    # One leaf per rank and weight: each rank owns its experts' slice and its own replica of the
    # shared expert, so every gradient comes out per rank, as mok returns it.
    routed = {
        k: [_leaf(inputs[k][r * LOCAL_EXPERTS : (r + 1) * LOCAL_EXPERTS]) for r in range(ep)]
        for k in ("gate", "up", "down")
    }
    shared = [[_leaf(w) for w in inputs["shared"]] for _ in range(ep)] if scenario.shared else None
    outs = []
    for r in range(ep):
        out = _routed(x[r], inputs["top"][r], rw[r], routed, scenario.limit, ep)
        if shared:
            out = out + _expert(x[r], *shared[r], scenario.limit)
        outs.append(out)
    torch.autograd.backward(outs, [g.double() for g in inputs["grad"]])
    results = []
    for r in range(ep):
        grads = [x.grad[r], rw.grad[r], *(_grad(routed[k][r]) for k in ("gate", "up", "down"))]
        grads += [_grad(w) for w in shared[r]] if shared else [None] * 3
        results.append(
            {"out": outs[r].detach(), "grads": dict(zip(GRAD_NAMES, grads, strict=True))}
        )
    return results


# ------------------------------------------------------------------------ rounded like the table


def bf16(t: torch.Tensor) -> torch.Tensor:
    """Round to bf16 (a stored tensor), keep computing in float64."""
    return t.to(torch.bfloat16).double()


def fp32(t: torch.Tensor) -> torch.Tensor:
    """Round to fp32 (a tensor the table keeps in fp32), keep computing in float64."""
    return t.float().double()


def mx(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """MXFP8 quantize-dequantize along `dim` (OCP MX, DESIGN.md §4): per 32 elements a scale
    2^clamp(ceil(log2(amax / 448)), -127, 127), elements E4M3 round-to-nearest-even, saturated.
    Rows past a multiple of 32 along `dim` are treated as zero padding."""
    scale, blocks, length = _mx_blocks(t.movedim(dim, -1))
    # The operands are bf16 values, exact in fp32, whose fp32 -> E4M3 cast rounds to nearest even.
    elements = (blocks / scale).clamp(-E4M3_MAX, E4M3_MAX).float().to(torch.float8_e4m3fn)
    dequantized = (elements.double() * scale).flatten(-2)[..., :length]
    return dequantized.movedim(-1, dim)


def _mx_blocks(t: torch.Tensor):
    """(each block's scale [..., blocks, 1], t's blocks of 32 along its last dim, t's length)."""
    length = t.shape[-1]
    blocks = F.pad(t, (0, -length % MX_BLOCK)).unflatten(-1, (-1, MX_BLOCK))
    amax = blocks.abs().amax(-1, keepdim=True)
    exponent = torch.ceil(torch.log2(amax / E4M3_MAX)).clamp(-127, 127)
    return torch.where(amax > 0, torch.exp2(exponent), 1.0), blocks, length


# E4M3's non-negative finite values in ascending order (codes 0x00-0x7E).
E4M3_GRID = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).double()


def mx_saved(t: torch.Tensor, limit: float, both_signs: bool) -> torch.Tensor:
    """mx(t) as the forward saves gate (`both_signs` False) and up for the backward's clamp:
    an element whose nearest E4M3 value lies across L from it (gate: on the other side of L;
    up: of |x| = L) takes E4M3's next value on its own side instead, in its block's scale."""
    nearest = mx(t)
    value, stored = (t.abs(), nearest.abs()) if both_signs else (t, nearest)
    limit_32 = float(torch.tensor(limit, dtype=torch.float32))
    up = (value > limit_32) & (stored <= limit_32)
    down = (value <= limit_32) & (stored > limit_32)
    scale, _, length = _mx_blocks(t)
    scale = scale.expand(*scale.shape[:-1], MX_BLOCK).flatten(-2)[..., :length]
    index = torch.searchsorted(E4M3_GRID, nearest.abs() / scale)
    moved = E4M3_GRID[(index + up.long() - down.long()).clamp(0, len(E4M3_GRID) - 1)] * scale
    return torch.where(up | down, torch.sign(t) * moved, nearest)


def _keep(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return t


def _swiglu_vjp(gate, up, d_hidden, limit):
    gate, up = gate.detach().requires_grad_(), up.detach().requires_grad_()
    return torch.autograd.grad(swiglu(gate, up, limit), (gate, up), d_hidden)


def _expert_forward(x, weights, limit, q):
    gate_w, up_w, down_w = weights
    xq = q(x)
    gate, up = bf16(xq @ q(gate_w).T), bf16(xq @ q(up_w).T)
    hidden = bf16(swiglu(gate, up, limit))
    return gate, up, hidden, bf16(q(hidden) @ q(down_w).T)


def _expert_backward(x, d_out, rw, saved, weights, limit, q):
    """(d_x, d_rw, d_W_gate, d_W_up, d_W_down) of one expert's rows (schedule order)."""
    gate, up, hidden, _ = saved
    gate_w, up_w, down_w = weights
    d_h = fp32(q(d_out) @ q(down_w.T).T)
    hidden_rows = q(hidden, 0)
    d_rw = (d_h * hidden_rows).sum(-1)
    saved_gate, saved_up = q(gate), q(up)
    if q is mx and limit is not None:  # the saved pairs keep their side of the clamp
        saved_gate, saved_up = mx_saved(gate, limit, False), mx_saved(up, limit, True)
    d_scaled = fp32(rw[:, None] * d_h)
    d_gate, d_up = (bf16(d) for d in _swiglu_vjp(saved_gate, saved_up, d_scaled, limit))
    d_x = bf16(q(d_gate) @ q(gate_w.T).T + q(d_up) @ q(up_w.T).T)
    if q is _keep:  # BF16 scales hidden's rows, MXFP8 d_out's (the table in mok/experts.py)
        d_w_down = d_out.T @ bf16(rw[:, None] * hidden)
    else:
        d_w_down = q(bf16(rw[:, None] * d_out), 0).T @ hidden_rows
    x_rows = q(x, 0)
    d_w = (q(d_gate, 0).T @ x_rows, q(d_up, 0).T @ x_rows, d_w_down)
    return d_x, d_rw, *(bf16(w) for w in d_w)


def _routed_rounded(inputs, scenario, ep, q):
    """Per-route y, d_x, d_rw [EP, T, k, ...] and the routed weight gradients [EP*E, ...]."""
    x, d_out, rw = (inputs[k].double() for k in ("x", "grad", "rw"))
    y = torch.zeros(*rw.shape, x.shape[-1], dtype=torch.float64)
    d_x, d_rw = torch.zeros_like(y), torch.zeros_like(rw)
    d_w = {k: torch.zeros_like(inputs[k], dtype=torch.float64) for k in ("gate", "up", "down")}
    for dest in range(ep):
        for local, segment in enumerate(expected_schedule(inputs["top"], ep, dest)):
            if not segment:
                continue
            expert = dest * LOCAL_EXPERTS + local
            src, flat = (torch.tensor(column) for column in zip(*segment, strict=True))
            tok, slot = flat // TOPK, flat % TOPK
            weights = [inputs[k][expert].double() for k in ("gate", "up", "down")]
            saved = _expert_forward(x[src, tok], weights, scenario.limit, q)
            grads = _expert_backward(
                x[src, tok], d_out[src, tok], rw[src, tok, slot], saved, weights, scenario.limit, q
            )
            y[src, tok, slot], d_x[src, tok, slot], d_rw[src, tok, slot] = saved[3], *grads[:2]
            for k, grad in zip(("gate", "up", "down"), grads[2:], strict=True):
                d_w[k][expert] = grad
    return y, d_x, d_rw, d_w


def _shared_rounded(x, d_out, shared, limit):
    """The shared expert: always BF16 rounding points, router weight 1."""
    weights = [w.double() for w in shared]
    saved = _expert_forward(x, weights, limit, _keep)
    ones = torch.ones(x.shape[0], dtype=torch.float64)
    d_x, _, *d_w = _expert_backward(x, d_out, ones, saved, weights, limit, _keep)
    return saved[3], d_x, d_w


@functools.cache
def rounded(name: str, ep: int) -> list[dict]:
    return rounded_for(SCENARIOS[name], make_inputs(name, ep), ep)


def rounded_for(scenario, inputs: dict, ep: int) -> list[dict]:
    """`rounded` for any scenario's inputs (moe_scenarios.inputs_for)."""
    q = mx if scenario.mode == "mxfp8" else _keep
    y, d_x_routes, d_rw, d_w = _routed_rounded(inputs, scenario, ep, q)
    rw = inputs["rw"].double()
    results = []
    for r in range(ep):
        out, d_x, shared_grads = torch.zeros_like(y[r, :, 0]), torch.zeros_like(y[r, :, 0]), None
        if scenario.shared:
            x, d_out = inputs["x"][r].double(), inputs["grad"][r].double()
            out, d_x, shared_grads = _shared_rounded(x, d_out, inputs["shared"], scenario.limit)
        out = bf16(out + (rw[r, :, :, None] * y[r]).sum(1))
        d_x = bf16(d_x + d_x_routes[r].sum(1))
        experts = slice(r * LOCAL_EXPERTS, (r + 1) * LOCAL_EXPERTS)
        grads = [d_x, d_rw[r], *(d_w[k][experts] for k in ("gate", "up", "down"))]
        grads += shared_grads or [None] * 3
        results.append({"out": out, "grads": dict(zip(GRAD_NAMES, grads, strict=True))})
    return results


# ------------------------------------------------------------------------ comparisons


def relative_l1(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """sum |actual - expected| / sum |expected| (inf if expected is 0 and actual is not)."""
    diff = (actual.double() - expected.double()).abs().sum().item()
    scale = expected.double().abs().sum().item()
    return diff / scale if scale else (0.0 if diff == 0 else float("inf"))


def worst_row_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest relative_l1 of one row (token): small rows count as much as large ones."""
    rows = zip(actual.flatten(1), expected.flatten(1), strict=True)
    return max((relative_l1(a, e) for a, e in rows), default=0.0)


def mismatch(
    actual, expected, *, rel: float, max_abs: float | None = None, row_rel: float | None = None
) -> str | None:
    """None when `actual` is within tolerance of `expected`, else what is wrong."""
    if actual.shape != expected.shape:
        return f"shape {list(actual.shape)}, expected {list(expected.shape)}"
    error = relative_l1(actual, expected)
    worst = (actual.double() - expected.double()).abs().max().item()
    row_error = worst_row_error(actual, expected) if row_rel is not None else 0.0
    if error <= rel and worst <= (max_abs or worst) and row_error <= (row_rel or row_error):
        return None
    return (
        f"sum|diff|/sum|ref| = {error:.3g} (limit {rel:g}), max|diff| = {worst:.3g}"
        f" (limit {max_abs}), worst row's sum|diff|/sum|ref| = {row_error:.3g} (limit {row_rel}),"
        f" max|ref| = {expected.double().abs().max().item():.3g}"
    )


def check_ranks(actuals, expecteds, what: str, **tolerance) -> None:
    """Compare every rank and report all ranks that fail, not just the first."""
    failures = [
        f"rank {rank} {what}: {problem}"
        for rank, (actual, expected) in enumerate(zip(actuals, expecteds, strict=True))
        if (problem := mismatch(actual, expected, **tolerance)) is not None
    ]
    assert not failures, "\n".join(failures)


def same_bits(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Bitwise equality (so -0.0 != 0.0 and NaN == NaN of the same payload)."""
    if a is None or b is None:
        return a is None and b is None
    same_layout = a.dtype == b.dtype and a.shape == b.shape
    return same_layout and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    )


def zero_bits(t: torch.Tensor) -> bool:
    """Every element is +0.0 exactly (all bits clear)."""
    return bool((t.contiguous().view(torch.uint8) == 0).all())
