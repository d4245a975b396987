"""The host side of an EP group whose ranks are threads of one process (mok.testing.OneDeviceGroup).

A workspace of such a group carries this object as `MoKWorkspace.host_group`; a workspace of a
torch.distributed group has None there. Three things use it:

- the reference backend's exchanges gather tensors through `all_gather` instead of
  torch.distributed (mok.backends.reference.exchange);
- the CUDA barrier launches through `lockstep`, so the N ranks' barrier kernels are enqueued
  together: streams that share one hardware queue then never hold a rank's barrier behind another
  rank's waiting one (docs/one-device-group.md);
- the CUDA engine's background exchanges run on the rank's own comm stream (`comm_streams`).

Every host wait is bounded (`timeout_s`); a rank that fails breaks the group's rendezvous, so the
other ranks get a clear error instead of waiting for it.
"""

from __future__ import annotations

import threading

import torch


class HostGroupError(RuntimeError):
    """A rank of a one-process EP group failed, or the ranks fell out of step. `released` is True
    for what a rank sees when the group's rendezvous was broken by another rank's error."""

    def __init__(self, message: str, *, released: bool = False):
        super().__init__(message)
        self.released = released


class HostGroup:
    """Rendezvous, gathers and per-rank streams for `size` ranks that are threads of one process."""

    def __init__(self, size: int, device: torch.device, timeout_s: float):
        self.size, self.device, self.timeout_s = size, device, timeout_s
        self._rendezvous = threading.Barrier(size, timeout=timeout_s)
        self._slots: list[tuple[str, torch.Tensor] | None] = [None] * size
        self._thread = threading.local()
        self.comm_streams: list[torch.cuda.Stream] = []
        if device.type == "cuda":
            highest = torch.cuda.Stream.priority_range()[1]
            self.comm_streams = [torch.cuda.Stream(device, priority=highest) for _ in range(size)]

    def enter(self, rank: int) -> None:
        """Mark the calling thread as rank `rank` (OneDeviceGroup.run does, once per thread)."""
        self._thread.rank = rank

    @property
    def rank(self) -> int:
        rank = getattr(self._thread, "rank", None)
        if rank is None:
            raise HostGroupError(
                "this thread is no rank of the one-device group: call its ops inside "
                "OneDeviceGroup.run(step)"
            )
        return rank

    def reset(self) -> None:
        """Make a broken rendezvous usable again (between two OneDeviceGroup.run calls)."""
        self._rendezvous.reset()

    def abort(self) -> None:
        """Release every rank waiting in the group with a HostGroupError (a rank has failed)."""
        self._rendezvous.abort()

    def wait(self) -> None:
        """Every rank reaches this point, or HostGroupError within `timeout_s`."""
        try:
            self._rendezvous.wait()
        except threading.BrokenBarrierError:
            raise HostGroupError(
                f"rank {self.rank} of a one-device EP group of {self.size}: another rank failed "
                f"or did not reach the same collective within {self.timeout_s} s (every rank "
                "must call the same mok functions in the same order)",
                released=True,
            ) from None

    def lockstep(self, launch) -> None:
        """Run `launch` (one rank's barrier kernel launch) once every rank is ready to launch its
        own, and return once every rank has: the N launches are enqueued back to back."""
        self.wait()
        try:
            launch()
        except BaseException:
            self.abort()
            raise
        self.wait()

    def all_gather(self, tensor: torch.Tensor, label: str) -> torch.Tensor:
        """[size, *tensor.shape]: every rank's `tensor`, in rank order (a host rendezvous; each
        rank's stream is synchronised, so its tensor is complete before a peer reads it).
        `label` names what is gathered; ranks that gather different labels, shapes or dtypes
        are out of step, and every one of them raises."""
        self._synchronize()
        self._slots[self.rank] = (label, tensor.contiguous())
        self.wait()
        kinds = {(name, tuple(t.shape), t.dtype) for name, t in self._slots}
        if len(kinds) != 1:
            raise HostGroupError(
                "the ranks of a one-device EP group are out of step: they gathered "
                f"{sorted(map(str, kinds))} at the same point (every rank must call the same "
                "mok functions in the same order, with the same sizes)"
            )
        gathered = torch.stack([t for _, t in self._slots])
        self._synchronize()
        self.wait()  # every rank has read the slots before any rank writes them again
        return gathered

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
