"""The reference backend's engine for mok.passes: collectives and masked fp32 GEMMs."""

from __future__ import annotations

import torch

from mok import experts
from mok import status as device_status
from mok.backends.reference import exchange
from mok.workspace import Buffer


def group_of(workspace):
    """The exchanges' name for the workspace's group: its host group if its ranks are threads of
    one process, else its torch.distributed group's name."""
    return workspace.host_group or workspace.group_name


# The workspace buffers the passes read and write.
PASS_BUFFERS = tuple(Buffer)


class ReferenceEngine:
    """The reference backend's side of mok.passes: collectives and masked fp32 GEMMs.

    `buffers` maps the workspace buffer names the passes use (x_buffer, d_y_buffer,
    router_weight_buffer, combine_buffer, d_x_routed_buffer, d_router_weight_buffer) to this
    rank's tensors; `group` names the EP group (mok.backends.reference.exchange). With a
    `status` word, every rank's word is ORed into each rank's after a pass's pushes, so what one
    rank recorded in a pass (a schedule it had to contain) is every rank's verdict, as the CUDA
    barriers make it.
    """

    def __init__(self, buffers: dict[str, torch.Tensor], topk: int, group, status=None, *,
                 local_only: bool = False):  # fmt: skip
        self.buffers, self.topk, self.group, self.status = buffers, topk, group, status
        self.kept: dict[str, torch.Tensor] = {}  # rows a pass kept instead of pushing
        self.local_only = local_only  # EP 1: the pulls may read the caller's tensors in place

    @classmethod
    def of_workspace(cls, workspace) -> ReferenceEngine:
        buffers = {name: getattr(workspace, name) for name in PASS_BUFFERS}
        status = workspace.status if workspace.ep_size > 1 else None
        return cls(buffers, workspace.topk, group_of(workspace), status,
                   local_only=workspace.ep_size == 1)  # fmt: skip

    @property
    def dispatch_is_local(self) -> bool:
        """Whether the dispatch reads this rank's rows alone (EP 1)."""
        return self.local_only

    def use_sources(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """As the CUDA engine's: at EP 1 the pulls read the caller's tensors in place; beyond
        it they are copied into the buffers the peers read. Returns what the pass reads."""
        for name, tensor in tensors.items():
            if self.local_only:
                self.buffers[name] = tensor
            else:
                self.buffers[name].copy_(tensor)
        return {name: self.buffers[name] for name in tensors}

    # The collectives complete in call order and synchronise themselves, so `background` and
    # `sync` change nothing here.
    def pull(self, name: str, schedule, background=False, *, sync=(True, True)) -> torch.Tensor:
        source = self.buffers[name]
        return exchange.pull_rows(source, schedule[0], schedule[1], self.topk, self.group, name)

    def pull_beside(self, name: str, schedule, gemm, *, sync=(True, True)):
        """The rows pulled now, and no pull for the GEMMs to run beside them."""
        return self.pull(name, schedule, sync=sync), None

    def pull_rounded(self, name: str, schedule, gemm, background=False, *, sync=(True, True)):
        rounded = gemm.mx_round_both(self.pull(name, schedule))
        return lambda: rounded

    def pull_rounded_rows(
        self, name: str, schedule, gemm, row_weights, background=False, *, sync=(True, True)
    ):
        rounded = experts.mx_round_d_out(gemm, self.pull(name, schedule), row_weights)
        return lambda: rounded

    def pull_router_weights(self, schedule, background=False, *, sync=(True, True)):
        weights = self.buffers[Buffer.ROUTER_WEIGHT]
        return exchange.pull_router_weights(weights, schedule[0], schedule[1], self.group)

    def push_all(self, pushes, schedule, background: bool = False) -> None:
        for rows, name in pushes:
            destination = self.buffers[name].view(-1, *rows.shape[1:])
            exchange.push_rows(rows, schedule.peer_rank, schedule.peer_token_idx, destination,
                               self.group, name)  # fmt: skip
        if self.status is not None:
            words = exchange.all_gather(self.status, self.group, "status word")
            device_status.or_words(self.status, words.flatten())

    @staticmethod
    def join() -> None:
        return None

    @staticmethod
    def hand_back_pushed() -> None:
        """The collectives write the given tensors themselves: nothing to copy."""
        return None

    @staticmethod
    def routed_gemms(schedule, num_experts: int) -> experts.MaskedGemms:
        rows = schedule[0].shape[0]
        return experts.MaskedGemms(experts.row_experts(schedule[3], schedule[2], rows), num_experts)

    def shared_gemms(self, tokens: int) -> experts.MaskedGemms:
        device = self.buffers[Buffer.X].device
        return experts.MaskedGemms(torch.zeros(tokens, dtype=torch.int64, device=device), 1)
