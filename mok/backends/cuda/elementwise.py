"""The expert elementwise kernels (csrc/experts/elementwise.cu) on the schedule's routed rows.

Each touches only the rows the schedule uses (`num_tokens`, read on the device) and writes zeros
past them, computing in fp32 and rounding once where it stores, as the reference does.
"""

from __future__ import annotations

import torch

from mok._arguments import check_tensor
from mok.backends.cuda import extension
from mok.backends.cuda import mxfp8 as cuda

_BF16 = torch.bfloat16


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return extension.aligned(t.to(_BF16))


def _launch(kernel: str, tensors: dict[str, torch.Tensor | None], **scalars) -> None:
    """`kernel` with each tensor passed as its device address (None as 0: an output the kernel
    skips). The first tensor names the device."""
    device = next(iter(tensors.values())).device
    addresses = {name: extension.address(t) for name, t in tensors.items()}
    extension.launch(device, kernel, **addresses, **scalars)


def _check_rows(tensors: dict[str, torch.Tensor], row_shape: list, dims: str) -> None:
    """Every tensor has the first one's leading size (rows) and `row_shape` after it, on its
    device (any float dtype: converted before the launch); num_tokens is int32 [1] there. The
    kernels trust these sizes, so they are checked before any launch."""
    first = next(iter(tensors.values()))
    device = first.device if isinstance(first, torch.Tensor) else None
    rows = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() else None
    for name, t in tensors.items():
        if name == "num_tokens":
            check_tensor(name, t, dtype=torch.int32, shape=[1], device=device)
        elif name in ("router_weight", "weight"):
            check_tensor(name, t, dtype=None, shape=[rows], dims=["R"], device=device,
                         contiguous=False)  # fmt: skip
        else:
            check_tensor(name, t, dtype=None, shape=[rows, *row_shape], dims=dims.split(),
                         device=device, contiguous=False)  # fmt: skip


def _limit(limit: float | None) -> dict:
    return {"has_limit": limit is not None, "limit": 0.0 if limit is None else float(limit)}


def swiglu(gate, up, num_tokens: torch.Tensor, limit: float | None, zero_rest: bool = True):
    """bf16 silu(min(gate, L)) * clamp(up, -L, L) of bf16 [R, I] rows; rows past num_tokens
    are zero, or left as they are when not `zero_rest` (internal buffers)."""
    inter = gate.shape[-1] if isinstance(gate, torch.Tensor) else None
    _check_rows({"gate": gate, "up": up, "num_tokens": num_tokens}, [inter], "R I")
    gate, up = _bf16(gate), _bf16(up)
    hidden = torch.empty_like(gate)
    tensors = {"gate": gate, "up": up, "hidden": hidden, "num_tokens": num_tokens}
    _launch("swiglu", tensors, rows=gate.shape[0], inter=gate.shape[1], zero_rest=zero_rest,
            **_limit(limit))  # fmt: skip
    return hidden


def swiglu_mxfp8(gate, up, num_tokens: torch.Tensor, limit: float | None, zero_rest=True):
    """The MXFP8 forward's SwiGLU step in one pass over bf16 gate and up [R, I] (R and I
    multiples of 128): (hidden's rounded values bf16 [R, I], hidden's transposed pair, gate's
    and up's normal pairs), bit for bit `swiglu` followed by `cuda.mxfp8_round(hidden, True)`
    and `cuda.mxfp8_quantize` of gate and up, in one read of gate and up instead of four.
    Not `zero_rest`: the 128-row tiles from num_tokens on are left unwritten in every output."""
    inter = gate.shape[-1] if isinstance(gate, torch.Tensor) else None
    _check_rows({"gate": gate, "up": up, "num_tokens": num_tokens}, [inter], "R I")
    rows, device = gate.shape[0], gate.device
    if rows % 128 or inter % 128:
        shape = [rows, inter]
        raise ValueError(f"`gate` must be [R, I] with R and I multiples of 128 (MXFP8 tiles), "
                         f"got {shape}")  # fmt: skip
    gate, up = _bf16(gate), _bf16(up)
    hidden = torch.empty_like(gate)
    hidden_t = cuda.mxfp8_layout((inter, rows), device)
    gate_q, up_q = cuda.mxfp8_layout(gate.shape, device), cuda.mxfp8_layout(gate.shape, device)
    tensors = {
        "gate": gate,
        "up": up,
        "hidden_rounded": hidden,
        "hidden_t": hidden_t[0],
        "hidden_scale_t": hidden_t[1],
        "gate_q": gate_q[0],
        "gate_scale": gate_q[1],
        "up_q": up_q[0],
        "up_scale": up_q[1],
        "num_tokens": num_tokens,
    }
    if rows:
        used_rows = 0 if zero_rest else num_tokens.data_ptr()
        _launch("mxfp8_swiglu_quantize", tensors, used_rows=used_rows, rows=rows, inter=inter,
                **_limit(limit))  # fmt: skip
    return hidden, hidden_t, gate_q, up_q


def swiglu_backward(
    d_h, router_weight, gate, up, hidden, num_tokens, limit: float | None, zero_rest: bool = True,
    *, scale_hidden: bool = False, hidden_grad: bool = True,
):  # fmt: skip
    """(d_router_weight fp32 [R], d_gate, d_up, d_hidden bf16 [R, I]) from fp32 d_h [R, I]; rows
    past num_tokens get d_router_weight 0 and zeros elsewhere, or (not `zero_rest`) nothing.
    `scale_hidden` appends `scale_rows(hidden, router_weight)` (bit for bit), written in the same
    pass, which reads hidden anyway. gate and up are bf16 [R, I], or both MXFP8 (data, scales)
    pairs as mxfp8_quantize writes them (the forward's saved gate and up; R and I multiples of
    128), read as their mxfp8_dequantize values: the same bits as on those values. Not
    `hidden_grad`: d_hidden is None, not written."""
    mxfp8 = isinstance(gate, tuple)
    if isinstance(up, tuple) != mxfp8:
        raise TypeError("`gate` and `up` must both be tensors or both MXFP8 (data, scales) pairs")
    scales = {}
    if mxfp8:
        for name, pair in (("gate", gate), ("up", up)):
            cuda.check_mxfp8_pair(*pair, names=(f"{name}[0] (data)", f"{name}[1] (scales)"))
        (gate, scales["gate_scale"]), (up, scales["up_scale"]) = gate, up
    inter = hidden.shape[-1] if isinstance(hidden, torch.Tensor) else None
    given = {"hidden": hidden, "gate": gate, "up": up, "d_h": d_h}
    _check_rows({**given, "router_weight": router_weight, "num_tokens": num_tokens}, [inter], "R I")
    hidden = _bf16(hidden)
    gate, up = (extension.aligned(t) if mxfp8 else _bf16(t) for t in (gate, up))
    wanted = {"d_gate": True, "d_up": True, "d_hidden": hidden_grad, "scaled_hidden": scale_hidden}
    outputs = {name: torch.empty_like(hidden) if on else None for name, on in wanted.items()}
    d_router_weight = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    tensors = {
        "d_h": extension.aligned(d_h.float()),
        "router_weight": router_weight.float().contiguous(),
        "gate": gate,
        "up": up,
        "hidden": hidden,
        **{name: extension.aligned(t) for name, t in scales.items()},
        **outputs,
        "d_router_weight": d_router_weight,
        "num_tokens": num_tokens,
    }
    _launch("swiglu_backward", tensors, rows=hidden.shape[0], inter=hidden.shape[1],
            zero_rest=zero_rest, **_limit(limit))  # fmt: skip
    scaled = (outputs["scaled_hidden"],) if scale_hidden else ()
    return (d_router_weight, outputs["d_gate"], outputs["d_up"], outputs["d_hidden"], *scaled)


def scale_rows(
    x: torch.Tensor, weight: torch.Tensor, num_tokens: torch.Tensor, zero_rest: bool = True
) -> torch.Tensor:
    """bf16(weight[r] * x[r]) for bf16 x [R, C] and fp32 weight [R]; rows past num_tokens are
    zero, or unspecified when not `zero_rest` (for buffers only the used rows of are read)."""
    cols = x.shape[-1] if isinstance(x, torch.Tensor) else None
    _check_rows({"x": x, "weight": weight, "num_tokens": num_tokens}, [cols], "R C")
    x = _bf16(x)
    out = torch.empty_like(x)
    tensors = {"x": x, "weight": weight.float().contiguous(), "out": out, "num_tokens": num_tokens}
    _launch("scale_rows", tensors, rows=x.shape[0], cols=x.shape[1], zero_rest=zero_rest)
    return out
