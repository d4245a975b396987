"""The passes, written once for every backend: pull-dispatch -> experts -> push-combine.

mok.functional runs them on a workspace's engine (mok.backends.engine); the original's flat
`dispatch_mlp_swiglu_combine_{fwd,bwd}_{bf16,mxfp8}` ops (mok.ops) unpack their arguments and
run the same ones. An engine supplies the communication and the GEMMs (reference: collectives
and masked fp32 products; CUDA: NVLink kernels and grouped GEMMs):

| engine method                                    | does                                    |
|--------------------------------------------------|-----------------------------------------|
| use_sources({Buffer: tensor})                    | the caller's tensors for the buffers:   |
|                                                  | EP 1 reads them in place, else copies   |
|                                                  | them in; -> {Buffer: tensor read}       |
| pull(name, schedule, background, sync)           | dispatch: one row per schedule row      |
| pull_rounded(name, schedule, gemm, background,   | () -> gemm.mx_round_both of pull's rows |
| sync)                                            |                                         |
| pull_rounded_rows(name, schedule, gemm, rw,      | () -> experts.mx_round_d_out of pull's  |
| background, sync)                                | rows, with the router weights rw        |
| pull_beside(name, schedule, gemm, sync)          | (rows, pull): pull's rows and the pull  |
|                                                  | for gemm's first GEMM on them to run    |
|                                                  | beside itself, or None (pulled already) |
| pull_router_weights(schedule, background, sync)  | the fp32 router weight of each row      |
| push_all(pushes, schedule, background)           | combine: rows into their sources' slots |
| kept                                             | {Buffer: rows} a pass kept, not pushed  |
| join()                                           | later work waits for background         |
|                                                  | exchanges                               |
| routed_gemms(schedule, E)                        | GEMM engine over the expert segments    |
| shared_gemms(tokens)                             | GEMM engine for the shared expert       |
| topk                                             | routes per token                        |

Routed tensors have one row per schedule row (C). Barriers (engines whose exchanges need them):
a pass has one before its pulls (the sources are written) and none after them, because the
barrier before its pushes, which every rank reaches only after its own pulls, already keeps the
sources from being overwritten; the pushes of a pass share one barrier before and one after.
`name` is the mok.workspace.Buffer pulled from; `pushes` is a list of (rows, Buffer pushed
into). A schedule that knows every route's row on this rank (`route_rows`, EP 1) needs no
pushes: the pass keeps its rows in `engine.kept` and the epilogue reads them in place.
`background=True` lets an engine run the exchange concurrently with the work enqueued after it,
up to the next `join()`; the passes ask
for it in the backward, where the shared expert's GEMMs, which need nothing from the exchange,
are long enough to hide it (`overlaps_shared`), and in MXFP8, beside the dequantization of the
weights (forward: only for engines whose GEMMs need it, `mx_weights_as_stored` False) and,
backward, of the saved activations. The results do not depend on it.
"""

from __future__ import annotations

from mok import experts, macrobatch
from mok.workspace import Buffer

# Of the shared expert's GEMMs only the backward's hide exchanges: its phases (data gradients
# beside the pulls, weight gradients beside the pushes) each take ~6·T·H·I_s FLOPs, an exchange
# moves ~2·T·k·H bytes, so the GEMMs outlast a background exchange from I_s ≈ 330·k; the
# forward's dispatch beside its shared expert gained nothing (docs/exchanges.md).
MIN_SHARED_INTER_PER_TOPK = 330


def overlaps_shared(shared, topk: int) -> bool:
    """Whether the backward runs its exchanges in the background of this shared expert."""
    return shared is not None and shared[0].shape[0] >= MIN_SHARED_INTER_PER_TOPK * topk


def _shared_forward(engine, x, shared, limit):
    if shared is None:
        return None, None, None, None
    gate, up, down = (w.unsqueeze(0) for w in shared)
    return experts.forward_bf16(x, gate, up, down, engine.shared_gemms(x.shape[0]), limit)


def _shared_backward(engine, d_out, x, saved, shared, limit, op_outputs=True):
    """The shared expert's data gradients (d_x, d_gate, d_up, d_hidden) and the callable that
    computes its weight gradients (d_W_gate, d_W_up, d_W_down); `op_outputs` as `backward`'s."""
    if shared is None:
        return (None,) * 4, lambda: (None,) * 3
    gate, up, hidden = saved
    weights = tuple(w.unsqueeze(0) for w in shared)
    gemm = engine.shared_gemms(x.shape[0])
    unit_weights = None
    data, weight_grads = experts.backward_bf16(
        d_out, unit_weights, x, gate, up, hidden, weights, gemm, limit, op_outputs=op_outputs
    )
    d_x, _, d_gate, d_up, d_hidden = data
    return (d_x, d_gate, d_up, d_hidden), lambda: tuple(g[0] for g in weight_grads())


def _send_home(engine, pushes, schedule, background: bool = False) -> None:
    """The combine's exchange: each (rows, Buffer) pushed into the sources' buffers, or, when
    every route's row is on this rank (schedule.route_rows), kept for the epilogue, which reads
    them in place: a pass over T * k rows less (docs/exchanges.md, EP 1)."""
    if schedule.route_rows is not None:
        engine.kept = {name: rows for rows, name in pushes}
        return
    engine.push_all(pushes, schedule, background=background)


def forward(engine, x, shared, routed, schedule, limit, mxfp8: bool, macrobatch_size: int):
    """`schedule` is a MoKSchedule, `shared` (gate, up, down) or None, `routed` the routed
    weights in their mode's form (mok.functional.forward). Returns (routed saved tensors,
    y_routed, shared (gate, up, hidden, y)); fills combine_buffer (or keeps y: `_send_home`).
    The saved tensors keep at most `macrobatch_size` rows plus 256 per local expert
    (mok.macrobatch's ring).

    Where the dispatch waits for peers (its barrier), the shared expert goes first: it needs
    nothing from the exchange, so its GEMMs keep the GPU busy while the ranks meet and the host
    enqueues the routed stages. Where it does not (`engine.dispatch_is_local`, EP 1), the
    routed experts go first: the GPU starts on the dispatch and the routed GEMMs while the host
    enqueues the shared expert, whose host time outlasts its GEMMs on the Qwen-like shapes
    (docs/host-overhead.md).
    """
    shared_first = not engine.dispatch_is_local
    shared_out = _shared_forward(engine, x, shared, limit) if shared_first else None
    rows = schedule.as_tuple()
    gemm = engine.routed_gemms(rows, rows[3].shape[0])
    if mxfp8:
        # The forward reads the routed rows only rounded. Engines whose exchange is worth hiding
        # pull in the background of the weights' dequantization, where the GEMMs need one
        # (memory-bound work that needs nothing from the exchange), and round after the join;
        # others pull and round in one pass (docs/mxfp8.md).
        x_rounded = engine.pull_rounded(
            Buffer.X, rows, gemm, background=not gemm.mx_weights_as_stored,
            sync=(True, False),
        )  # fmt: skip
        weights = experts.mxfp8_weights(*routed, gemm)
    else:
        x_rows, pull = engine.pull_beside(Buffer.X, rows, gemm, sync=(True, False))
    if mxfp8:
        engine.join()
        *saved, y = experts.forward_mxfp8(x_rounded(), weights, gemm, limit)
    else:
        gate, up, hidden, y = experts.forward_bf16(x_rows, *routed, gemm, limit, pull)
        saved = [x_rows, gate, up, hidden]
    if not shared_first:  # the routed GEMMs are on their way
        shared_out = _shared_forward(engine, x, shared, limit)
    _send_home(engine, [(y, Buffer.COMBINE)], schedule)
    engine.hand_back_pushed()
    ring = macrobatch.ring_rows(macrobatch_size, schedule.tokens_per_expert.shape[0])
    saved = macrobatch.keep(tuple(saved), schedule.num_tokens, ring, mxfp8)
    return saved, y, shared_out


def _every_row(engine, saved, routed, schedule, limit, mxfp8: bool, macrobatch_size: int):
    """The saved routed values of every schedule row: as saved where the forward kept them all,
    else its ring's rows after the rows before them, computed again (mok.macrobatch). The
    recomputing pull is the pass's first, with its barrier (x is in x_buffer again)."""
    rows = schedule.as_tuple()
    ring = macrobatch.ring_rows(macrobatch_size, rows[3].shape[0])
    if not macrobatch.rings(rows[0].shape[0], ring):
        return saved
    before = macrobatch.cut(rows, ring)
    gemm = engine.routed_gemms(before, before[3].shape[0])
    if mxfp8:
        x_rounded = engine.pull_rounded(Buffer.X, before, gemm, sync=(True, False))()
        w_gate, w_up = (gemm.mx_weight(w[:2]) for w in routed[:2])
        recomputed = experts.saved_mxfp8(x_rounded, w_gate, w_up, gemm, limit)[0]
    else:
        x_rows = engine.pull(Buffer.X, before, sync=(True, False))
        recomputed = (x_rows, *gemm.gate_up_swiglu(x_rows, routed[0], routed[1], limit))
    return macrobatch.restore(recomputed, saved, rows[2], ring, mxfp8)


def backward(engine, d_y, shared, routed, saved, shared_saved, x, schedule, limit, mxfp8: bool,
             macrobatch_size: int, op_outputs: bool = True):  # fmt: skip
    """One backward pass; pushes d_x rows and router-weight gradients to the source ranks.
    `saved` is what forward returned with the same `macrobatch_size`.

    With a large shared expert, the pulls run in the background of its data gradients and the
    pushes in the background of its weight gradients and of the routed weight gradients'
    elementwise inputs (the scaled d_out rows); in MXFP8 the pulls always run in the
    background, beside the dequantization of the saved tensors (and of the weights, for
    engines whose GEMMs do not read them as stored), which then comes before the shared
    expert's work. Returns, in the order of the original's BF16 fused op, (d_x_shared,
    d_x_routed, d_gate_shared, d_gate_routed, d_up_shared, d_up_routed, d_hidden_shared,
    d_hidden_routed, d_y_routed, d_w_shared_gate, d_w_routed_gate, d_w_shared_up, d_w_routed_up,
    d_w_shared_down, d_w_routed_down); d_y_routed: the d_out rows the d_h GEMM read (MXFP8:
    their q_H rounding). Not `op_outputs` (the functional API, which returns no d_hidden): both
    d_hidden are None and no pass writes them.
    """
    saved = _every_row(engine, saved, routed, schedule, limit, mxfp8, macrobatch_size)
    overlap = overlaps_shared(shared, engine.topk)
    rows = schedule.as_tuple()
    gemm = engine.routed_gemms(rows, rows[3].shape[0])
    # MXFP8 also pulls in the background of the dequantization of its saved tensors.
    background = overlap or mxfp8
    rw_rows = engine.pull_router_weights(rows, background=background, sync=(True, False))
    sync = (False, False)
    d_out_pull = None
    if mxfp8:  # d_out's rows are read only rounded, in two forms (experts.mx_round_d_out)
        d_out = engine.pull_rounded_rows(Buffer.D_Y, rows, gemm, rw_rows, background,
                                         sync=sync)  # fmt: skip
    elif background:
        d_out_rows = engine.pull(Buffer.D_Y, rows, background=True, sync=sync)
    else:  # the d_h GEMM may run the pull beside itself
        d_out_rows, d_out_pull = engine.pull_beside(Buffer.D_Y, rows, gemm, sync=sync)
    inputs = experts.mxfp8_backward_inputs(saved, routed, gemm) if mxfp8 else None
    if not overlap:  # the shared expert (if any) gets every SM; a no-op when nothing forked
        engine.join()
    # As in the forward, the routed experts go first at EP 1, unless the shared expert hides
    # the exchanges (then nothing is waiting for the host).
    shared_first = overlap or not engine.dispatch_is_local
    shared_out = None
    if shared_first:
        shared_out = _shared_backward(engine, d_y, x, shared_saved, shared, limit, op_outputs)
    engine.join()
    if mxfp8:
        d_out_rounded = d_out()
        d_out_rows = d_out_rounded[0]  # the rows the d_h GEMM reads: q_H(d_out)
        routed_out = experts.backward_mxfp8(d_out_rounded, rw_rows, inputs, gemm, limit,
                                            op_outputs)  # fmt: skip
    else:
        routed_out = experts.backward_bf16(d_out_rows, rw_rows, *saved, routed, gemm, limit,
                                           d_out_pull, op_outputs)  # fmt: skip
    if not shared_first:
        shared_out = _shared_backward(engine, d_y, x, shared_saved, shared, limit, op_outputs)
    (d_x_s, d_gate_s, d_up_s, d_hidden_s), shared_weight_grads = shared_out
    (d_x_r, d_rw, d_gate_r, d_up_r, d_hidden_r), routed_weight_grads = routed_out
    pushes = [(d_x_r, Buffer.D_X_ROUTED), (d_rw, Buffer.D_ROUTER_WEIGHT)]
    _send_home(engine, pushes, schedule, background=overlap)
    routed_weight_grads.prepare()  # elementwise passes, beside a background push too
    d_wg_s, d_wu_s, d_wd_s = shared_weight_grads()
    engine.join()
    engine.hand_back_pushed()
    d_w_gate, d_w_up, d_w_down = routed_weight_grads()
    return (
        d_x_s, d_x_r, d_gate_s, d_gate_r, d_up_s, d_up_r, d_hidden_s, d_hidden_r, d_out_rows,
        d_wg_s, d_w_gate, d_wu_s, d_w_up, d_wd_s, d_w_down,
    )  # fmt: skip
