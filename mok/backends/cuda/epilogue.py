"""The combine epilogues on CUDA (csrc/comm/combine_epilogue.cu): each token's k routed rows
summed in fp32 in slot order onto its shared-expert row, weighted by the router weights in the
forward. Bit for bit the arithmetic of the reference backend's epilogues.

Neither allocates anything but its output nor synchronises, so both are capturable in a CUDA
graph; they run on `torch.cuda.current_stream()`. Inputs may start at any 2-byte address and
have any strides (they are copied to aligned, contiguous ones first). The arguments are
checked by their public entry, mok.ops.
"""

from __future__ import annotations

import torch

from mok.backends.cuda import extension


def fwd_epilogue(
    y_shared: torch.Tensor | None,
    combine_buffer: torch.Tensor,
    topk_weights: torch.Tensor,
    route_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[t] = bf16(y_shared[t] + sum_j w[t, j] * combine_buffer[t * k + j]), fp32, j in order
    (bit for bit `mok.ops.fwd_epilogue`'s reference arithmetic).

    | argument       | dtype | shape          |
    |----------------|-------|----------------|
    | y_shared       | bf16  | [T, H] or None |
    | combine_buffer | bf16  | [T * k, H]     |
    | topk_weights   | fp32  | [T, k]         |
    | route_rows     | int32 | [T * k] or None|
    | output         | bf16  | [T, H]         |

    With `route_rows` (MoKSchedule.route_rows), `combine_buffer` is the routed rows [R, H],
    read in place: route r's row is route_rows[r], a zero row where that is -1.
    """
    return _launch(y_shared, combine_buffer, topk_weights, topk_weights.shape[1], route_rows)


def bwd_epilogue(
    d_x_shared: torch.Tensor | None,
    d_x_routed_buffer: torch.Tensor,
    topk: int,
    route_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """d_x[t] = bf16(d_x_shared[t] + sum_j d_x_routed_buffer[t * k + j]), fp32, j in order
    (bit for bit `mok.ops.bwd_epilogue`'s reference arithmetic). Shapes and `route_rows` as
    `fwd_epilogue`'s; `topk` in [1, mok.workspace.MAX_TOPK]."""
    return _launch(d_x_shared, d_x_routed_buffer, None, topk, route_rows)


def _launch(shared, routed, weights, topk: int, route_rows) -> torch.Tensor:
    routes = routed.shape[0] if route_rows is None else route_rows.numel()
    tokens, hidden = routes // topk, routed.shape[1]
    out = torch.empty((tokens, hidden), dtype=torch.bfloat16, device=routed.device)
    if out.numel() == 0:
        return out
    # Hold the (possibly copied) inputs until the launch is enqueued.
    shared = None if shared is None else extension.aligned(shared)
    weights = None if weights is None else weights.contiguous()
    routed = extension.aligned(routed)
    extension.launch(
        routed.device,
        "comm_epilogue",
        shared=extension.address(shared),
        routed=routed.data_ptr(),
        weights=extension.address(weights),
        out=out.data_ptr(),
        tokens=tokens,
        hidden=hidden,
        topk=topk,
        route_rows=extension.address(route_rows),
        routed_rows=routed.shape[0],
    )
    return out
