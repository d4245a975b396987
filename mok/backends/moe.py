"""The fused passes written once for every backend: pull-dispatch -> experts -> push-combine.

These are the bodies of the `dispatch_mlp_swiglu_combine_{fwd,bwd}_{bf16,mxfp8}` ops. An
engine supplies the communication and the GEMMs (reference: collectives and masked fp32
products; CUDA: NVLink kernels and grouped GEMMs):

| engine method                 | does                                                        |
|-------------------------------|-------------------------------------------------------------|
| pull(name, schedule)          | dispatch: one row per schedule row from the sources' buffer |
| pull_router_weights(schedule) | the fp32 router weight of each schedule row                 |
| push(rows, schedule, name)    | combine: each row into its source rank's buffer slot         |
| routed_gemms(schedule, E)     | GEMM engine over the schedule's expert segments             |
| shared_gemms(tokens)          | GEMM engine for the shared expert (one expert, every row)    |

Routed tensors have one row per schedule row (C).
"""

from __future__ import annotations

import torch

from mok.backends import reference_experts as experts


def _shared_forward(engine, x, shared, limit):
    if shared is None:
        return None, None, None, None
    gate, up, down = (w.unsqueeze(0) for w in shared)
    return experts.forward_bf16(x, gate, up, down, engine.shared_gemms(x.shape[0]), limit)


def _shared_backward(engine, d_out, x, saved, shared, limit):
    if shared is None:
        return (None,) * 7
    gate, up, hidden = saved
    weights = tuple(w.unsqueeze(0) for w in shared)
    ones = x.new_ones(x.shape[0], dtype=torch.float32)
    gemm = engine.shared_gemms(x.shape[0])
    out = experts.backward_bf16(d_out, ones, x, gate, up, hidden, weights, gemm, limit)
    d_x, _, d_gate, d_up, d_hidden, d_w_gate, d_w_up, d_w_down = out
    return d_x, d_gate, d_up, d_hidden, d_w_gate[0], d_w_up[0], d_w_down[0]


def forward(engine, x, shared, routed, schedule, limit, mxfp8: bool):
    """Returns (routed ctx list, y_routed, shared (gate, up, hidden, y)); fills combine_buffer.

    The shared expert goes first: it needs nothing from the exchange, so its GEMMs keep the GPU
    busy while the host enqueues the routed stages (the results do not depend on the order).
    """
    shared_out = _shared_forward(engine, x, shared, limit)
    x_rows = engine.pull("x_buffer", schedule)
    num_experts = schedule[3].shape[0]
    gemm = engine.routed_gemms(schedule, num_experts)
    if mxfp8:
        *saved, y = experts.forward_mxfp8(x_rows, *routed, gemm, limit)
    else:
        gate, up, hidden, y = experts.forward_bf16(x_rows, *routed, gemm, limit)
        saved = [x_rows, gate, up, hidden]
    engine.push(y, schedule, "combine_buffer")
    return saved, y, shared_out


def backward(engine, d_y, shared, routed, saved, shared_saved, x, schedule, limit, mxfp8: bool):
    """One backward pass; pushes d_x rows and router-weight gradients to the source ranks.

    Returns (d_x_shared, d_x_routed, d_gate_shared, d_gate_routed, d_up_shared, d_up_routed,
    d_hidden_shared, d_hidden_routed, d_w_shared_gate, d_w_routed_gate, d_w_shared_up,
    d_w_routed_up, d_w_shared_down, d_w_routed_down).
    """
    d_x_s, d_gate_s, d_up_s, d_hidden_s, d_wg_s, d_wu_s, d_wd_s = _shared_backward(
        engine, d_y, x, shared_saved, shared, limit
    )  # first, as in forward
    d_out_rows = engine.pull("d_y_buffer", schedule)
    rw_rows = engine.pull_router_weights(schedule)
    gemm = engine.routed_gemms(schedule, schedule[3].shape[0])
    if mxfp8:
        routed_out = experts.backward_mxfp8(d_out_rows, rw_rows, saved, routed, gemm, limit)
    else:
        routed_out = experts.backward_bf16(d_out_rows, rw_rows, *saved, routed, gemm, limit)
    d_x_r, d_rw, d_gate_r, d_up_r, d_hidden_r, d_w_gate, d_w_up, d_w_down = routed_out
    engine.push(d_x_r, schedule, "d_x_routed_buffer")
    engine.push(d_rw, schedule, "d_router_weight_buffer")
    return (
        d_x_s, d_x_r, d_gate_s, d_gate_r, d_up_s, d_up_r, d_hidden_s, d_hidden_r,
        d_wg_s, d_w_gate, d_wu_s, d_w_up, d_wd_s, d_w_down,
    )  # fmt: skip
