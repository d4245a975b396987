"""Reference composition of the fused passes: pull-dispatch -> experts -> push-combine.

These are the bodies of the `dispatch_mlp_swiglu_combine_{fwd,bwd}_{bf16,mxfp8}` ops on the
reference backend. Routed tensors have one row per schedule row (the schedule capacity C).
"""

from __future__ import annotations

import torch

from mok.backends import reference as comm
from mok.backends import reference_experts as experts


def _shared_forward(x, shared, limit):
    if shared is None:
        return None, None, None, None
    gate, up, down = (w.unsqueeze(0) for w in shared)
    row_expert = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    return experts.forward_bf16(x, gate, up, down, row_expert, limit)


def _shared_backward(d_out, x, saved, shared, limit):
    if shared is None:
        return (None,) * 7
    gate, up, hidden = saved
    weights = tuple(w.unsqueeze(0) for w in shared)
    row_expert = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    ones = torch.ones(x.shape[0], dtype=torch.float32, device=x.device)
    out = experts.backward_bf16(d_out, ones, x, gate, up, hidden, weights, row_expert, limit)
    d_x, _, d_gate, d_up, d_hidden, d_w_gate, d_w_up, d_w_down = out
    return d_x, d_gate, d_up, d_hidden, d_w_gate[0], d_w_up[0], d_w_down[0]


def forward(x, combine_buffer, shared, routed, schedule, topk, limit, group_name, mxfp8: bool):
    """Returns (routed ctx tuple, shared (gate, up, hidden, y)). Fills `combine_buffer`."""
    peer_rank, peer_token_idx, num_tokens, tokens_per_expert = schedule
    x_rows = comm.pull_rows(x, peer_rank, peer_token_idx, topk, group_name)
    row_expert = experts.row_experts(tokens_per_expert, num_tokens, x_rows.shape[0])
    if mxfp8:
        *saved, y = experts.forward_mxfp8(x_rows, *routed, row_expert, limit)
    else:
        gate, up, hidden, y = experts.forward_bf16(x_rows, *routed, row_expert, limit)
        saved = [x_rows, gate, up, hidden]
    comm.push_rows(y, peer_rank, peer_token_idx, combine_buffer, group_name)
    return saved, y, _shared_forward(x, shared, limit)


def backward(
    grads,
    buffers,
    shared,
    routed,
    saved,
    shared_saved,
    x,
    schedule,
    topk,
    limit,
    group_name,
    mxfp8: bool,
):
    """One backward pass.

    grads = (d_y_buffer, router_weight_buffer) of this rank; buffers = (d_x_routed_buffer,
    d_router_weight_buffer) to push into. Returns (d_x_shared, d_x_routed, d_gate_shared,
    d_gate_routed, d_up_shared, d_up_routed, d_hidden_shared, d_hidden_routed, d_w_shared_gate,
    d_w_routed_gate, d_w_shared_up, d_w_routed_up, d_w_shared_down, d_w_routed_down).
    """
    d_y, router_weights = grads
    d_x_routed_buffer, d_router_weight_buffer = buffers
    peer_rank, peer_token_idx, num_tokens, tokens_per_expert = schedule
    d_out_rows = comm.pull_rows(d_y, peer_rank, peer_token_idx, topk, group_name)
    rw_rows = comm.pull_router_weights(router_weights, peer_rank, peer_token_idx, group_name)
    row_expert = experts.row_experts(tokens_per_expert, num_tokens, d_out_rows.shape[0])
    if mxfp8:
        routed_out = experts.backward_mxfp8(d_out_rows, rw_rows, saved, routed, row_expert, limit)
    else:
        routed_out = experts.backward_bf16(d_out_rows, rw_rows, *saved, routed, row_expert, limit)
    d_x_r, d_rw, d_gate_r, d_up_r, d_hidden_r, d_w_gate, d_w_up, d_w_down = routed_out
    comm.push_rows(d_x_r, peer_rank, peer_token_idx, d_x_routed_buffer, group_name)
    comm.push_rows(d_rw, peer_rank, peer_token_idx, d_router_weight_buffer.view(-1), group_name)
    d_x_s, d_gate_s, d_up_s, d_hidden_s, d_wg_s, d_wu_s, d_wd_s = _shared_backward(
        d_y, x, shared_saved, shared, limit
    )
    return (
        d_x_s,
        d_x_r,
        d_gate_s,
        d_gate_r,
        d_up_s,
        d_up_r,
        d_hidden_s,
        d_hidden_r,
        d_wg_s,
        d_w_gate,
        d_wu_s,
        d_w_up,
        d_wd_s,
        d_w_down,
    )
