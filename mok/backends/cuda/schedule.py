"""The routed-row schedule on the GPU (csrc/schedule/schedule.cu): same contract and bits as
`mok.backends.reference.schedule`, no host synchronisation, capturable in a CUDA graph.

Torch allocates the outputs and the kernels' scratch; the extension gets their addresses and the
current stream. Capacity overflow is reported by OR-ing `mok.status.CAPACITY_OVERFLOW` into
`status`, never by a trap.
"""

from __future__ import annotations

import torch

from mok._arguments import check_multiple, check_range, check_tensor
from mok.backends.cuda import extension as _extension

# csrc/schedule/schedule.h kMaxLocalExperts: the place kernel keeps one shared int32 counter per
# local expert and warp in 32 KiB (a CPU test keeps the two equal).
MAX_LOCAL_EXPERTS = 8192
_INT32_MAX = 2**31 - 1


def _check(topk_all, num_local_experts, capacity, rank, status) -> None:
    check_tensor(
        "topk_all",
        topk_all,
        dtype=torch.int32,
        shape=(None, None, None),
        dims=("EP", "T", "k"),
        contiguous=False,
    )
    if not topk_all.is_cuda:
        raise ValueError(f"`topk_all` must be on a CUDA device, got {topk_all.device}")
    check_tensor("status", status, dtype=torch.int32, shape=(1,), device=topk_all.device)
    ep, tokens, topk = topk_all.shape
    check_range("EP (topk_all.shape[0])", ep, 1, 65535)
    check_range("T * k (routes per source)", tokens * topk, 0, _INT32_MAX)
    check_range("num_local_experts", num_local_experts, 1, MAX_LOCAL_EXPERTS)
    check_multiple("capacity", capacity, 256, minimum=256)
    check_range("capacity", capacity, 256, _INT32_MAX)
    check_range("rank", rank, 0, ep - 1)


def routing(ids: torch.Tensor, num_experts: int, status: torch.Tensor) -> torch.Tensor:
    """int32 [T, k]: the global expert ids `ids` (int64 [T, k], CUDA), -1 where outside
    [0, num_experts); `mok.status.INVALID_EXPERT_ID` is OR-ed into `status` if any is. Same bits
    as `mok.backends.reference.routing`, in one kernel, asynchronous on the current stream."""
    check_tensor("ids", ids, dtype=torch.int64, shape=(None, None), dims=("T", "k"),
                 contiguous=False)  # fmt: skip
    if not ids.is_cuda:
        raise ValueError(f"`ids` must be on a CUDA device, got {ids.device}")
    check_tensor("status", status, dtype=torch.int32, shape=(1,), device=ids.device)
    check_range("num_experts", num_experts, 1, _INT32_MAX)
    return launch_routing(ids, num_experts, status)


def launch_routing(ids: torch.Tensor, num_experts: int, status: torch.Tensor) -> torch.Tensor:
    """`routing` on arguments an entry point has checked (the registry's face: the functional
    API and the flat ops check theirs first; docs/compat-edge.md)."""
    ids = ids.contiguous()
    out = torch.empty(ids.shape, dtype=torch.int32, device=ids.device)
    _extension.launch(
        ids.device,
        "routing",
        ids=ids.data_ptr() if ids.numel() else 0,
        routing=out.data_ptr() if ids.numel() else 0,
        status=status.data_ptr(),
        routes=ids.numel(),
        num_experts=num_experts,
    )
    return out


def schedule(
    topk_all: torch.Tensor,
    num_local_experts: int,
    capacity: int,
    rank: int,
    status: torch.Tensor,
    route_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The schedule of destination `rank` (order: `mok.backends.reference.schedule`).

    | argument / output  | dtype | shape      | notes                                         |
    |--------------------|-------|------------|-----------------------------------------------|
    | topk_all           | int32 | [EP, T, k] | global expert ids on a CUDA device, any value |
    | status             | int32 | [1]        | CAPACITY_OVERFLOW is OR-ed in on overflow     |
    | peer_rank          | int32 | [C]        | source rank per row, -1 on padding            |
    | peer_token_idx     | int32 | [C]        | token * k + slot on the source, -1 on padding |
    | num_tokens         | int32 | [1]        | rows in use, a multiple of 256, <= C          |
    | tokens_per_expert  | int32 | [E]        | padded rows per local expert, cut at C        |
    | route_rows         | int32 | [T * k]    | optional, filled: each of `rank`'s own routes' |
    |                    |       |            | row, -1 for a route placed elsewhere or cut   |

    C = `capacity` (a multiple of 256), E = `num_local_experts` (at most 8192), `rank` in
    [0, EP). Asynchronous on the current stream; NotImplementedError if no module serves the
    device.
    """
    _check(topk_all, num_local_experts, capacity, rank, status)
    if route_rows is not None:
        routes = topk_all.shape[1] * topk_all.shape[2]
        check_tensor("route_rows", route_rows, dtype=torch.int32, shape=(routes,),
                     dims=("T * k",), device=topk_all.device)  # fmt: skip
    return launch_schedule(topk_all, num_local_experts, capacity, rank, status, route_rows)


def launch_schedule(topk_all, num_local_experts, capacity, rank, status, route_rows=None):
    """`schedule` on arguments an entry point has checked (the registry's face, as
    launch_routing)."""
    topk_all = topk_all.contiguous()
    ep, tokens, topk = topk_all.shape
    outputs, scratch = _outputs(topk_all.device, ep, tokens * topk, num_local_experts, capacity)
    _launch_schedule(topk_all, outputs, scratch, capacity, rank, status, route_rows)
    return outputs


def launch_local_schedule(ids: torch.Tensor, num_experts: int, capacity: int, status):
    """The schedule of a one-rank group straight from its int64 ids [T, k] (checked by the
    entry), as mok.backends.reference.schedule.local_schedule: the four outputs of `schedule`,
    the routing `routing` would write (int32 [T, k]) and the route rows (int32 [T * k]). The
    count kernel writes the routing as it reads the ids, so the routing takes no launch."""
    ids = ids.contiguous()
    routes = ids.numel()
    outputs, scratch, routing, route_rows = _outputs(
        ids.device, 1, routes, num_experts, capacity, extra=(routes, routes), one_block=True
    )
    _launch_schedule(routing.view(1, routes), outputs, scratch, capacity, 0, status, route_rows,
                     ids=ids)  # fmt: skip
    return (*outputs, routing.view(ids.shape), route_rows)


# Each part of the outputs' one allocation starts 256 bytes after the last (int32 elements).
_PART_ALIGNMENT = 64


def _outputs(device, ep: int, routes: int, experts: int, capacity: int, extra=(), *,
             one_block: bool = False):  # fmt: skip
    """(peer_rank [C], peer_token_idx [C], num_tokens [1], tokens_per_expert [E]), the kernels'
    scratch and an int32 tensor of each size in `extra`. With `one_block`, views of one
    allocation: one call to the allocator on the host's way to the first GEMM instead of one a
    tensor. Not for the flat op `mok::schedule`, whose outputs may alias nothing (torch's rule
    for custom ops)."""
    module = _extension.module_for_device(device)
    scratch_bytes = module.schedule_workspace_bytes(ep, routes, experts)
    sizes = (capacity, capacity, 1, experts, -(-scratch_bytes // 4), *extra)
    if one_block:
        parts = _views_of_one_block(device, sizes)
    else:
        parts = [torch.empty(size, dtype=torch.int32, device=device) for size in sizes]
    return (tuple(parts[:4]), parts[4], *parts[5:])


def _views_of_one_block(device, sizes) -> list[torch.Tensor]:
    """An int32 tensor of each size, each part 256-byte aligned, all in one allocation."""
    starts, end = [], 0
    for size in sizes:
        starts.append(end)
        end += -(-size // _PART_ALIGNMENT) * _PART_ALIGNMENT
    block = torch.empty(end, dtype=torch.int32, device=device)
    return [block[start : start + size] for start, size in zip(starts, sizes, strict=True)]


def _launch_schedule(topk_all, outputs, scratch, capacity, rank, status, route_rows, ids=None):
    ep, routes = topk_all.shape[0], topk_all[0].numel()
    peer_rank, peer_token_idx, num_tokens, tokens_per_expert = outputs
    _extension.launch(
        topk_all.device,
        "schedule",
        topk_all=topk_all.data_ptr() if routes else 0,
        peer_rank=peer_rank.data_ptr(),
        peer_token_idx=peer_token_idx.data_ptr(),
        num_tokens=num_tokens.data_ptr(),
        tokens_per_expert=tokens_per_expert.data_ptr(),
        status=status.data_ptr(),
        workspace=scratch.data_ptr(),
        ep=ep,
        routes=routes,
        experts=tokens_per_expert.shape[0],
        capacity=capacity,
        rank=rank,
        route_rows=route_rows.data_ptr() if route_rows is not None and routes else 0,
        ids=ids.data_ptr() if ids is not None and routes else 0,
    )
