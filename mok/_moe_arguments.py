"""Validators for the arguments of the passes, one per kind of argument (see API.md).

Both `mok.functional` and the `mok.ops` custom ops call these, so a check lives in one place.
"""

from __future__ import annotations

import math

import torch

from mok import macrobatch
from mok._arguments import check_range, check_tensor, describe
from mok.workspace import MAX_TOPK

BF16, FP8, U8 = torch.bfloat16, torch.float8_e4m3fn, torch.uint8


def check_limit(swiglu_limit: float | None) -> None:
    if swiglu_limit is None:
        return
    if isinstance(swiglu_limit, bool) or not isinstance(swiglu_limit, int | float):
        raise TypeError(f"`swiglu_limit` must be None or a float, got {describe(swiglu_limit)}")
    if not (math.isfinite(swiglu_limit) and swiglu_limit >= 0):
        raise ValueError(f"`swiglu_limit` must be finite and >= 0, got {swiglu_limit}")


def check_schedule(peer_rank, peer_token_idx, num_tokens, tokens_per_expert, device):
    """Returns (capacity C, local experts E)."""
    i32 = torch.int32
    peer_rank = check_tensor(
        "schedule_peer_rank", peer_rank, dtype=i32, shape=(None,), dims=("C",), device=device
    )
    capacity = peer_rank.shape[0]
    if capacity % 256:
        raise ValueError(f"`schedule_peer_rank` length must be a multiple of 256, got {capacity}")
    check_tensor(
        "schedule_peer_token_idx",
        peer_token_idx,
        dtype=i32,
        shape=(capacity,),
        dims=("C",),
        device=device,
    )
    check_tensor("num_tokens", num_tokens, dtype=i32, shape=(1,), device=device)
    check_tensor(
        "tokens_per_expert", tokens_per_expert, dtype=i32, shape=(None,), dims=("E",), device=device
    )
    return capacity, tokens_per_expert.shape[0]


def _shapes(num_experts, inter, hidden):
    return {
        "gate": ((num_experts, inter, hidden), ("E", "I", "H")),
        "up": ((num_experts, inter, hidden), ("E", "I", "H")),
        "down": ((num_experts, hidden, inter), ("E", "H", "I")),
    }


def check_shared(shared, hidden: int, inter: int, device) -> None:
    """shared = (gate, up, down): bf16 gate/up [I, H] and down [H, I] with the routed experts' I,
    or all None (no shared expert)."""
    if all(w is None for w in shared):
        return
    if any(w is None for w in shared):
        names = [f"`shared_{name}_weights`" for name in ("gate", "up", "down")]
        missing = ", ".join(n for n, w in zip(names, shared, strict=True) if w is None)
        raise ValueError(
            f"{missing} None but not the others: the shared expert's weights must be all "
            "None (no shared expert) or all tensors"
        )
    for (name, (shape, dims)), weight in zip(
        _shapes(1, inter, hidden).items(), shared, strict=True
    ):
        check_tensor(
            f"shared_{name}_weights",
            weight,
            dtype=BF16,
            shape=shape[1:],
            dims=dims[1:],
            device=device,
        )


def check_routed_bf16(routed, hidden: int, device, num_experts=None) -> tuple[int, int]:
    """routed = (gate, up, down) bf16 with `num_experts` (None: any) local experts. Returns
    (E, I)."""
    gate = check_tensor(
        "routed_gate_weights",
        routed[0],
        dtype=BF16,
        shape=(None, None, hidden),
        dims=("E", "I", "H"),
        device=device,
    )
    _check_experts(gate.shape[0], num_experts, gate)
    num_experts, inter = gate.shape[0], gate.shape[1]
    _check_inter(inter)
    for (name, (shape, dims)), weight in zip(
        _shapes(num_experts, inter, hidden).items(), routed, strict=True
    ):
        check_tensor(
            f"routed_{name}_weights", weight, dtype=BF16, shape=shape, dims=dims, device=device
        )
    return num_experts, inter


def _check_experts(found: int, expected: int | None, gate_data: torch.Tensor) -> None:
    """The gate weights, read first, fix E for the other two: checked against the schedule's
    first, so a mismatch names the gate rather than the weight checked after it."""
    if expected is not None and found != expected:
        raise ValueError(
            f"`routed_gate_weights` holds {found} local experts ({describe(gate_data)}) but "
            f"`schedule` was built for num_local_experts={expected}"
        )


def _check_inter(inter: int) -> None:
    if inter < 128 or inter % 128:
        raise ValueError(f"intermediate size I must be a positive multiple of 128, got {inter}")


def scale_shape(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Swizzled MXFP8 scale shape for data [E, R, C] or [R, C] quantized along C."""
    *lead, rows, cols = shape
    return (math.prod(lead) * rows // 128, cols // 128, 32, 16)


def check_mx_pair(name: str, pair, shape, dims, device) -> None:
    """An (fp8 data, swizzled uint8 scales) pair from ops.mxfp8_quantize."""
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        raise TypeError(f"`{name}` must be a (fp8, scale) tuple, got {describe(pair)}")
    check_tensor(f"{name}[0]", pair[0], dtype=FP8, shape=shape, dims=dims, device=device)
    check_tensor(f"{name}[1]", pair[1], dtype=U8, shape=scale_shape(shape), device=device)


def check_routed_mxfp8(
    routed, hidden: int, device, *, backward: bool, num_experts=None
) -> tuple[int, int]:
    """Forward: three (fp8, scale) pairs. Backward: gate/up (fp8, sc, fp8_t, sc_t), down
    (fp8_t, sc_t). `num_experts` as in check_routed_bf16. Returns (E, I)."""
    width = (4, 4, 2) if backward else (2, 2, 2)
    for name, form, size in zip(("gate", "up", "down"), routed, width, strict=True):
        if not isinstance(form, tuple | list) or len(form) != size:
            raise TypeError(
                f"`routed_{name}_weights` must be a {size}-tuple in MXFP8 mode, "
                f"got {describe(form)} (a tuple or list as `routed_gate_weights` selects "
                "MXFP8 mode; BF16 mode takes three bf16 tensors)"
            )
    first = routed[0][0]
    if not isinstance(first, torch.Tensor) or first.dim() != 3:
        raise ValueError(f"`routed_gate_weights[0]` must be fp8 [E, I, H], got {describe(first)}")
    _check_experts(first.shape[0], num_experts, first)
    num_experts, inter = first.shape[0], first.shape[1]
    _check_inter(inter)
    shapes = _shapes(num_experts, inter, hidden)
    for name in ("gate", "up"):
        shape, dims = shapes[name]
        check_mx_pair(
            f"routed_{name}_weights", routed[("gate", "up").index(name)][:2], shape, dims, device
        )
        if backward:
            t_shape = (num_experts, hidden, inter)
            check_mx_pair(
                f"routed_{name}_weights[2:]",
                routed[("gate", "up").index(name)][2:],
                t_shape,
                ("E", "H", "I"),
                device,
            )
    down_shape, down_dims = shapes["down"]
    if backward:
        down_shape, down_dims = (num_experts, inter, hidden), ("E", "I", "H")
    check_mx_pair("routed_down_weights", routed[2], down_shape, down_dims, device)
    return num_experts, inter


def is_mxfp8(routed_gate_weights) -> bool:
    """The weight form decides the mode: tuples are MXFP8, tensors BF16."""
    return isinstance(routed_gate_weights, tuple | list)


def check_fwd_epilogue(y_shared, combine_buffer, topk_weights) -> int:
    """fwd_epilogue's arguments: y_shared bf16 [T, H] or None, combine_buffer bf16 [T * k, H],
    topk_weights fp32 [T, k]. Returns k."""
    weights = check_tensor("topk_weights", topk_weights, dtype=torch.float32, shape=(None, None),
                           dims=("T", "k"), contiguous=False)  # fmt: skip
    tokens, topk = weights.shape
    check_range("k (topk_weights.shape[1])", topk, 1, MAX_TOPK)
    _check_routed_rows("combine_buffer", combine_buffer, topk)
    rows, hidden = combine_buffer.shape
    # k came from the weights; now T from the buffer's rows, and the weights' device.
    check_tensor("topk_weights", weights, dtype=torch.float32, shape=(rows // topk, topk),
                 dims=("T", "k"), device=combine_buffer.device, contiguous=False)  # fmt: skip
    _check_token_rows("y_shared", y_shared, combine_buffer, tokens, hidden)
    return topk


def check_bwd_epilogue(d_x_shared, d_x_routed_buffer, topk: int | None) -> int:
    """bwd_epilogue's arguments: d_x_shared bf16 [T, H] or None, d_x_routed_buffer bf16
    [T * k, H], topk in [1, MAX_TOPK] or None (then T comes from d_x_shared). Returns k."""
    if topk is None:
        if d_x_shared is None:
            raise ValueError("`topk` must be given when `d_x_shared` is None (no shared expert)")
        any_2d = {"dtype": BF16, "shape": (None, None), "contiguous": False}
        shared = check_tensor("d_x_shared", d_x_shared, dims=("T", "H"), **any_2d)
        routed = check_tensor("d_x_routed_buffer", d_x_routed_buffer, dims=("T * k", "H"), **any_2d)
        tokens, rows = shared.shape[0], routed.shape[0]
        if tokens == 0 or rows % tokens:
            raise ValueError(
                f"`d_x_routed_buffer` must have T * k rows for `d_x_shared`'s T = {tokens}, "
                f"got {rows}: pass `topk`"
            )
        topk = rows // tokens
    check_range("topk", topk, 1, MAX_TOPK)
    _check_routed_rows("d_x_routed_buffer", d_x_routed_buffer, topk)
    rows, hidden = d_x_routed_buffer.shape
    _check_token_rows("d_x_shared", d_x_shared, d_x_routed_buffer, rows // topk, hidden)
    return topk


def _check_routed_rows(name: str, routed, topk: int) -> None:
    """bf16 [T * k, H] with H a multiple of 8 (the CUDA kernel moves 16-byte chunks)."""
    check_tensor(name, routed, dtype=BF16, shape=(None, None), dims=("T * k", "H"),
                 contiguous=False)  # fmt: skip
    rows, hidden = routed.shape
    if rows % topk or hidden % 8:
        raise ValueError(
            f"`{name}` must be bf16 [T * k, H] with k = {topk} and H a multiple of 8, "
            f"got {list(routed.shape)}"
        )


def _check_token_rows(name: str, shared, routed: torch.Tensor, tokens: int, hidden: int) -> None:
    if shared is not None:
        check_tensor(name, shared, dtype=BF16, shape=(tokens, hidden), dims=("T", "H"),
                     device=routed.device, contiguous=False)  # fmt: skip


# MoKForwardContext's fields, in order: what the backward's fused ops take as saved tensors.
SAVED_FIELDS = ("x_routed", "gate_shared", "gate_routed", "up_shared", "up_routed",
                "hidden_shared", "hidden_routed")  # fmt: skip
# MXFP8 saves these transposed (blocks along rows), for the weight gradients.
_TRANSPOSED_IN_MXFP8 = ("x_routed", "hidden_routed")


def check_saved(
    saved, *, prefix: str, mxfp8: bool, shared: bool, sizes: tuple[int, int, int, int], device
) -> None:
    """The forward's saved activations (in SAVED_FIELDS order; errors name `prefix` + field)
    against the backward's mode, shared expert and sizes (C, T, H, I): the kernels read them by
    address, so a context of another forward must not reach them."""
    rows, tokens, hidden, inter = sizes
    routed = {"x_routed": (rows, hidden), "gate_routed": (rows, inter),
              "up_routed": (rows, inter), "hidden_routed": (rows, inter)}  # fmt: skip
    for field, value in zip(SAVED_FIELDS, saved, strict=True):
        key = prefix + field
        if field in routed:
            shape = routed[field]
            if mxfp8 and field in _TRANSPOSED_IN_MXFP8:
                shape = shape[::-1]
            _check_saved_routed(key, value, shape, mxfp8, device)
        elif _present(value) != shared:
            state = "is None" if shared else "holds a tensor"
            raise ValueError(f"`{key}` {state} but this backward has "
                             f"{'a' if shared else 'no'} shared expert")  # fmt: skip
        elif shared:
            check_tensor(key, value, dtype=BF16, shape=(tokens, inter), dims=("T", "I"),
                         device=device)  # fmt: skip


def _check_saved_routed(key: str, value, shape: tuple[int, int], mxfp8: bool, device) -> None:
    mode = "MXFP8" if mxfp8 else "bf16"
    if isinstance(value, tuple | list) != mxfp8:
        raise TypeError(
            f"`{key}` is another mode's ({describe(value)}) but the routed weights are {mode}: "
            "pass them in the forward's mode"
        )
    if mxfp8:
        check_mx_pair(key, value, shape, None, device)
    else:
        check_tensor(key, value, dtype=BF16, shape=shape, device=device)


def _present(shared_value) -> bool:
    """A shared expert's saved tensor: None or 0-size (a fused op's absent output) is none."""
    if isinstance(shared_value, torch.Tensor):
        return shared_value.numel() > 0
    return shared_value is not None


def check_context(ctx, schedule, ws, routed_gate_weights, shared_gate_weights, mxfp8,
                  macrobatch_size) -> None:  # fmt: skip
    """The context against this backward: made with this schedule and workspace (when it says),
    its tensors of this step's shapes (routed: the rows forward kept, mok.macrobatch)."""
    for name, given in (("schedule", schedule), ("workspace", ws)):
        made_with = getattr(ctx, name)
        if made_with is not None and made_with is not given:
            raise ValueError(
                f"`forward_context` was made by forward with another {name}: pass the {name} "
                "that forward ran with"
            )
    gate = routed_gate_weights[0] if mxfp8 else routed_gate_weights
    experts = schedule.tokens_per_expert.shape[0]
    rows = macrobatch.kept_rows(schedule.peer_rank.shape[0], macrobatch_size, experts)
    sizes = (rows, ws.num_local_tokens, ws.hidden_size, gate.shape[1])
    saved = [getattr(ctx, name) for name in SAVED_FIELDS]
    check_saved(saved, prefix="forward_context.", mxfp8=mxfp8,
                shared=shared_gate_weights is not None, sizes=sizes,
                device=ws.device)  # fmt: skip
