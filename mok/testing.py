"""An EP group of N ranks in one process on one device: every multi-rank path of mok on one GPU.

    group = OneDeviceGroup(8, config, device="cuda", num_local_tokens=T, hidden_size=H, topk=k)

    def step(rank, ws):  # runs once per rank, in that rank's thread, on that rank's stream
        schedule = mok.functional.build_schedule(ws, config, top_experts[rank], ...)
        out, ctx = mok.functional.forward(config, ws, schedule, x[rank], ...)
        return out

    outs = group.run(step)  # [out of rank 0, ..., out of rank 7]

Each rank has its own MoKWorkspace, whose peer tables point into the other ranks' buffers
(ordinary allocations: no symmetric memory, no process group), and its own CUDA stream, so a
rank's device-side wait is met by another rank's kernels. The kernels and the functional API are
those of a group across GPUs; only the workspaces' creation differs. On CPU the same group runs
the reference backend, its exchanges going through a host rendezvous instead of
torch.distributed. Progress and the SM budget: docs/one-device-group.md.

The original's flat `torch.ops.mok.*` ops find their workspace by its pointer lists, which the
ranks of such a group share: call the functional API (or MoELayer) here, not the flat ops.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable

import torch

from mok import settings
from mok._arguments import check_range, check_type
from mok.config import MoKConfig
from mok.host_group import HostGroup, HostGroupError
from mok.workspace import (
    MAX_EP_SIZE,
    MoKWorkspace,
    assemble,
    check_sizes,
    symmetric_buffers,
    workspace_device,
)

__all__ = ["HostGroupError", "OneDeviceGroup", "waiting_ctas_fit"]

_GROUP_NUMBERS = itertools.count(1)
# Kernels that can wait at once per rank: its barrier on its stream and one on its comm stream.
WAITING_KERNELS_PER_RANK = 2


def waiting_ctas_fit(ep_size: int, num_sms: int) -> bool:
    """Whether every rank's waiting kernels (one CTA each, WAITING_KERNELS_PER_RANK per rank) fit
    on the device together with an SM each, whatever else occupies it: the condition under which
    no rank can wait for a barrier that cannot be scheduled."""
    return WAITING_KERNELS_PER_RANK * ep_size <= num_sms


class OneDeviceGroup:
    """`ep_size` ranks in one process on `device` (a CUDA GPU, or the CPU for the reference).

    `timeout_s` bounds every host-side wait of the group's threads (a rank that fails turns into
    a HostGroupError on the others); the device-side waits keep MOK_COMM_TIMEOUT_S.
    """

    def __init__(
        self,
        ep_size: int,
        config: MoKConfig,
        *,
        device: torch.device | str,
        num_local_tokens: int,
        hidden_size: int,
        topk: int,
        timeout_s: float = 300.0,
    ):
        check_type("config", config, MoKConfig)
        settings.check_all()
        check_range("ep_size", ep_size, 1, MAX_EP_SIZE)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
            raise ValueError(f"`timeout_s` must be a positive number of seconds, got {timeout_s!r}")
        device = workspace_device(config, device)
        check_sizes(num_local_tokens, hidden_size, topk)
        if device.type == "cuda":
            _check_sm_budget(ep_size, device)
        self.ep_size, self.device = ep_size, device
        self.host = HostGroup(ep_size, device, float(timeout_s))
        name = f"mok-one-device-group-{next(_GROUP_NUMBERS)}"
        sizes = (num_local_tokens, hidden_size, topk)
        self.workspaces = _workspaces(config, name, device, sizes, self.host)
        cuda = device.type == "cuda"
        self.streams = [torch.cuda.Stream(device) if cuda else None for _ in range(ep_size)]

    def run(self, step: Callable[[int, MoKWorkspace], object]) -> list:
        """`step(rank, workspace)` for every rank at once, one thread per rank with that rank's
        stream current; returns their results in rank order. The rank streams start after the
        work already enqueued on the caller's stream, which waits for them at the end. If a rank
        raises, the others are released (HostGroupError) and the first rank's own error is
        raised here."""
        results: list = [None] * self.ep_size
        errors: list[BaseException | None] = [None] * self.ep_size
        self.host.reset()
        caller = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        for stream in self.streams if caller is not None else ():
            stream.wait_stream(caller)
        threads = [
            threading.Thread(target=self._rank_main, args=(rank, step, results, errors))
            for rank in range(self.ep_size)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for stream in self.streams if caller is not None else ():
            caller.wait_stream(stream)
        _raise_first(errors)
        return results

    def capture(self, graph: torch.cuda.CUDAGraph, step) -> list:
        """`run(step)` captured into `graph` (every rank's work in one CUDA graph, each rank a
        branch forked from and joined to the capture stream); replay it with `graph.replay()`."""
        if self.device.type != "cuda":
            raise ValueError(f"a CUDA graph needs a group on a CUDA device, not {self.device}")
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            return self.run(step)

    def _rank_main(self, rank: int, step, results: list, errors: list) -> None:
        try:
            self.host.enter(rank)
            with self._on_rank(rank):
                results[rank] = step(rank, self.workspaces[rank])
        except BaseException as error:  # handed to run(), which raises it in the caller
            errors[rank] = error
            self.host.abort()

    def _on_rank(self, rank: int):
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.cuda.device(self.device))
        stack.enter_context(torch.cuda.stream(self.streams[rank]))
        return stack


def _check_sm_budget(ep_size: int, device: torch.device) -> None:
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if not waiting_ctas_fit(ep_size, sms):
        raise ValueError(
            f"`ep_size` {ep_size} is too large for one {torch.cuda.get_device_name(device)}: "
            f"{WAITING_KERNELS_PER_RANK} waiting barrier kernels per rank need "
            f"{WAITING_KERNELS_PER_RANK * ep_size} SMs, the GPU has {sms} "
            f"(at most {sms // WAITING_KERNELS_PER_RANK} ranks)"
        )


def _workspaces(config, name: str, device, sizes, host: HostGroup) -> list[MoKWorkspace]:
    """One workspace per rank: ordinary allocations, each rank's peer tables listing every
    rank's buffer (the same list on every rank, as with symmetric memory)."""
    ep_size = host.size
    owned = [
        {n: torch.zeros(shape, dtype=dtype, device=device) for n, dtype, shape in
         symmetric_buffers(ep_size, sizes)}
        for _ in range(ep_size)
    ]  # fmt: skip
    pointers = {n: [rank_buffers[n].data_ptr() for rank_buffers in owned] for n in owned[0]}
    workspaces = []
    for rank, rank_buffers in enumerate(owned):
        fields = {}
        for n, tensor in rank_buffers.items():
            fields.update({n: tensor, f"{n}_handle": None, f"{n}_ptrs": list(pointers[n])})
        tables = {}
        if device.type == "cuda":
            tables = {
                n: torch.tensor(p, dtype=torch.int64, device=device) for n, p in pointers.items()
            }
        identity = (name, rank, ep_size)
        workspaces.append(assemble(config, identity, device, sizes, fields, tables, host))
    return workspaces


def _raise_first(errors: list[BaseException | None]) -> None:
    """Raise the error of the lowest rank that failed on its own (a released HostGroupError is
    what the other ranks saw of it), noting which rank it came from."""
    failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
    if not failed:
        return
    own = [(rank, e) for rank, e in failed if not getattr(e, "released", False)]
    rank, error = (own or failed)[0]
    error.add_note(f"raised on rank {rank} of a one-device EP group of {len(errors)}")
    raise error
