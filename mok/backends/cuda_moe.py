"""The CUDA backend's engine for mok.backends.moe: NVLink kernels for dispatch and combine,
grouped GEMMs for the experts.

Communication runs on mok's own kernels (mok.backends.cuda_comm: peer loads and stores on the
workspace's symmetric buffers, flag barriers, no multicast). The expert GEMMs run on mok's
grouped GEMMs (mok.backends.cuda_gemm: TMA + wgmma, sm_90a) over the schedule's 256-row expert
segments, sized on the device, so a step needs no host sync. Modules without those kernels
(Blackwell), or MOK_GROUPED_GEMM=torch, use `torch._grouped_mm` the same way. In MXFP8 mode the
operands are the dequantized MXFP8 values, which bf16 holds exactly, so the numerics are those
of the reference's table; mok's GEMMs read the weights as stored and convert them to those
bf16 values inside the GEMM (cuda_gemm.linear_mx; the backward's data gradients from the
weights' transposed pairs, linear_mx to fp32 and linear_mx_sum).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Sequence

import torch

from mok._checks import describe
from mok.backends import (
    cuda,
    cuda_comm,
    cuda_comm_mxfp8,
    cuda_experts,
    cuda_gemm,
    cuda_rebased,
    cuda_weight_grads_mx,
)
from mok.backends.cuda_dense import CudaElementwise, DenseGemms, transposed_view
from mok.backends.reference_experts import ExpertEngine, mx_round_d_out
from mok.workspace import MoKWorkspace, same_layout, workspace_at


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


_DEFAULT_BACKGROUND_CTAS = 64


def background_ctas() -> int:
    """CTAs of an exchange that runs in the background of GEMMs: MOK_OVERLAP_CTAS (default 64,
    about half an H100/H200: on 2x H200 the DSV4-Pro-like backward's pull took 0.97 ms on 64
    CTAs, 1.61 on 32 and 2.7 on 16, while its shared GEMMs slowed by 0.02 ms each, NOTES v5);
    0 runs every exchange in the foreground, on all SMs."""
    text = os.environ.get("MOK_OVERLAP_CTAS", "")
    try:
        ctas = int(text) if text else _DEFAULT_BACKGROUND_CTAS
    except ValueError:
        ctas = -1
    if ctas < 0:
        raise ValueError(f"MOK_OVERLAP_CTAS must be a CTA count >= 0, got {text!r}")
    return ctas


_COMM_STREAMS: dict[int, torch.cuda.Stream] = {}


def _comm_stream(device: torch.device) -> torch.cuda.Stream:
    """One high-priority stream per device for background exchanges: the SM scheduler gives its
    CTAs the next free SMs before more GEMM tiles, so the exchange starts as soon as it may."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _COMM_STREAMS:
        highest = torch.cuda.Stream.priority_range()[1]
        _COMM_STREAMS[index] = torch.cuda.Stream(torch.device("cuda", index), priority=highest)
    return _COMM_STREAMS[index]


# The symmetric buffers the peers push into (a pass's outputs); the others they pull from.
PUSHED_INTO = ("combine_buffer", "d_x_routed_buffer", "d_router_weight_buffer")


class CudaEngine:
    """mok.backends.moe's engine on one CUDA workspace.

    A background exchange runs on the device's comm stream, which first waits for everything
    enqueued so far on the current stream; `join()` makes the current stream wait for it. Its
    outputs are allocated on the current stream and its inputs stay referenced by the pass until
    the join, so the caching allocator never hands their memory out while the exchange runs.
    Every op of the workspace still runs in one order (all exchanges on the comm stream between
    a fork and its join), so the barriers' epochs stay in step across ranks.
    """

    def __init__(self, workspace: MoKWorkspace):
        self.ws = workspace
        self.ctas = background_ctas()
        self._waiting: torch.cuda.Stream | None = None  # the stream to join, when forked
        self._stand_ins: dict[str, torch.Tensor] = {}  # pushed-into buffer -> its argument

    @classmethod
    def for_buffers(cls, buffers: dict[str, torch.Tensor], x_ptrs: Sequence[int]) -> CudaEngine:
        """The engine of the workspace whose `x_buffer` this rank's entry of `x_ptrs` is.

        mok.functional passes the workspace's buffers themselves. Under torch.compile an op's
        tensor arguments can be functional copies (a buffer filled by `copy_`, a mutated
        argument's clone), while the peers read and write the symmetric buffers behind the
        pointers: so an argument that is not its buffer has its values copied into the buffer
        here, or, for the buffers the peers push into, gets the buffer's values back from
        `hand_back_pushed` after the pushes (eager mode copies nothing)."""
        workspace = workspace_at(x_ptrs)
        if workspace is None:
            raise ValueError(
                "the CUDA fused ops work on a mok workspace's symmetric buffers: no entry of "
                "`x_ptrs` is this rank's `x_buffer` of a live workspace (call mok.functional, "
                "or pass workspace.x_buffer_ptrs)"
            )
        engine = cls(workspace)
        for name, tensor in buffers.items():
            buffer = getattr(workspace, name)
            if not same_layout(tensor, buffer):
                raise ValueError(
                    f"`{name}` must have the workspace's {name} layout ({describe(buffer)}), "
                    f"got {describe(tensor)}"
                )
            if tensor.data_ptr() == buffer.data_ptr():
                continue
            if name in PUSHED_INTO:
                engine._stand_ins[name] = tensor
            else:
                buffer.copy_(tensor)
        return engine

    def hand_back_pushed(self) -> None:
        """Copies each buffer the peers pushed into to the argument that stood for it (call on
        the current stream once the pushes are joined); nothing in eager mode."""
        for name, tensor in self._stand_ins.items():
            tensor.copy_(getattr(self.ws, name))

    @contextlib.contextmanager
    def _exchange(self, background: bool):
        """Yields the CTA count for the exchange enqueued inside (None: the default, all SMs)."""
        if not (background and self.ctas):
            yield None
            return
        current = torch.cuda.current_stream(self.ws.device)
        comm = _comm_stream(self.ws.device)
        if self._waiting is None:
            self._waiting = current
        comm.wait_stream(current)
        with torch.cuda.stream(comm):
            yield self.ctas

    @property
    def topk(self) -> int:
        return self.ws.topk

    def join(self) -> None:
        if self._waiting is not None:
            self._waiting.wait_stream(_comm_stream(self.ws.device))
            self._waiting = None

    @staticmethod
    def _pull_options(sync, ctas) -> dict:
        """Keywords of a pass's pulls: the barriers `sync` asks for, and rows past num_tokens
        left unwritten (the routed GEMMs never read them)."""
        before, after = sync
        return {"sync_before": before, "sync_after": after, "num_ctas": ctas, "zero_rest": False}

    def pull(self, name: str, schedule, background: bool = False, *, sync=(True, True)):
        """`sync` = (barrier before, barrier after), as cuda_comm.pull_rows's flags."""
        source = getattr(self.ws, name)
        out = source.new_empty((schedule[0].shape[0], *source.shape[1:]))
        with self._exchange(background) as ctas:
            return cuda_comm.pull_rows(
                self.ws, name, schedule, out, **self._pull_options(sync, ctas)
            )

    def pull_rounded(self, name: str, schedule, gemm, background=False, *, sync=(True, True)):
        """A callable giving `gemm.mx_round_both` of `self.pull(name, schedule)`'s rows; call
        it after the join. At EP 1 or in the foreground one kernel (cuda_comm_mxfp8; the GEMM
        engines here round as it does, CudaMxfp8) pulls and rounds, so the pulled rows are never
        stored; at EP 1, for GEMMs that read them (`reads_rebased_rows`), as f16 rows rebased per
        row (cuda_rebased.RebasedRows). In the background (beside weight dequantization) it pulls
        on a few CTAs and rounds when called: the one-pass kernel on a limited grid was 0.2-0.5
        ms slower there (NOTES v10)."""
        rebased = self.ws.ep_size == 1 and getattr(gemm, "reads_rebased_rows", False)
        fused = functools.partial(cuda_comm_mxfp8.pull_round, rebased=rebased)
        return self._pull_rounding(fused, gemm.mx_round_both, name, schedule, background, sync)

    def pull_rounded_rows(self, name: str, schedule, gemm, row_weights, background=False, *,
                          sync=(True, True)):  # fmt: skip
        """A callable giving `mx_round_d_out(gemm, rows, row_weights)` of `self.pull(name,
        schedule)`'s rows, as `pull_rounded` (its one pass: cuda_comm_mxfp8.pull_round_rows)."""
        fused = functools.partial(cuda_comm_mxfp8.pull_round_rows, row_weights=row_weights)
        rounding = functools.partial(mx_round_d_out, gemm, rw_rows=row_weights)
        return self._pull_rounding(fused, rounding, name, schedule, background, sync)

    def _pull_rounding(self, fused, rounding, name, schedule, background, sync):
        """`fused(ws, name, schedule, ...)` (the pull and its roundings in one pass) at EP 1 or
        in the foreground, after a join (it may read what a background exchange writes); else
        `self.pull` now and `rounding(rows)` when the returned callable is called."""
        if self.ws.ep_size == 1 or not background:
            self.join()
            before, after = sync
            rounded = fused(self.ws, name, schedule, sync_before=before, sync_after=after)
            return lambda: rounded
        rows = self.pull(name, schedule, background, sync=sync)
        return lambda: rounding(rows)

    def pull_router_weights(self, schedule, background: bool = False, *, sync=(True, True)):
        out = self.ws.router_weight_buffer.new_empty(schedule[0].shape[0])
        with self._exchange(background) as ctas:
            return cuda_comm.pull_router_weights(
                self.ws, schedule, out, **self._pull_options(sync, ctas)
            )

    def push_all(self, pushes, schedule, background: bool = False) -> None:
        """Combine each (rows, destination name): the rows nobody pushes zeroed in every
        destination, one barrier, the pushes, one barrier (not two per push)."""
        with self._exchange(background) as ctas:
            for _, name in pushes:  # before the barrier that precedes the pushes
                cuda_comm.zero_destination(self.ws, name, schedule[0])
            for i, (rows, name) in enumerate(pushes):
                cuda_comm.push_rows(
                    self.ws, rows, schedule, name, zero_fill=False, sync_before=i == 0,
                    sync_after=i == len(pushes) - 1, num_ctas=ctas,
                )  # fmt: skip

    @staticmethod
    def routed_gemms(schedule, num_experts: int) -> ExpertEngine:
        if _use_mok_gemms(schedule[3].device):
            return HopperGemms(schedule, num_experts)
        return GroupedGemms(schedule, num_experts)

    def shared_gemms(self, tokens: int) -> DenseGemms:
        return DenseGemms(tokens, self.ws.device, self._background_sms)

    def _background_sms(self) -> int:
        """SMs to leave to the background exchange that is running now (0 when none is)."""
        return self.ctas if self._waiting is not None else 0
