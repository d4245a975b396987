"""The routed experts' engines on CUDA (mok.experts.ExpertEngine).

HopperGemms runs mok's grouped GEMMs (mok.backends.cuda.grouped_gemm: TMA + wgmma, sm_90a) over the
schedule's 256-row expert segments, sized on the device, so a step needs no host sync. Modules
without those kernels (Blackwell), or MOK_GROUPED_GEMM=torch, get GroupedGemms:
`torch._grouped_mm` the same way. In MXFP8 mode the operands are the dequantized MXFP8 values,
which bf16 holds exactly, so the numerics are those of the reference's table; mok's GEMMs read
the weights as stored and convert them to those bf16 values inside the GEMM
(grouped_gemm.linear_mx; the backward's data gradients from the weights' transposed pairs,
linear_mx to fp32 and linear_mx_sum).
"""

from __future__ import annotations

import torch

from mok.backends.cuda import elementwise, grouped_gemm, mxfp8, weight_grads_mx
from mok.backends.cuda.dense_gemms import CudaElementwise, transposed_view
from mok.backends.cuda.experimental import f16_rows, swiglu_epilogue
from mok.config import MoKConfig
from mok.experts import ExpertEngine


class CudaMxfp8:
    """The MXFP8 steps on the extension's kernels: bf16 values (what the GEMMs read), each
    rounding in one pass (mok.backends.cuda.mxfp8.mxfp8_round) instead of a quantize + dequantize,
    over the schedule's used rows only (`num_tokens`, int32 [1] on the device)."""

    num_tokens: torch.Tensor
    quantize = staticmethod(mxfp8.mxfp8_quantize)
    dequantize = staticmethod(mxfp8.mxfp8_dequantize)

    def mx_round(self, t: torch.Tensor) -> torch.Tensor:
        return mxfp8.mxfp8_round(t.to(torch.bfloat16), used_rows=self.num_tokens)[0]

    def mx_round_rows(
        self, t: torch.Tensor, row_weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        if row_weight is not None:
            row_weight = row_weight.float().contiguous()
        return mxfp8.mxfp8_round_rows(
            t.to(torch.bfloat16), used_rows=self.num_tokens, row_scale=row_weight
        )

    def mx_round_both(self, t: torch.Tensor):
        return mxfp8.mxfp8_round(t.to(torch.bfloat16), transposed=True, used_rows=self.num_tokens)


class GroupedGemms(CudaMxfp8, ExpertEngine):
    """Routed-expert GEMMs on torch._grouped_mm over the schedule's expert segments (fp32)."""

    def __init__(self, schedule, num_experts: int):
        peer_rank, _, num_tokens, tokens_per_expert = schedule
        self.num_experts, self.num_tokens = num_experts, num_tokens
        self.offsets = torch.cumsum(tokens_per_expert, 0, dtype=torch.int32)
        rows = torch.arange(peer_rank.shape[0], device=peer_rank.device)
        # Rows past the last segment are not computed by the grouped GEMM: keep them zero.
        self.in_use = (rows < num_tokens)[:, None]

    def linear(self, a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """a [R, K] @ weight[e]^T per segment; weight [E, N, K]."""
        b = weight.to(torch.bfloat16).transpose(-2, -1)
        # grouped_mm accumulates in fp32 but stores in its input dtype (bf16).
        out = torch._grouped_mm(a.to(torch.bfloat16), b, offs=self.offsets)
        return torch.where(self.in_use, out.float(), 0.0)

    def weight_grad(self, d_out: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """sum over each segment's rows of d_out^T a -> [E, N, K] (zero for empty experts)."""
        d_t = d_out.to(torch.bfloat16).T
        return torch._grouped_mm(d_t, a.to(torch.bfloat16), offs=self.offsets).float()


class HopperGemms(CudaMxfp8, CudaElementwise, ExpertEngine):
    """Routed-expert GEMMs on mok's kernels (bf16 outputs, fp32 where the math keeps fp32)."""

    def __init__(self, schedule, num_experts: int, config: MoKConfig | None = None):
        # The GEMMs skip each segment's padding rows (peer_rank -1): every routed tensor holds
        # zeros there, so the linear kinds write those zeros themselves and the weight gradients
        # lose nothing by leaving the rows out. Rows past num_tokens (at EP >= 2 about half of a
        # schedule sized for twice the mean load) feed no result, so no kernel writes them (the
        # MXFP8 backward's dequantizations still read them, without using the values).
        self.row_source = schedule[0]
        self.rows = schedule[3]
        self.num_tokens = schedule[2]
        self.num_experts = num_experts
        config = config or MoKConfig()
        self.swiglu_epilogue = config.swiglu_epilogue
        # mxfp8_f16_rows (MOK_MXFP8_F16=1, experimental): the MXFP8 forward's gate/up GEMM on
        # f16 rows rebased per row (M_GROUPED_MXFP8_NT_F16_ROWS; pull_rounded writes them at EP 1)
        # instead of
        # bf16 rows (M_GROUPED_MXFP8_NT). Off by default: its weights' preparation launches cost
        # the host-bound shapes more than the GEMM gains (docs/grouped-gemm.md).
        self.reads_rebased_rows = config.mxfp8_f16_rows
        # The BF16 gate/up GEMM waits for its rows' arrival, so the dispatch pull can run beside
        # it (CudaEngine.pull_beside); the SwiGLU epilogue's kind does not wait.
        self.runs_pulls = not self.swiglu_epilogue

    mx_weights_as_stored = True

    @staticmethod
    def mx_weight(pair) -> grouped_gemm.MxWeight:
        """The pair itself: `linear` and `linears` read MXFP8 weights as stored, so no
        dequantized copy is made (docs/mxfp8.md)."""
        return grouped_gemm.MxWeight(*pair)

    @staticmethod
    def mx_weight_t(pair) -> grouped_gemm.MxWeightT:
        """The transposed pair itself: the backward's `linear` (fp32 d_h) and `linear_sum` (d_x)
        read it as stored, so the backward makes no bf16 copy of its three weights."""
        return grouped_gemm.MxWeightT(*pair)

    def linear(self, a: torch.Tensor, weight, pull=None) -> torch.Tensor:
        """a @ W[e]^T per segment; `pull` (the backward's d_h: W_down^T, a transposed view) the
        reverse dispatch writing `a`, run beside the GEMM."""
        if pull is not None and not transposed_view(weight):
            raise ValueError("`pull` runs beside the backward's d_h GEMM (a transposed weight)")
        if isinstance(weight, grouped_gemm.MxWeightT):  # d_h: the table keeps it fp32
            return grouped_gemm.linear_mx(
                a, [weight], self.rows, self.row_source, False, out_dtype=torch.float32
            )[0]
        if isinstance(weight, grouped_gemm.MxWeight):
            return self.linears(a, [weight])[0]
        if transposed_view(weight):  # the backward's W^T: N-contiguous weights, fp32 d_h
            # d_h is read by swiglu_backward for the used rows only: no zeroed tail needed.
            return grouped_gemm.linear_transposed(
                a, weight.transpose(1, 2), self.rows, False, self.row_source, pull=pull
            )
        return self.linears(a, [weight])[0]

    def linears(self, a, weights) -> list[torch.Tensor]:
        weights = list(weights)
        if isinstance(a, f16_rows.RebasedRows):  # MXFP8 weights, prepared per call
            rebased = [f16_rows.rebase_weight(w) for w in weights]
            return f16_rows.linear_mx_f16(a, rebased, self.rows, self.row_source, False)
        if isinstance(weights[0], grouped_gemm.MxWeight):
            return grouped_gemm.linear_mx(a, weights, self.rows, self.row_source, zero_rest=False)
        return grouped_gemm.linear(a, weights, self.rows, self.row_source, zero_rest=False)

    def gate_up_swiglu(self, a: torch.Tensor, w_gate, w_up, limit: float | None, pull=None):
        """The gate and up GEMMs in one launch (beside `pull`, the overlapped dispatch writing
        `a`, when given), then `swiglu`. With MOK_SWIGLU_EPILOGUE=1 (and whole 128-column
        tiles), one GEMM launch with SwiGLU in its epilogue: the same bits as the GEMMs +
        `swiglu`. Off by default (experimental): slower than the two steps on every GPU
        measured, the epilogue's arithmetic running while the tensor cores idle
        (docs/grouped-gemm.md)."""
        if not self.swiglu_epilogue or w_gate.shape[1] % swiglu_epilogue.SWIGLU_TILE_COLUMNS:
            gate, up = grouped_gemm.linear(
                a, [w_gate, w_up], self.rows, self.row_source, zero_rest=False, pull=pull
            )
            return gate, up, self.swiglu(gate, up, limit)
        return swiglu_epilogue.linear_swiglu(
            a, w_gate, w_up, self.rows, limit, self.row_source, zero_rest=False
        )

    def linear_sum(self, terms) -> torch.Tensor:
        if isinstance(terms[0][1], grouped_gemm.MxWeightT):
            return grouped_gemm.linear_mx_sum(terms, self.rows, self.row_source, zero_rest=False)
        terms = [(a, w.transpose(1, 2)) for a, w in terms]
        return grouped_gemm.linear_sum(terms, self.rows, self.row_source, zero_rest=False)

    def weight_grad(self, d_out: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return self.weight_grads([(d_out, a)])[0]

    @staticmethod
    def mx_rows_t(pair) -> weight_grads_mx.MxRowsT:
        """The saved x's transposed pair itself: d_W_gate's and d_W_up's GEMM reads it as
        stored instead of a bf16 copy."""
        return weight_grads_mx.MxRowsT(*pair)

    def weight_grads(self, pairs) -> list[torch.Tensor]:
        pairs = list(pairs)
        if isinstance(pairs[0][1], weight_grads_mx.MxRowsT):
            return weight_grads_mx.weight_grads_mx(pairs, self.rows, self.row_source)
        return grouped_gemm.weight_grads(pairs, self.rows, self.row_source)

    def swiglu_mxfp8(self, gate: torch.Tensor, up: torch.Tensor, limit: float | None):
        return elementwise.swiglu_mxfp8(gate, up, self.num_tokens, limit, zero_rest=False)
