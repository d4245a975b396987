"""The routed experts' engines on CUDA (mok.backends.reference_experts.ExpertEngine).

HopperGemms runs mok's grouped GEMMs (mok.backends.cuda_gemm: TMA + wgmma, sm_90a) over the
schedule's 256-row expert segments, sized on the device, so a step needs no host sync. Modules
without those kernels (Blackwell), or MOK_GROUPED_GEMM=torch, get GroupedGemms:
`torch._grouped_mm` the same way. In MXFP8 mode the operands are the dequantized MXFP8 values,
which bf16 holds exactly, so the numerics are those of the reference's table; mok's GEMMs read
the weights as stored and convert them to those bf16 values inside the GEMM
(cuda_gemm.linear_mx; the backward's data gradients from the weights' transposed pairs,
linear_mx to fp32 and linear_mx_sum).
"""

from __future__ import annotations

import os

import torch

from mok.backends import cuda, cuda_experts, cuda_gemm, cuda_rebased, cuda_weight_grads_mx
from mok.backends.cuda_dense import CudaElementwise, transposed_view
from mok.backends.reference_experts import ExpertEngine


class CudaMxfp8:
    """The MXFP8 steps on the extension's kernels: bf16 values (what the GEMMs read), each
    rounding in one pass (mok.backends.cuda.mxfp8_round) instead of a quantize + dequantize,
    over the schedule's used rows only (`num_tokens`, int32 [1] on the device)."""

    num_tokens: torch.Tensor
    quantize = staticmethod(cuda.mxfp8_quantize)
    dequantize = staticmethod(cuda.mxfp8_dequantize)

    def mx_round(self, t: torch.Tensor) -> torch.Tensor:
        return cuda.mxfp8_round(t.to(torch.bfloat16), used_rows=self.num_tokens)[0]

    def mx_round_rows(
        self, t: torch.Tensor, row_weight: torch.Tensor | None = None
    ) -> torch.Tensor:
        if row_weight is not None:
            row_weight = row_weight.float().contiguous()
        return cuda.mxfp8_round_rows(
            t.to(torch.bfloat16), used_rows=self.num_tokens, row_scale=row_weight
        )

    def mx_round_both(self, t: torch.Tensor):
        return cuda.mxfp8_round(t.to(torch.bfloat16), transposed=True, used_rows=self.num_tokens)


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

    def __init__(self, schedule, num_experts: int):
        # The GEMMs skip each segment's padding rows (peer_rank -1): every routed tensor holds
        # zeros there, so the linear kinds write those zeros themselves and the weight gradients
        # lose nothing by leaving the rows out. Rows past num_tokens (at EP >= 2 about half of a
        # schedule sized for twice the mean load) feed no result, so no kernel writes them (the
        # MXFP8 backward's dequantizations still read them, without using the values).
        self.row_source = schedule[0]
        self.rows = schedule[3]
        self.num_tokens = schedule[2]
        self.num_experts = num_experts
        self.swiglu_epilogue = _swiglu_epilogue()
        # MOK_MXFP8_F16=1: the MXFP8 forward's gate/up GEMM on f16 rows rebased per row (kind
        # 6; pull_rounded writes them at EP 1) instead of bf16 rows (kind 4). Off by default:
        # on 1x H200 it makes the DSV4-Pro-like forward 0.10-0.15 ms faster, but the host-bound
        # Qwen-like ones slower, its weights' preparation launches and their host work keeping
        # the GPU waiting (benchmarks/NOTES.md v17, v18).
        self.reads_rebased_rows = _choice("MOK_MXFP8_F16", ("0", "1"), "0") == "1"

    mx_weights_as_stored = True

    @staticmethod
    def mx_weight(pair) -> cuda_gemm.MxWeight:
        """The pair itself: `linear` and `linears` read MXFP8 weights as stored (the dequantized
        copies cost ~0.2 ms each on the DSV4-Pro-like shape, NOTES v11)."""
        return cuda_gemm.MxWeight(*pair)

    @staticmethod
    def mx_weight_t(pair) -> cuda_gemm.MxWeightT:
        """The transposed pair itself: the backward's `linear` (fp32 d_h) and `linear_sum` (d_x)
        read it as stored, so the backward makes no bf16 copy of its three weights (NOTES v28)."""
        return cuda_gemm.MxWeightT(*pair)

    def linear(self, a: torch.Tensor, weight) -> torch.Tensor:
        if isinstance(weight, cuda_gemm.MxWeightT):  # d_h: the table keeps it fp32
            return cuda_gemm.linear_mx(
                a, [weight], self.rows, self.row_source, False, out_dtype=torch.float32
            )[0]
        if isinstance(weight, cuda_gemm.MxWeight):
            return self.linears(a, [weight])[0]
        if transposed_view(weight):  # the backward's W^T: N-contiguous weights, fp32 d_h
            # d_h is read by swiglu_backward for the used rows only: no zeroed tail needed.
            return cuda_gemm.linear_transposed(
                a, weight.transpose(1, 2), self.rows, False, self.row_source
            )
        return self.linears(a, [weight])[0]

    def linears(self, a, weights) -> list[torch.Tensor]:
        weights = list(weights)
        if isinstance(a, cuda_rebased.RebasedRows):  # MXFP8 weights, prepared per call
            rebased = [cuda_rebased.rebase_weight(w) for w in weights]
            return cuda_rebased.linear_mx_f16(a, rebased, self.rows, self.row_source, False)
        if isinstance(weights[0], cuda_gemm.MxWeight):
            return cuda_gemm.linear_mx(a, weights, self.rows, self.row_source, zero_rest=False)
        return cuda_gemm.linear(a, weights, self.rows, self.row_source, zero_rest=False)

    def gate_up_swiglu(self, a: torch.Tensor, w_gate, w_up, limit: float | None):
        """With MOK_SWIGLU_EPILOGUE=1 (and whole 128-column tiles), one GEMM launch with SwiGLU
        in its epilogue: the same bits as the GEMMs + `swiglu`. Off by default: on 1x H200 it
        is 0.08-0.18 ms slower than the two steps, the epilogue's arithmetic running while the
        tensor cores idle (benchmarks/NOTES.md v13)."""
        if not self.swiglu_epilogue or w_gate.shape[1] % cuda_gemm.SWIGLU_TILE_COLUMNS:
            return super().gate_up_swiglu(a, w_gate, w_up, limit)
        return cuda_gemm.linear_swiglu(
            a, w_gate, w_up, self.rows, limit, self.row_source, zero_rest=False
        )

    def linear_sum(self, terms) -> torch.Tensor:
        if isinstance(terms[0][1], cuda_gemm.MxWeightT):
            return cuda_gemm.linear_mx_sum(terms, self.rows, self.row_source, zero_rest=False)
        terms = [(a, w.transpose(1, 2)) for a, w in terms]
        return cuda_gemm.linear_sum(terms, self.rows, self.row_source, zero_rest=False)

    def weight_grad(self, d_out: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return self.weight_grads([(d_out, a)])[0]

    @staticmethod
    def mx_rows_t(pair) -> cuda_weight_grads_mx.MxRowsT:
        """The saved x's transposed pair itself: d_W_gate's and d_W_up's GEMM reads it as
        stored instead of a bf16 copy (NOTES v29)."""
        return cuda_weight_grads_mx.MxRowsT(*pair)

    def weight_grads(self, pairs) -> list[torch.Tensor]:
        pairs = list(pairs)
        if isinstance(pairs[0][1], cuda_weight_grads_mx.MxRowsT):
            return cuda_weight_grads_mx.weight_grads_mx(pairs, self.rows, self.row_source)
        return cuda_gemm.weight_grads(pairs, self.rows, self.row_source)

    def swiglu_mxfp8(self, gate: torch.Tensor, up: torch.Tensor, limit: float | None):
        return cuda_experts.swiglu_mxfp8(gate, up, self.num_tokens, limit, zero_rest=False)


def _swiglu_epilogue() -> bool:
    return _choice("MOK_SWIGLU_EPILOGUE", ("0", "1"), "0") == "1"


def _choice(variable: str, allowed: tuple[str, ...], default: str) -> str:
    choice = os.environ.get(variable, default)
    if choice not in allowed:
        raise ValueError(f"{variable} must be one of {', '.join(allowed)}, got {choice!r}")
    return choice


def _use_mok_gemms(device: torch.device) -> bool:
    choice = os.environ.get("MOK_GROUPED_GEMM", "auto")
    if choice not in ("auto", "mok", "torch"):
        raise ValueError(f"MOK_GROUPED_GEMM must be auto, mok or torch, got {choice!r}")
    if choice == "torch":
        return False
    if cuda_gemm.available(device):
        return True
    if choice == "mok":
        raise NotImplementedError(
            f"MOK_GROUPED_GEMM=mok, but {device}'s module has no grouped GEMMs"
        )
    return False


def routed_gemms(schedule, num_experts: int) -> ExpertEngine:
    """The engine for the schedule's device: mok's GEMMs where its module has them (or
    MOK_GROUPED_GEMM says which)."""
    if _use_mok_gemms(schedule[3].device):
        return HopperGemms(schedule, num_experts)
    return GroupedGemms(schedule, num_experts)
