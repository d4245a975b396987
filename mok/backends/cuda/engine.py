"""The CUDA backend's engine for mok.passes: NVLink kernels for dispatch and combine,
grouped GEMMs for the experts.

Communication runs on mok's own kernels (mok.backends.cuda.comm: peer loads and stores on the
workspace's symmetric buffers, flag barriers, no multicast), in the foreground or on a
high-priority comm stream beside the GEMMs. The experts' GEMMs are the engines of
mok.backends.cuda.routed_gemms (routed) and mok.backends.cuda.dense_gemms (shared).
"""

from __future__ import annotations

import contextlib
import functools

import torch

from mok import backends
from mok._arguments import describe
from mok.backends.cuda import comm as cuda_comm
from mok.backends.cuda import extension, mxfp8_pulls, pull_beside
from mok.backends.cuda.dense_gemms import DenseGemms
from mok.config import MoKConfig
from mok.experts import mx_round_d_out
from mok.workspace import Buffer, MoKWorkspace, same_layout

_COMM_STREAMS: dict[int, torch.cuda.Stream] = {}


def _comm_stream(ws: MoKWorkspace) -> torch.cuda.Stream:
    """One high-priority stream per device for background exchanges: the SM scheduler gives its
    CTAs the next free SMs before more GEMM tiles, so the exchange starts as soon as it may.
    Ranks that share a device in one process have one each (a rank's barrier on a stream
    shared with another rank would wait behind it)."""
    if ws.host_group is not None:
        return ws.host_group.comm_streams[ws.ep_rank]
    device = ws.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _COMM_STREAMS:
        highest = torch.cuda.Stream.priority_range()[1]
        _COMM_STREAMS[index] = torch.cuda.Stream(torch.device("cuda", index), priority=highest)
    return _COMM_STREAMS[index]


# The symmetric buffers the peers push into (a pass's outputs); the others they pull from.
PUSHED_INTO = (Buffer.COMBINE, Buffer.D_X_ROUTED, Buffer.D_ROUTER_WEIGHT)


class CudaEngine:
    """mok.passes's engine on one CUDA workspace.

    A background exchange runs on the device's comm stream, which first waits for everything
    enqueued so far on the current stream; `join()` makes the current stream wait for it. Its
    outputs are allocated on the current stream and its inputs stay referenced by the pass until
    the join, so the caching allocator never hands their memory out while the exchange runs.
    Every op of the workspace still runs in one order (all exchanges on the comm stream between
    a fork and its join), so the barriers' epochs stay in step across ranks.
    """

    def __init__(self, workspace: MoKWorkspace, config: MoKConfig | None = None):
        self.ws = workspace
        self.config = config or MoKConfig()
        self.ctas = self.config.overlap_ctas
        self._waiting: torch.cuda.Stream | None = None  # the stream to join, when forked
        self._stand_ins: dict[str, torch.Tensor] = {}  # pushed-into buffer -> its argument
        self.kept: dict[str, torch.Tensor] = {}  # rows a pass kept instead of pushing
        self._in_place: dict[str, torch.Tensor] = {}  # pulled-from buffer -> the caller's tensor

    def use_sources(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The caller's tensors for the buffers a pass pulls from (already checked by the
        entry: the buffers' shapes and dtypes, contiguous); returns, for each, what the pass
        reads. At EP 1, where the only source is this rank's, the pulls read each one in place
        if it is 16-byte aligned (comm_operands.direct_source): a copy less before the first GEMM.
        Any other is copied into its workspace buffer here, for the peers, and the pass reads
        the buffer (so the shared expert's GEMMs see the aligned operand they always saw)."""
        read = {}
        for name, tensor in tensors.items():
            if self.ws.ep_size == 1 and tensor.data_ptr() % extension.ALIGNMENT == 0:
                self._in_place[name] = read[name] = tensor
            else:
                read[name] = getattr(self.ws, name).copy_(tensor)
        return read

    @classmethod
    def with_stand_ins(cls, workspace: MoKWorkspace, buffers: dict[str, torch.Tensor],
                       config: MoKConfig | None = None):  # fmt: skip
        """The engine of a fused op called with the original's flat arguments: `buffers` maps
        workspace buffer names to the tensors the op was given. Under torch.compile those can
        be functional copies (a buffer filled by `copy_`, a mutated argument's clone), while the
        peers read and write the symmetric buffers behind the pointers: so an argument that is
        not its buffer has its values copied into the buffer here, or, for the buffers the peers
        push into, gets the buffer's values back from `hand_back_pushed` after the pushes."""
        engine = cls(workspace, config)
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
        comm = _comm_stream(self.ws)
        if self._waiting is None:
            self._waiting = current
        comm.wait_stream(current)
        with torch.cuda.stream(comm):
            yield self.ctas

    @property
    def topk(self) -> int:
        return self.ws.topk

    @property
    def dispatch_is_local(self) -> bool:
        """Whether the dispatch reads this rank's rows alone (EP 1: no barrier, no peer)."""
        return self.ws.ep_size == 1

    def join(self) -> None:
        if self._waiting is not None:
            self._waiting.wait_stream(_comm_stream(self.ws))
            self._waiting = None

    def pull(self, name: str, schedule, background: bool = False, *, sync=(True, True)):
        """`sync` = (barrier before, barrier after), as cuda_comm.pull_rows's flags. Rows past
        num_tokens are left unwritten (the routed GEMMs never read them). The operands are the
        checked entry's and the engine's own, so the pull launches without pull_rows's checks."""
        source = getattr(self.ws, name)
        return self._launch_pull(name, source, schedule, self.ws.topk, background, sync)

    def _launch_pull(self, name, source, schedule, divisor, background, sync):
        out = source.new_empty((schedule[0].shape[0], *source.shape[1:]))
        in_place = self._in_place.get(name)
        address = 0 if in_place is None else in_place.data_ptr()
        with self._exchange(background) as ctas:
            return cuda_comm.launch_pull(self.ws, name, source, schedule[:3], out, divisor, sync,
                                         num_ctas=ctas, zero_rest=False,
                                         src_direct=address)  # fmt: skip

    def pull_beside(self, name: str, schedule, gemm, *, sync=(True, True)):
        """(rows, pull): `pull`'s rows, and the pull itself for the GEMM engine to run beside its
        first GEMM on them (`gemm.runs_pulls`), on the config's comm SMs with arrivals counted
        every `minibatch_size` rows (docs/overlap.md); or, where that cannot be (a barrier after
        the pull, no comm SMs), rows already pulled and None."""
        comm_sms = self._comm_sms(name)
        overlaps = self.config.overlap_dispatch and getattr(gemm, "runs_pulls", False)
        if not overlaps or sync[1] or not comm_sms:
            return self.pull(name, schedule, sync=sync), None
        source = getattr(self.ws, name)
        out = source.new_empty((schedule[0].shape[0], *source.shape[1:]))
        pull = pull_beside.overlapped_pull(
            self.ws, name, schedule, out, ctas=comm_sms, sync_before=sync[0],
            minibatch_rows=self.config.minibatch_size, source=self._in_place.get(name),
        )  # fmt: skip
        return out, pull

    def _comm_sms(self, name: str) -> int:
        """The SMs a pass's communication gets beside its GEMMs: the forward's (it pulls x) or
        the backward's."""
        forward = name == Buffer.X
        return self.config.fwd_num_comm_sms if forward else self.config.bwd_num_comm_sms

    def pull_rounded(self, name: str, schedule, gemm, background=False, *, sync=(True, True)):
        """A callable giving `gemm.mx_round_both` of `self.pull(name, schedule)`'s rows; call
        it after the join. At EP 1 or in the foreground one kernel (mxfp8_pulls; the GEMM
        engines round as it does, routed_gemms.CudaMxfp8) pulls and rounds, so the pulled
        rows are never stored; at EP 1, for GEMMs that read them (`reads_rebased_rows`), as f16
        rows rebased per row (f16_rows.RebasedRows). In the background (beside weight
        dequantization) it pulls on a few CTAs and rounds when called: the one-pass kernel on a
        limited grid was slower there (docs/exchanges.md)."""
        rebased = self.ws.ep_size == 1 and getattr(gemm, "reads_rebased_rows", False)
        fused = functools.partial(mxfp8_pulls.pull_round, rebased=rebased)
        return self._pull_rounding(fused, gemm.mx_round_both, name, schedule, background, sync)

    def pull_rounded_rows(self, name: str, schedule, gemm, row_weights, background=False, *,
                          sync=(True, True)):  # fmt: skip
        """A callable giving `mx_round_d_out(gemm, rows, row_weights)` of `self.pull(name,
        schedule)`'s rows, as `pull_rounded` (its one pass: mxfp8_pulls.pull_round_rows)."""
        fused = functools.partial(mxfp8_pulls.pull_round_rows, row_weights=row_weights)
        rounding = functools.partial(mx_round_d_out, gemm, rw_rows=row_weights)
        return self._pull_rounding(fused, rounding, name, schedule, background, sync)

    def _pull_rounding(self, fused, rounding, name, schedule, background, sync):
        """`fused(ws, name, schedule, ...)` (the pull and its roundings in one pass) at EP 1 or
        in the foreground, after a join (it may read what a background exchange writes); else
        `self.pull` now and `rounding(rows)` when the returned callable is called."""
        if self.ws.ep_size == 1 or not background:
            self.join()
            before, after = sync
            rounded = fused(self.ws, name, schedule, sync_before=before, sync_after=after,
                            source=self._in_place.get(name))  # fmt: skip
            return lambda: rounded
        rows = self.pull(name, schedule, background, sync=sync)
        return lambda: rounding(rows)

    def pull_router_weights(self, schedule, background: bool = False, *, sync=(True, True)):
        """The fp32 router weight of each row (cuda_comm.pull_router_weights, unchecked as
        `pull`)."""
        source = self.ws.router_weight_buffer.view(-1)
        return self._launch_pull(Buffer.ROUTER_WEIGHT, source, schedule, 1, background, sync)

    def push_all(self, pushes, schedule, background: bool = False) -> None:
        """Combine each (rows, destination name): the rows nobody pushes zeroed in every
        destination, one barrier, the pushes, one barrier (not two per push)."""
        with self._exchange(background) as ctas:
            for _, name in pushes:  # before the barrier that precedes the pushes
                cuda_comm.zero_destination(self.ws, name, schedule.unpushed_routes())
            for i, (rows, name) in enumerate(pushes):
                cuda_comm.push_rows(
                    self.ws, rows, schedule, name, zero_fill=False, sync_before=i == 0,
                    sync_after=i == len(pushes) - 1, num_ctas=ctas,
                )  # fmt: skip

    def routed_gemms(self, schedule, num_experts: int):
        return backends.routed_gemms(schedule, num_experts, self.config)

    def shared_gemms(self, tokens: int) -> DenseGemms:
        return DenseGemms(tokens, self.ws.device, self._background_sms)

    def _background_sms(self) -> int:
        """SMs to leave to the background exchange that is running now (0 when none is)."""
        return self.ctas if self._waiting is not None else 0
