"""The shared expert's engine on CUDA (cuBLAS GEMMs over every token row) and the elementwise
steps it shares with the routed experts' engine (mok.backends.cuda.routed_gemms.HopperGemms)."""

from __future__ import annotations

import contextlib

import torch

from mok.backends.cuda import elementwise as cuda_experts
from mok.backends.cuda import mxfp8
from mok.experts import ExpertEngine

_F32 = torch.float32


def transposed_view(weight: torch.Tensor) -> bool:
    """Whether `weight` [E, N, K] is the transpose of a contiguous [E, K, N] (the backward's
    W^T), which the GEMMs read N-contiguous and answer in fp32."""
    return not weight.is_contiguous() and weight.transpose(1, 2).is_contiguous()


class CudaElementwise:
    """SwiGLU, its backward and the row scaling on mok's kernels, over the first `num_tokens`
    rows (int32 [1] on the device); rows past it are left unwritten, since nothing reads them."""

    num_tokens: torch.Tensor

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor, limit: float | None) -> torch.Tensor:
        return cuda_experts.swiglu(gate, up, self.num_tokens, limit, zero_rest=False)

    @staticmethod
    def mx_swiglu_input(pair) -> tuple[torch.Tensor, torch.Tensor]:
        """The saved MXFP8 pair itself: the SwiGLU backward kernel reads gate and up as stored
        (no bf16 copies of them are made: docs/mxfp8.md)."""
        return tuple(pair)

    def swiglu_backward(self, d_h, rw, gate, up, hidden, limit: float | None, *,
                        scale_hidden=False, hidden_grad=True):  # fmt: skip
        return cuda_experts.swiglu_backward(
            d_h, rw, gate, up, hidden, self.num_tokens, limit, zero_rest=False,
            scale_hidden=scale_hidden, hidden_grad=hidden_grad,
        )  # fmt: skip

    def scale_rows(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # The scaled d_out rows feed the weight gradients, which read the segments only.
        return cuda_experts.scale_rows(x, weight, self.num_tokens, zero_rest=False)


class DenseGemms(CudaElementwise, ExpertEngine):
    """The shared expert: one expert over every token row (cuBLAS GEMMs storing bf16, or fp32
    where the math keeps fp32; mok's elementwise kernels).

    `free_sms()` says how many SMs a background exchange needs at the time of each GEMM call
    (0: none runs); cuBLAS then sizes its kernels for the rest (PyTorch's SM carve-out), so the
    exchange's CTAs find their SMs even though cuBLAS's persistent kernels start first.
    """

    num_experts = 1

    def __init__(self, tokens: int, device: torch.device, free_sms=lambda: 0):
        # A fill kernel, not a host copy, so the step stays capturable in a CUDA graph.
        self.num_tokens = torch.full((1,), tokens, dtype=torch.int32, device=device)
        self.free_sms = free_sms

    def linear(self, a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        a, w_t = a.to(torch.bfloat16), weight[0].to(torch.bfloat16).T
        with sm_carveout(self.free_sms()):
            if transposed_view(weight):  # the backward's W^T: d_h stays fp32
                return torch.mm(a, w_t, out_dtype=_F32)
            return torch.mm(a, w_t)

    def linear_sum(self, terms) -> torch.Tensor:
        """The backward's d_x: the second product adds the first's fp32 result in its epilogue
        (`addmm`), instead of a separate add pass over both, in place: into a new tensor, addmm
        would first copy the sum's first term there (docs/host-overhead.md)."""
        (a1, w1), (a2, w2) = terms
        if not (transposed_view(w1) and transposed_view(w2)):
            return super().linear_sum(terms)
        first = self.linear(a1, w1)  # fp32
        with sm_carveout(self.free_sms()):
            a2, w2_t = a2.to(torch.bfloat16), w2[0].to(torch.bfloat16).T
            return torch.addmm(first, a2, w2_t, out_dtype=_F32, out=first)

    def weight_grad(self, d_out: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """bf16 d_out^T a, accumulated in fp32 and rounded once (cuBLAS's bf16 output)."""
        with sm_carveout(self.free_sms()):
            return torch.mm(d_out.to(torch.bfloat16).T, a.to(torch.bfloat16))[None]

    quantize = staticmethod(mxfp8.mxfp8_quantize)


@contextlib.contextmanager
def sm_carveout(sms: int):
    """cuBLAS calls inside leave `sms` SMs unused (torch's experimental carve-out, as its async
    tensor parallelism uses for NCCL); nothing changes for 0 or where torch lacks the hook."""
    setter = getattr(torch._C, "_set_sm_carveout_experimental", None)
    if not sms or setter is None:
        yield
        return
    before = torch._C._get_sm_carveout_experimental()
    setter(sms)
    try:
        yield
    finally:
        setter(before)
