"""MoKWorkspace: the per-group buffers every pass reuses, and the workspace cache.

On CUDA the cross-rank buffers come from PyTorch symmetric memory (peer pointers in
`<name>_ptrs`, no multicast). Elsewhere (the reference backend on CPU) they are ordinary
tensors and the pointer lists hold zeros; the reference moves data with torch.distributed.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from enum import StrEnum

import torch
import torch.distributed as dist

from mok import settings
from mok._arguments import check_multiple, check_range, check_type, describe
from mok.config import MoKConfig
from mok.host_group import HostGroup

MAX_EP_SIZE = 72
MAX_TOPK = 255


class Buffer(StrEnum):
    """The symmetric buffers a pass reads from its peers or writes into theirs: what the passes
    name when they ask an engine to exchange rows (each is the MoKWorkspace field of its value,
    with `<value>_ptrs` the peers' addresses)."""

    X = "x_buffer"
    D_Y = "d_y_buffer"
    ROUTER_WEIGHT = "router_weight_buffer"
    COMBINE = "combine_buffer"
    D_X_ROUTED = "d_x_routed_buffer"
    D_ROUTER_WEIGHT = "d_router_weight_buffer"


# name -> (dtype, shape as a function of (EP, T, H, k)); all are symmetric across the group.
_SYMMETRIC_BUFFERS = {
    "x_buffer": (torch.bfloat16, lambda ep, t, h, k: (t, h)),
    "combine_buffer": (torch.bfloat16, lambda ep, t, h, k: (t * k, h)),
    "d_y_buffer": (torch.bfloat16, lambda ep, t, h, k: (t, h)),
    "d_x_routed_buffer": (torch.bfloat16, lambda ep, t, h, k: (t * k, h)),
    "router_weight_buffer": (torch.float32, lambda ep, t, h, k: (t, k)),
    "d_router_weight_buffer": (torch.float32, lambda ep, t, h, k: (t, k)),
    "all_gather_top_experts_buffer": (torch.int32, lambda ep, t, h, k: (ep, t, k)),
    # Epochs [ep], two rows of tags and two of status words [2, ep] each (csrc/comm/comm.h).
    "barrier_buffer": (torch.int32, lambda ep, t, h, k: (5 * ep,)),
    # mok: every rank's (status word, num_local_experts), so all ranks reach one verdict per step
    # (mok.status.combine)
    "status_gather_buffer": (torch.int32, lambda ep, t, h, k: (ep, 2)),
}


@dataclass(slots=True, weakref_slot=True)
class MoKWorkspace:
    """Buffers shared by all MoE layers of a model on one EP group (see API.md)."""

    group_name: str
    ep_rank: int
    ep_size: int
    device: torch.device
    num_local_tokens: int
    hidden_size: int
    topk: int
    schedule_capacity: int
    x_buffer: torch.Tensor
    x_buffer_handle: object
    x_buffer_ptrs: list[int]
    combine_buffer: torch.Tensor
    combine_buffer_handle: object
    combine_buffer_ptrs: list[int]
    d_y_buffer: torch.Tensor
    d_y_buffer_handle: object
    d_y_buffer_ptrs: list[int]
    d_x_routed_buffer: torch.Tensor
    d_x_routed_buffer_handle: object
    d_x_routed_buffer_ptrs: list[int]
    router_weight_buffer: torch.Tensor
    router_weight_buffer_handle: object
    router_weight_buffer_ptrs: list[int]
    d_router_weight_buffer: torch.Tensor
    d_router_weight_buffer_handle: object
    d_router_weight_buffer_ptrs: list[int]
    all_gather_top_experts_buffer: torch.Tensor
    all_gather_top_experts_buffer_handle: object
    all_gather_top_experts_buffer_ptrs: list[int]
    barrier_buffer: torch.Tensor
    barrier_buffer_handle: object
    barrier_buffer_ptrs: list[int]
    # Epoch counter of the flag barrier: flags are compared against it, so no buffer is cleared.
    barrier_target: torch.Tensor
    # mok: device status word (see mok.status); check_status raises what it records. Made
    # here when a caller builds a workspace with the original's fields alone.
    status: torch.Tensor | None = None
    # The original's multicast fields: mok never uses multicast, so they hold 0, which every op
    # that takes one accepts and ignores.
    all_gather_top_experts_buffer_multicast_ptr: int = 0
    barrier_buffer_multicast_ptr: int = 0
    capacity_multiplier: float = field(default=0.5)
    # mok: `<name>_ptrs` of every symmetric buffer as an int64 [EP] device tensor, built once at
    # creation so CUDA kernels index peers on the device (empty off CUDA).
    peer_ptr_tables: dict[str, torch.Tensor] = field(default_factory=dict)
    # mok: where every rank's status word is gathered; None in a workspace built with the
    # original's fields alone, whose ranks then keep their own verdicts.
    status_gather_buffer: torch.Tensor | None = None
    status_gather_buffer_handle: object = None
    status_gather_buffer_ptrs: list[int] = field(default_factory=list)
    # mok: the host side of a group whose ranks are threads of one process (mok.testing);
    # None for a torch.distributed group.
    host_group: HostGroup | None = None

    def __post_init__(self) -> None:
        if self.status is None:  # built with the original's fields alone
            self.status = torch.zeros(1, dtype=torch.int32, device=self.device)

    def schedule_rows(self, num_local_experts: int) -> int:
        """Rows of a schedule: the capacity (never more than the EP * T * k routes there are),
        rounded up to 256, plus 256 per local expert, so the 256-row padding of the expert
        segments can never overflow (only real routes can, when schedule_capacity_multiplier
        < 1 and routing is skewed)."""
        routes = self.ep_size * self.num_local_tokens * self.topk
        return -(-min(self.schedule_capacity, routes) // 256) * 256 + 256 * num_local_experts


def _require_initialized() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "torch.distributed is not initialised: call torch.distributed.init_process_group "
            "(gloo for CPU tensors, nccl for CUDA) before creating a mok workspace"
        )


def as_device(device) -> torch.device:
    """A CPU (gloo, reference backend) or CUDA device; anything else is named in the error."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"`device` must name a CPU or CUDA device, got {device!r}") from error
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"`device` must be a CPU or CUDA device, got {device}")
    if device.type == "cpu" and device.index not in (None, 0):
        raise ValueError(f"`device` must be 'cpu' (there is one CPU device), got {device}")
    return device


def validate_workspace_args(
    config: MoKConfig,
    group: dist.ProcessGroup | None,
    *,
    device: torch.device | str,
    num_local_tokens: int,
    hidden_size: int,
    topk: int,
) -> tuple[dist.ProcessGroup, torch.device]:
    """Check the arguments of create_workspace/get_workspace (and every MOK_* variable); return
    the group and device."""
    check_type("config", config, MoKConfig)
    settings.check_all()
    _require_initialized()
    group = dist.group.WORLD if group is None else group
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"`group` must be a torch.distributed ProcessGroup, got {describe(group)}")
    check_range("ep_size (the group's size)", dist.get_world_size(group), 1, MAX_EP_SIZE)
    device = workspace_device(config, device)
    check_sizes(num_local_tokens, hidden_size, topk)
    return group, device


def workspace_device(config: MoKConfig, device) -> torch.device:
    """`device` as a torch.device with its index, checked against the config (its SM count)."""
    device = as_device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda":
        config.check_device(torch.cuda.get_device_properties(device).multi_processor_count)
    return device


def check_sizes(num_local_tokens: int, hidden_size: int, topk: int) -> None:
    check_multiple("num_local_tokens", num_local_tokens, 1)
    check_multiple("hidden_size", hidden_size, 128)
    check_range("topk", topk, 1, MAX_TOPK)


def _allocate(name: str, shape: tuple[int, ...], dtype: torch.dtype, device, group, ep_size):
    """Allocate one cross-rank buffer; symmetric memory with peer pointers on CUDA."""
    if device.type != "cuda":
        return torch.zeros(shape, dtype=dtype, device=device), None, [0] * ep_size
    from torch.distributed import _symmetric_memory as symm_mem

    buffer = symm_mem.empty(shape, dtype=dtype, device=device)
    buffer.zero_()
    handle = symm_mem.rendezvous(buffer, group)
    # buffer_ptrs are the peers' allocation bases; symmetric memory's pool can place the tensor
    # at an offset inside its allocation (the same on every rank: _peer_tables checks it).
    offset = buffer.data_ptr() - int(handle.buffer_ptrs[handle.rank])
    return buffer, handle, [int(p) + offset for p in handle.buffer_ptrs]


def _peer_tables(buffers: dict, group, device: torch.device) -> dict[str, torch.Tensor]:
    """`<name>_ptrs` as int64 [EP] device tensors, after checking that every rank placed each
    buffer at the same offset of its allocation and that every address is 16-byte aligned."""
    if device.type != "cuda":
        return {}
    names = list(_SYMMETRIC_BUFFERS)
    offsets = [
        buffers[n].data_ptr() - int(buffers[f"{n}_handle"].buffer_ptrs[dist.get_rank(group)])
        for n in names
    ]
    mine = torch.tensor(offsets, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    for rank, theirs in enumerate(gathered):
        for name, a, b in zip(names, offsets, theirs.tolist(), strict=True):
            if a != b:
                raise RuntimeError(
                    f"symmetric buffer `{name}` sits at offset {a} of its allocation on this "
                    f"rank but {b} on rank {rank}: create workspaces in the same order everywhere"
                )
    for name in names:
        if any(p % 16 for p in buffers[f"{name}_ptrs"]):
            raise RuntimeError(f"symmetric buffer `{name}` is not 16-byte aligned on every rank")
    return {n: torch.tensor(buffers[f"{n}_ptrs"], dtype=torch.int64, device=device) for n in names}


def _check_agreement(group, device, config: MoKConfig, sizes: tuple[int, int, int]) -> None:
    """One collective at creation: every rank must pass the same T, H and k and the same
    schedule_capacity_multiplier (the capacity every rank's schedule is cut to)."""
    multiplier = torch.tensor([config.schedule_capacity_multiplier], dtype=torch.float64)
    mine = torch.tensor([*sizes, int(multiplier.view(torch.int64))], dtype=torch.int64)
    mine = mine.to(device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    for rank, theirs in enumerate(gathered):
        if not torch.equal(theirs[:3], mine[:3]):
            raise ValueError(
                "every rank must pass the same (num_local_tokens, hidden_size, topk): "
                f"this rank has {sizes}, rank {rank} has {tuple(theirs[:3].tolist())}"
            )
        if not torch.equal(theirs, mine):
            their_multiplier = float(theirs[3:].cpu().view(torch.float64))
            raise ValueError(
                "every rank must use the same MoKConfig.schedule_capacity_multiplier: this rank "
                f"has {config.schedule_capacity_multiplier}, rank {rank} has {their_multiplier}"
            )


def _validated(config, group, device, sizes: tuple[int, int, int]):
    tokens, hidden, topk = sizes
    return validate_workspace_args(
        config, group, device=device, num_local_tokens=tokens, hidden_size=hidden, topk=topk
    )


def create_workspace(
    config: MoKConfig,
    group: dist.ProcessGroup | None,
    *,
    device: torch.device | str,
    num_local_tokens: int,
    hidden_size: int,
    topk: int,
) -> MoKWorkspace:
    """Create a new, uncached workspace owned by the caller. Collective over `group`."""
    sizes = (num_local_tokens, hidden_size, topk)
    group, device = _validated(config, group, device, sizes)
    return _create(config, group, device, sizes)


def _create(config: MoKConfig, group, device: torch.device, sizes: tuple[int, int, int]):
    """Allocate and register a workspace from validated arguments."""
    _check_agreement(group, device, config, sizes)
    ep_size = dist.get_world_size(group)
    buffers: dict[str, object] = {}
    for name, dtype, shape in symmetric_buffers(ep_size, sizes):
        tensor, handle, ptrs = _allocate(name, shape, dtype, device, group, ep_size)
        buffers.update({name: tensor, f"{name}_handle": handle, f"{name}_ptrs": ptrs})
    rank = (group.group_name, dist.get_rank(group), ep_size)
    tables = _peer_tables(buffers, group, device)
    workspace = assemble(config, rank, device, sizes, buffers, tables)
    return _register(workspace) if device.type == "cuda" else workspace


def assemble(config, rank, device, sizes, buffers, peer_ptr_tables, host_group=None):
    """A MoKWorkspace from allocated buffers (`<name>`, `<name>_handle`, `<name>_ptrs` for every
    cross-rank buffer); `rank` is (group name, rank, group size), `sizes` (T, H, k)."""
    group_name, ep_rank, ep_size = rank
    num_local_tokens, hidden_size, topk = sizes
    return MoKWorkspace(
        group_name=group_name,
        ep_rank=ep_rank,
        ep_size=ep_size,
        device=device,
        num_local_tokens=num_local_tokens,
        hidden_size=hidden_size,
        topk=topk,
        schedule_capacity=config.schedule_capacity(ep_size, num_local_tokens, topk),
        barrier_target=torch.zeros(1, dtype=torch.int32, device=device),
        status=torch.zeros(1, dtype=torch.int32, device=device),
        capacity_multiplier=config.schedule_capacity_multiplier,
        peer_ptr_tables=peer_ptr_tables,
        host_group=host_group,
        **buffers,
    )


def symmetric_buffers(ep_size: int, sizes: tuple[int, int, int]):
    """(name, dtype, shape) of every cross-rank buffer of a group of `ep_size` ranks."""
    for name, (dtype, shape_of) in _SYMMETRIC_BUFFERS.items():
        yield name, dtype, shape_of(ep_size, *sizes)


# The compatibility edge's one lookup. The original's flat ops name their workspace only
# through the buffers (and pointer lists) they are given, so the live CUDA workspaces are listed
# here in creation order (the same on every rank); nothing inside mok looks them up.
_LIVE: list[weakref.ReferenceType[MoKWorkspace]] = []


def workspace_for(group_name: str, name: str, tensor: torch.Tensor, ptrs=None):
    """The live CUDA workspace whose buffer `name` a flat op was given: the one whose pointer
    list is `ptrs` (the original's identity of a symmetric buffer; under torch.compile the
    tensor may be a functional copy, the list is not). An op without a pointer list gets the
    oldest workspace of `group_name` ("" names the default group) whose buffer has `tensor`'s
    shape, dtype and device: every rank creates its workspaces in the same order, so all ranks
    pick the same one. None if there is none."""
    _LIVE[:] = [ref for ref in _LIVE if ref() is not None]
    live = [ws for ws in (ref() for ref in _LIVE) if ws is not None]
    if ptrs is not None:
        wanted = [int(p) for p in ptrs]
        return next((w for w in live if getattr(w, f"{name}_ptrs") == wanted), None)
    if not group_name and dist.is_initialized():
        group_name = dist.group.WORLD.group_name
    same_group = (w for w in live if w.group_name == group_name)
    return next((w for w in same_group if same_layout(getattr(w, name), tensor)), None)


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b could be one another: same shape, dtype and device."""
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


def _register(workspace: MoKWorkspace) -> MoKWorkspace:
    _LIVE.append(weakref.ref(workspace))
    return workspace


_CACHE: dict[tuple, tuple[MoKWorkspace, dist.ProcessGroup]] = {}


def get_workspace(
    config: MoKConfig,
    group: dist.ProcessGroup | None,
    *,
    device: torch.device | str,
    num_local_tokens: int,
    hidden_size: int,
    topk: int,
) -> MoKWorkspace:
    """Like create_workspace, but cached per (group, device, T, H, k, capacity multiplier)."""
    sizes = (num_local_tokens, hidden_size, topk)
    group, device = _validated(config, group, device, sizes)
    key = (group.group_name, device.type, device.index, *sizes, config.schedule_capacity_multiplier)
    if key not in _CACHE:
        _CACHE[key] = (_create(config, group, device, sizes), group)
    return _CACHE[key][0]


def clear_workspace_cache() -> None:
    """Synchronise every cached workspace's group, then drop the cached workspaces."""
    for _, group in list(_CACHE.values()):
        dist.barrier(group=group)
    _CACHE.clear()
