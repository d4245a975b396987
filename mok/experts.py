"""The experts stage: the grouped SwiGLU MLP forward and backward, BF16 and MXFP8, written once
over a GEMM engine (ExpertEngine): the reference backend's masked fp32 products (MaskedGemms) and
the CUDA backend's grouped GEMMs run the same math.

Rows are grouped by local expert in 256-row padded segments (`row_expert[i]` is the local expert
of row i, -1 past `num_tokens`); padding rows are zero, so they contribute exact zeros everywhere.
Every product accumulates in fp32 and is rounded to bf16 exactly where a kernel stores a tensor:

| stored tensor     | BF16 mode                   | MXFP8 mode (q(v) = dequant(quant(v)))   |
|-------------------|-----------------------------|-----------------------------------------|
| gate, up          | bf16(x @ W^T)               | bf16(q_H(x) @ q_H(W)^T), saved as MXFP8*|
| hidden            | bf16(silu(min(g,L))*clamp u)| same; saved transposed as MXFP8         |
| y (expert output) | bf16(hidden @ W_d^T)        | bf16(q_I(hidden) @ q_I(W_d)^T)          |
| d_h (unscaled)    | d_out @ W_d                 | q_H(d_out) @ q_H(W_d^T)^T               |
| d_router_weight   | sum_I d_h * hidden          | sum_I d_h * q_T(hidden)                 |
| d_gate, d_up      | bf16(SwiGLU' of rw * d_h)   | same, from the saved MXFP8 gate and up  |
| d_x               | bf16(d_gate @ W_g + d_up @ W_u) | bf16(q_I(d_gate) @ q_I(W_g) + ...)  |
| d_W_gate, d_W_up  | bf16(d_gate^T x)            | bf16(q_T(d_gate)^T q_T(x))              |
| d_W_down          | bf16(d_out^T bf16(rw * hidden)) | bf16(q_T(bf16(rw * d_out))^T q_T(hidden)) |

*on the clamp's side with a limit (mxfp8.keep_limit_side; docs/mxfp8.md, "The clamp's side").
q_H / q_I quantize along the hidden / intermediate dim (the GEMM's reduction dim), q_T along
rows (tokens), the reduction dim of the weight gradients. The shared expert is always BF16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mok import mxfp8


def row_experts(tokens_per_expert: torch.Tensor, num_tokens: torch.Tensor, rows: int):
    """Local expert of each schedule row (int64 [rows]); -1 past the padded total."""
    ends = torch.cumsum(tokens_per_expert.to(torch.int64), 0)
    index = torch.arange(rows, device=ends.device)
    expert = torch.searchsorted(ends, index, right=True)
    return torch.where(index < num_tokens.to(torch.int64), expert, -1)


def grouped_linear(a: torch.Tensor, weight: torch.Tensor, row_expert: torch.Tensor):
    """fp32 `a[i] @ weight[row_expert[i]]^T` for a [R, K], weight [E, N, K]; 0 where it is -1."""
    out = torch.zeros(a.shape[0], weight.shape[1], dtype=torch.float32, device=a.device)
    for expert in range(weight.shape[0]):
        rows = (row_expert == expert)[:, None]
        out = torch.where(rows, a.float() @ weight[expert].float().T, out)
    return out


def grouped_weight_grad(d_out: torch.Tensor, a: torch.Tensor, row_expert, num_experts: int):
    """fp32 `sum over rows of expert e: d_out[i]^T a[i]` -> [E, N, K], in fixed row order.
    Both operands are masked to the expert's rows: a non-finite value in another expert's row
    must not reach this expert's gradient through 0 * NaN."""
    grads = []
    d_out, a = d_out.float(), a.float()
    for expert in range(num_experts):
        rows = (row_expert == expert)[:, None]
        grads.append(torch.where(rows, d_out, 0.0).T @ torch.where(rows, a, 0.0))
    return torch.stack(grads)


class ExpertEngine:
    """The interface the expert math is written against, with the torch forms defined once.

    An engine offers `linear(a, weight)` (a [R, K] @ weight[e]^T per row's expert, weight
    [E, N, K]; fp32, or bf16 where a kernel stores bf16), `weight_grad(d_out, a)` ([E, N, K]),
    `quantize(t, normal, transposed)` (the MXFP8 quantizer) and `num_experts`. Engines with
    kernels of their own override the rest: `linears` (several weights, one A), `linear_sum`
    (two products summed in fp32), `weight_grads` (several gradients of one shape),
    `gate_up_swiglu` (the forward's gate and up GEMMs and SwiGLU), the elementwise steps
    `swiglu`, `swiglu_backward`, `scale_rows` and `dequantize`, and the MXFP8
    steps `mx_round`, `mx_round_rows`, `mx_round_both` and `swiglu_mxfp8`, whose forms here make
    several passes that a kernel can make in one; engines whose GEMMs read MXFP8 operands as
    stored keep the pairs in `mx_weight`, `mx_weight_t`, `mx_swiglu_input` and `mx_rows_t`.
    """

    num_experts: int
    # Whether `mx_weight` keeps MXFP8 weights as stored (the GEMMs read them) or dequantizes.
    mx_weights_as_stored = False

    @staticmethod
    def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float | None) -> torch.Tensor:
        return swiglu(gate, up, limit).to(torch.bfloat16)

    @staticmethod
    def swiglu_backward(d_h, rw, gate, up, hidden, limit: float | None, *, scale_hidden=False,
                        hidden_grad=True):  # fmt: skip
        """(d_router_weight fp32, d_gate, d_up, d_hidden bf16) from the unscaled fp32 d_h, and
        with `scale_hidden` also `scale_rows(hidden, rw)`: the BF16 down weight gradient's
        rows, which a kernel writes while it reads hidden for d_router_weight. Not
        `hidden_grad`: d_hidden is None (a kernel does not write it)."""
        d_router_weight = (d_h * hidden.float()).sum(-1)
        d_scaled = rw[:, None] * d_h
        d_gate, d_up = swiglu_backward(d_scaled, gate, up, limit)
        d_hidden = d_scaled.to(torch.bfloat16) if hidden_grad else None
        bf16 = [d_gate.to(torch.bfloat16), d_up.to(torch.bfloat16), d_hidden]
        if scale_hidden:
            bf16.append(ExpertEngine.scale_rows(hidden, rw))
        return (d_router_weight, *bf16)

    @staticmethod
    def scale_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return (weight[:, None] * x.float()).to(torch.bfloat16)

    @staticmethod
    def dequantize(data: torch.Tensor, scales: torch.Tensor, transposed: bool = False):
        """An MXFP8 pair's values (fp32 here; engines whose GEMMs read bf16 may return bf16),
        with the last two dims swapped when `transposed` (a view here; kernels write it)."""
        values = mxfp8.dequantize(data, scales)
        return values.transpose(-2, -1) if transposed else values

    def mx_weight(self, pair):
        """An MXFP8 (data, scales) weight as this engine's `linear` takes it: its values."""
        return _dequant(pair, self)

    def mx_swiglu_input(self, pair):
        """The forward's saved MXFP8 gate or up (a normal pair) as this engine's
        `swiglu_backward` takes it: its values."""
        return _dequant(pair, self)

    def mx_weight_t(self, pair):
        """W^T for a weight's transposed MXFP8 pair (data_t [E, N, K], blocks along K) as the
        backward's `linear` (d_h, fp32) and `linear_sum` (d_x) take it: its values [E, N, K]."""
        return _dequant(pair, self)

    def mx_rows_t(self, pair):
        """The forward's saved x as its row-blocked transposed MXFP8 pair (data_t [K, R]) as
        this engine's `weight_grads` take it: its values [R, K]."""
        return _dequant(pair, self, transposed=True)

    def mx_round(self, t: torch.Tensor) -> torch.Tensor:
        """The values an MXFP8 GEMM sees for `t` quantized along its last dim."""
        data, scales, _, _ = self.quantize(t.to(torch.bfloat16), True, False)
        return self.dequantize(data, scales)

    def mx_round_rows(
        self, t: torch.Tensor, row_weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The values for `t` [R, C] quantized in blocks of 32 rows (the wgrad operands); with
        `row_weight` (fp32 [R]), for `scale_rows(t, row_weight)`."""
        if row_weight is not None:
            t = self.scale_rows(t, row_weight)
        _, _, data_t, scales_t = self.quantize(t.to(torch.bfloat16), False, True)
        return self.dequantize(data_t, scales_t, transposed=True)

    def mx_round_both(self, t: torch.Tensor):
        """`mx_round(t)` and t's row-blocked MXFP8 pair (for a weight gradient) from one
        quantizer pass: the kernel writes both layouts of the same blocks, bit for bit as two
        passes would."""
        data, scales, data_t, scales_t = self.quantize(t.to(torch.bfloat16), True, True)
        return self.dequantize(data, scales), (data_t, scales_t)

    def swiglu_mxfp8(self, gate: torch.Tensor, up: torch.Tensor, limit: float | None):
        """The MXFP8 forward's SwiGLU step on bf16 gate and up: (mx_round(hidden), hidden's
        row-blocked pair, gate's and up's MXFP8 pairs), the last three saved for backward."""
        hidden = self.swiglu(gate, up, limit)
        hidden_q, hidden_t = self.mx_round_both(hidden)
        gate_q = self.quantize(gate, True, False)[:2]
        up_q = self.quantize(up, True, False)[:2]
        if limit is not None:  # the backward's clamp decision must be the forward's
            gate_q = mxfp8.keep_limit_side(gate_q, gate, limit, both_signs=False)
            up_q = mxfp8.keep_limit_side(up_q, up, limit, both_signs=True)
        return hidden_q, hidden_t, gate_q, up_q

    def linears(self, a: torch.Tensor, weights) -> list[torch.Tensor]:
        return [self.linear(a, w) for w in weights]

    def gate_up_swiglu(self, a: torch.Tensor, w_gate, w_up, limit: float | None):
        """(gate, up, hidden) bf16: the gate and up GEMMs, then `swiglu` of their bf16 values."""
        gate, up = (t.to(torch.bfloat16) for t in self.linears(a, (w_gate, w_up)))
        return gate, up, self.swiglu(gate, up, limit)

    def linear_sum(self, terms) -> torch.Tensor:
        (a1, w1), (a2, w2) = terms
        return self.linear(a1, w1).float() + self.linear(a2, w2).float()

    def weight_grads(self, pairs) -> list[torch.Tensor]:
        return [self.weight_grad(d_out, a) for d_out, a in pairs]


class MaskedGemms(ExpertEngine):
    """The reference's expert GEMMs: one masked fp32 product per expert (slow, exact zeros)."""

    def __init__(self, row_expert: torch.Tensor, num_experts: int):
        self.row_expert, self.num_experts = row_expert, num_experts

    def linear(self, a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return grouped_linear(a, weight, self.row_expert)

    def weight_grad(self, d_out: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return grouped_weight_grad(d_out, a, self.row_expert, self.num_experts)

    @staticmethod
    def quantize(t: torch.Tensor, normal: bool, transposed: bool):
        return mxfp8.quantize(t, normal, transposed)


def _clamped(gate: torch.Tensor, up: torch.Tensor, limit: float | None):
    if limit is None:
        return gate, up
    return gate.clamp(max=limit), up.clamp(-limit, limit)


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float | None) -> torch.Tensor:
    """fp32 silu(min(gate, L)) * clamp(up, -L, L)."""
    g, u = _clamped(gate.float(), up.float(), limit)
    return F.silu(g) * u


def swiglu_backward(d_hidden, gate, up, limit: float | None):
    """fp32 (d_gate, d_up); gradients are zero where the clamp was active."""
    g, u = _clamped(gate.float(), up.float(), limit)
    sig = torch.sigmoid(g)
    d_gate = d_hidden * u * (sig * (1 + g * (1 - sig)))
    d_up = d_hidden * g * sig
    if limit is not None:
        d_gate = torch.where(gate.float() <= limit, d_gate, 0.0)
        d_up = torch.where(up.float().abs() <= limit, d_up, 0.0)
    return d_gate, d_up


def _dequant(pair, gemm, transposed: bool = False) -> torch.Tensor:
    data, scales = pair
    return gemm.dequantize(data, scales, transposed)


def forward_bf16(x_rows, w_gate, w_up, w_down, gemm, limit, pull=None):
    """(gate, up, hidden, y), all bf16 [R, I] / [R, H]. `pull`: the dispatch that writes
    `x_rows`, for the gate/up GEMM to run beside itself (engine.pull_beside), or None."""
    beside = {} if pull is None else {"pull": pull}
    gate, up, hidden = gemm.gate_up_swiglu(x_rows, w_gate, w_up, limit, **beside)
    y = gemm.linear(hidden, w_down).to(torch.bfloat16)
    return gate, up, hidden, y


def mxfp8_weights(w_gate, w_up, w_down, gemm):
    """What the MXFP8 forward's GEMMs read for its (fp8, scale) weight pairs: `gemm.mx_weight`
    of each (its values, blocks along the reduction dim; engines whose GEMMs read MXFP8 as
    stored keep the pair). They need nothing from the exchange, so a pass can compute them
    while its dispatch runs."""
    return tuple(gemm.mx_weight(w) for w in (w_gate, w_up, w_down))


def forward_mxfp8(x_rounded, weights, gemm, limit):
    """MXFP8 forward on `weights` = mxfp8_weights(...) and `x_rounded` = (xq, x_t) =
    gemm.mx_round_both(x_rows), the routed rows' rounding and transposed pair (engines compute
    it with the dispatch: pull_rounded). Returns the saved MXFP8 tensors and y.

    Output: (x_t, gate_q, up_q, hidden_t, y) where x_t/hidden_t are transposed (fp8, scale)
    pairs (blocks along rows, for the weight gradients) and gate_q/up_q normal pairs.
    """
    w_gate, w_up, w_down = weights
    saved, hidden_q = saved_mxfp8(x_rounded, w_gate, w_up, gemm, limit)
    y = gemm.linear(hidden_q, w_down).to(torch.bfloat16)
    return *saved, y


def saved_mxfp8(x_rounded, w_gate, w_up, gemm, limit):
    """The MXFP8 forward up to the down GEMM (what a backward recomputes of the rows the
    forward did not keep: mok.macrobatch): ((x_t, gate_q, up_q, hidden_t), hidden_q)."""
    xq, x_t = x_rounded
    gate, up = (t.to(torch.bfloat16) for t in gemm.linears(xq, (w_gate, w_up)))
    hidden_q, hidden_t, gate_q, up_q = gemm.swiglu_mxfp8(gate, up, limit)
    return (x_t, gate_q, up_q, hidden_t), hidden_q


def backward_bf16(d_out_rows, rw_rows, x_rows, gate, up, hidden, weights, gemm, limit,
                  pull=None, op_outputs=True):  # fmt: skip
    """Backward of one expert group. weights = (W_gate, W_up, W_down) bf16; rw_rows None means
    every row's weight is 1 (the shared expert: its d_out feeds the down wgrad unscaled).
    `pull`: the reverse dispatch that writes `d_out_rows`, for the d_h GEMM to run beside
    itself (engine.pull_beside), or None. `op_outputs`: d_hidden too, as the original's fused
    op returns it; otherwise (the functional API, which returns none) d_hidden is None and no
    pass writes it.

    Returns ((d_x, d_router_weight, d_gate, d_up, d_hidden), weight_grads): the data gradients
    now, and a `WeightGrads`, which runs the weight-gradient GEMMs when called and returns
    (d_W_gate, d_W_up, d_W_down) bf16, so a caller can send the data gradients on their way first.
    """
    w_gate, w_up, w_down = weights
    beside = {} if pull is None else {"pull": pull}
    d_h = gemm.linear(d_out_rows, w_down.transpose(1, 2), **beside)
    dgrad_weights = (w_gate.transpose(1, 2), w_up.transpose(1, 2))
    return _backward_tail(
        d_h, d_out_rows, rw_rows, x_rows, gate, up, hidden, dgrad_weights, gemm, limit, False,
        op_outputs,
    )  # fmt: skip


def mxfp8_backward_inputs(ctx, weights, gemm):
    """The values the MXFP8 backward reads besides d_out: ctx = (x_t, gate_q, up_q, hidden_t)
    as saved by forward_mxfp8 and weights = ((W_g fp8, sc, fp8_t, sc_t), (W_u ...), (W_d fp8_t,
    sc_t)): x as `gemm.mx_rows_t` gives it (only the weight gradients read it), hidden
    dequantized (the SwiGLU backward reads its values too), gate and up as
    `gemm.mx_swiglu_input` and the weights' transposed pairs as `gemm.mx_weight_t` give them.
    They need nothing from the exchange, so a pass can compute them while its pulls run.
    Returns (W_d^T, (W_g^T, W_u^T), x, gate, up, hidden)."""
    x_t, gate_q, up_q, hidden_t = ctx
    (_, _, g_t, g_t_sc), (_, _, u_t, u_t_sc), down_t = weights
    down, gate_t, up_t = (gemm.mx_weight_t(pair) for pair in (down_t, (g_t, g_t_sc), (u_t, u_t_sc)))
    activations = (
        gemm.mx_rows_t(x_t),
        gemm.mx_swiglu_input(gate_q),
        gemm.mx_swiglu_input(up_q),
        _dequant(hidden_t, gemm, transposed=True),
    )
    return (down, (gate_t, up_t), *activations)


def mx_round_d_out(gemm, d_out_rows, rw_rows):
    """The two forms the MXFP8 backward reads d_out's rows in: (q_H(d_out), the d_h GEMM's
    operand; q_T(bf16(rw * d_out)), d_W_down's), as rounded values (engines compute them with
    the pull: pull_rounded_rows)."""
    return gemm.mx_round(d_out_rows), gemm.mx_round_rows(d_out_rows, rw_rows)


def backward_mxfp8(d_out_rounded, rw_rows, inputs, gemm, limit, op_outputs=True):
    """MXFP8 backward on `inputs` = mxfp8_backward_inputs(...) and `d_out_rounded` =
    mx_round_d_out(gemm, d_out_rows, rw_rows). Returns as `backward_bf16`."""
    d_out_q, d_y_rows = d_out_rounded
    down, dgrad_weights, x_rows, gate, up, hidden = inputs
    d_h = gemm.linear(d_out_q, down)
    return _backward_tail(
        d_h, d_y_rows, rw_rows, x_rows, gate, up, hidden, dgrad_weights, gemm, limit, True,
        op_outputs,
    )  # fmt: skip


def _backward_tail(d_h, d_out, rw, x, gate, up, hidden, dgrad_weights, gemm, limit, mx,
                   op_outputs):  # fmt: skip
    """Shared part of both backward modes, from the unscaled d_h = d_out @ W_down;
    `dgrad_weights` = (W_gate^T, W_up^T) as `linear_sum` takes them ([E, H, I]). `d_out`: the
    rows d_W_down reads, in MXFP8 already weighted and rounded (mx_round_d_out's second).
    `op_outputs`: as `backward_bf16`'s."""
    w_gate_t, w_up_t = dgrad_weights
    unit = rw is None
    if unit:
        rw = d_h.new_ones(d_h.shape[0], dtype=torch.float32)
    # BF16 puts rw on hidden's rows instead of d_out's for d_W_down (the same sum; [rows, I]
    # moved instead of [rows, H]), written by the SwiGLU backward, which reads hidden anyway.
    scale_hidden = not (mx or unit)
    d_router_weight, d_gate, d_up, d_hidden, *scaled = gemm.swiglu_backward(
        d_h, rw, gate, up, hidden, limit, scale_hidden=scale_hidden, hidden_grad=op_outputs
    )
    dgrad_in = (gemm.mx_round(d_gate), gemm.mx_round(d_up)) if mx else (d_gate, d_up)
    dgrad_terms = ((dgrad_in[0], w_gate_t), (dgrad_in[1], w_up_t))
    d_x = gemm.linear_sum(dgrad_terms).to(torch.bfloat16)
    weight_grads = WeightGrads(gemm, (d_gate, d_up, d_out), x,
                               scaled[0] if scale_hidden else hidden, mx)  # fmt: skip
    return (d_x, d_router_weight, d_gate, d_up, d_hidden), weight_grads


class WeightGrads:
    """The weight gradients (d_W_gate, d_W_up, d_W_down) bf16 of one backward, computed when
    called. `hidden` is d_W_down's other operand: in BF16 hidden's rows already scaled by the
    router weights (the SwiGLU backward writes them), in MXFP8 hidden itself; in MXFP8 the
    d_out in `grads` is d_W_down's rounded operand as mx_round_d_out gives it. `prepare()` runs
    the elementwise passes the MXFP8 inputs need first (the row-blocked roundings of d_gate and
    d_up), so a pass can enqueue those beside a background exchange and the GEMMs after it;
    calling prepares whatever is not yet."""

    def __init__(self, gemm, grads, x, hidden, mx: bool):
        self.gemm, self.grads, self.mx = gemm, grads, mx
        self.x, self.hidden = x, hidden
        self._inputs = None

    def prepare(self) -> None:
        if self._inputs is not None:
            return
        d_gate, d_up, d_out = self.grads
        if self.mx:  # d_out is q_T(bf16(rw * d_out)) already
            rounded = tuple(self.gemm.mx_round_rows(t) for t in (d_gate, d_up))
            self._inputs = (*rounded, d_out, self.hidden)
            return
        self._inputs = (d_gate, d_up, d_out.to(torch.bfloat16), self.hidden)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.prepare()
        d_gate, d_up, d_y, hidden = self._inputs
        d_w_gate, d_w_up = self.gemm.weight_grads(((d_gate, self.x), (d_up, self.x)))
        d_w_down = self.gemm.weight_grad(d_y, hidden)
        return tuple(t.to(torch.bfloat16) for t in (d_w_gate, d_w_up, d_w_down))
