"""mok's grouped expert GEMMs (csrc/gemm/sm90: CUTLASS TMA + wgmma kernels, sm_90a) on the schedule.

Every GEMM runs over the schedule's expert segments: `rows[e]` (the schedule's padded
`tokens_per_expert`, on the device) consecutive routed rows per local expert, so no launch reads
a size on the host. Two operand sets of one shape (gate and up) share a launch. Given the
schedule's `peer_rank` as `row_source`, a segment's trailing padding rows (-1) get no tiles: the
linear kinds write them as zeros and the weight gradients leave them out, which changes no bit
where those rows are zero (as the schedule's routed buffers are); at ~2048 rows per expert the
256-row padding is ~6% of the rows. Modules built for other architectures have no
such kernels (`available()` is False): callers use torch there.
"""

from __future__ import annotations

import enum
import functools
from typing import NamedTuple

import torch

from mok._arguments import check_tensor
from mok.backends.cuda import extension

_BF16 = torch.bfloat16


class MxWeight(NamedTuple):
    """An MXFP8 weight as mxfp8_quantize writes it, for `linear_mx`."""

    data: torch.Tensor  # float8_e4m3fn [E, N, K]
    scales: torch.Tensor  # uint8 [E*N/128, K/128, 32, 16]


class MxWeightT(NamedTuple):
    """W^T from an MXFP8 weight's transposed pair as mxfp8_quantize writes it (blocks along
    K): the backward's data-gradient operand, for `linear_mx(..., out_dtype=torch.float32)`
    (d_h) and `linear_mx_sum` (d_x)."""

    data: torch.Tensor  # float8_e4m3fn [E, N, K]
    scales: torch.Tensor  # uint8 [E*N/128, K/128, 32, 16]


class Kind(enum.IntEnum):
    """The grouped GEMM variants, named as DeepGEMM names its kernels: M_GROUPED multiplies each
    expert's row segment by that expert's weight, K_GROUPED reduces over the segment's rows (the
    weight gradients); NT / NN / TN say whether each operand is read transposed; then the
    precision of the weights and of the output (bf16 unless named). The values are the
    extension's (csrc)."""

    M_GROUPED_BF16_NT = 0  # bf16 a[seg] @ w[e]^T, w [E, N, K] -> bf16
    M_GROUPED_BF16_NN_F32 = 1  # bf16 a[seg] @ w[e], w [E, K, N] -> fp32
    M_GROUPED_BF16_NN_PAIR = 2  # a[seg] @ w[e] + a2[seg] @ w2[e], w and w2 [E, K, N] -> bf16
    K_GROUPED_BF16_TN = 3  # a[seg]^T @ b[seg] per expert -> bf16 [E, Ka, Kb]
    M_GROUPED_MXFP8_NT = 4  # the BF16_NT product with w an MXFP8 (E4M3 [E, N, K], scale) pair
    M_GROUPED_BF16_NT_SWIGLU = 5  # gate and up products + hidden = swiglu(gate, up) -> bf16 x3
    M_GROUPED_MXFP8_NT_F16_ROWS = 6  # MXFP8_NT on f16 rows rebased per row (RebasedRows)
    M_GROUPED_MXFP8_NT_F32 = 7  # MXFP8_NT -> fp32
    M_GROUPED_MXFP8_NT_PAIR = 8  # a[seg] @ w[e]^T + a2[seg] @ w2[e]^T, w and w2 MXFP8 pairs
    K_GROUPED_MXFP8_TN = 9  # K_GROUPED_BF16_TN with b an MXFP8 transposed pair


# The kinds whose launch has one group per expert (both operand sets in each tile).
_ONE_GROUP_KINDS = (
    Kind.M_GROUPED_BF16_NN_PAIR,
    Kind.M_GROUPED_BF16_NT_SWIGLU,
    Kind.M_GROUPED_MXFP8_NT_PAIR,
)


def available(device: torch.device) -> bool:
    """True when `device` is a GPU whose mok module carries the grouped GEMMs."""
    if device.type != "cuda":
        return False
    try:
        module = extension.module_for_device(device)
    except NotImplementedError:
        return False
    return bool(module.grouped_gemm_available())


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _scratch_bytes(device: torch.device, kind: Kind, groups: int) -> int:
    module = extension.module_for_device(device)
    return int(module.grouped_gemm_scratch_bytes(int(kind), groups, _sm_count(device)))


def _launch(
    kind: Kind,
    sets,
    rows: torch.Tensor,
    n: int,
    k: int,
    total_rows: int = 0,
    row_source=None,
    b_scales=(),
    hidden=None,
    limit=None,
    exponents=None,
    pull=None,
) -> None:
    """sets: one or two (a, b, d) tuples of contiguous 16-byte aligned tensors (the *_PAIR variants:
    the second set's d None); row_source: None or int32 [R] (R = the first operand's rows) on the
    device; b_scales: the M_GROUPED_MXFP8_* variants' scale tiles of each set's b; hidden and
    limit: M_GROUPED_BF16_NT_SWIGLU's third output and SwiGLU clamp; exponents:
    M_GROUPED_MXFP8_NT_F16_ROWS's (a's row exponents, [each b's row exponents]); pull: the
    pull_beside.overlapped_pull writing `a` (M_GROUPED_BF16_NT, M_GROUPED_BF16_NN_F32), run
    beside the GEMM. The GEMM is launched on every SM either way: beside a pull, the clusters
    that find their SMs held by it start as its CTAs exit and take the tiles left then (the
    waiting variants hand out tiles on demand, csrc/gemm/sm90/on_demand_scheduler.cuh)."""
    device = rows.device
    if row_source is not None:
        check_tensor("row_source", row_source, dtype=torch.int32, shape=[sets[0][0].shape[0]],
                     dims=["R"], device=device)  # fmt: skip
    experts = rows.shape[0]
    one_group = kind in _ONE_GROUP_KINDS
    groups = experts if one_group else len(sets) * experts
    nbytes = _scratch_bytes(device, kind, groups)
    scratch = torch.empty(nbytes, dtype=torch.uint8, device=device)
    first = sets[0]
    second = sets[1] if len(sets) > 1 else (None, None, None)
    extension.launch(
        device,
        "grouped_gemm",
        kind=int(kind),
        a=extension.address(first[0]),
        b=extension.address(first[1]),
        d=extension.address(first[2]),
        a2=extension.address(second[0]),
        b2=extension.address(second[1]),
        d2=extension.address(second[2]),
        rows=rows.data_ptr(),
        row_source=extension.address(row_source),
        experts=experts,
        n=n,
        k=k,
        total_rows=total_rows,
        sm_count=_sm_count(device),
        scratch=scratch.data_ptr(),
        scratch_bytes=nbytes,
        b_scale=extension.address(b_scales[0] if b_scales else None),
        b2_scale=extension.address(b_scales[1] if len(b_scales) > 1 else None),
        hidden=extension.address(hidden),
        has_limit=limit is not None,
        limit=0.0 if limit is None else float(limit),
        pull=None if pull is None else pull.native,
        **_exponent_arguments(exponents),
    )


def _exponent_arguments(exponents) -> dict:
    if exponents is None:
        return {}
    a_exponent, b_exponents = exponents
    return {
        "a_exponent": a_exponent.data_ptr(),
        "b_exponent": b_exponents[0].data_ptr(),
        "b2_exponent": extension.address(b_exponents[1] if len(b_exponents) > 1 else None),
    }


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return extension.aligned(t.to(_BF16))


def _shaped(name: str, t: torch.Tensor, shape: list, dims: str, device: torch.device) -> None:
    """A tensor of this shape on `device`, any float dtype (converted to bf16 before the launch):
    the kernels trust the sizes they are given, so every operand is checked first."""
    check_tensor(name, t, dtype=None, shape=shape, dims=dims.split(), device=device,
                 contiguous=False)  # fmt: skip


def _check_sets(name: str, sets: list) -> None:
    """One launch carries one or two operand sets (the kernels' tables hold two)."""
    if not 1 <= len(sets) <= 2:
        raise ValueError(f"`{name}` must hold 1 or 2 operand sets, got {len(sets)}")


def _experts(rows: torch.Tensor, a: torch.Tensor, name: str = "a") -> int:
    """Checks the segment sizes and one activation; returns the number of experts."""
    _shaped(name, a, [None, None], "R K", a.device if isinstance(a, torch.Tensor) else None)
    check_tensor("rows", rows, dtype=torch.int32, shape=[None], dims=["E"], device=a.device)
    return rows.shape[0]


def linear(
    a: torch.Tensor,
    weights: list[torch.Tensor],
    rows: torch.Tensor,
    row_source=None,
    zero_rest: bool = True,
    pull=None,
) -> list[torch.Tensor]:
    """bf16 a [R, K] @ w[e]^T per segment for each w [E, N, K] (one launch) -> bf16 [R, N] each.

    Rows past the last segment are zero (unspecified when not `zero_rest`: for buffers only the
    segments of are read), and so are the padding rows `row_source` marks. `pull`: the
    mok.backends.cuda.pull_beside.overlapped_pull that writes `a`, run beside the GEMM.
    """
    _check_sets("weights", weights)
    experts = _experts(rows, a)
    n = weights[0].shape[1] if weights[0].dim() == 3 else None
    for i, w in enumerate(weights):
        _shaped(f"weights[{i}]", w, [experts, n, a.shape[1]], "E N K", a.device)
    return _linear(
        Kind.M_GROUPED_BF16_NT, a, [_bf16(w) for w in weights], rows, row_source, zero_rest,
        pull=pull,
    )  # fmt: skip


def _linear(kind: Kind, a, weights, rows, row_source, zero_rest, scales=(), exponents=None,
            pull=None):  # fmt: skip
    """One launch of M_GROUPED_BF16_NT or M_GROUPED_MXFP8_NT* on checked operands -> [R, N] per
    weight (fp32 for M_GROUPED_MXFP8_NT_F32, bf16 otherwise)."""
    a = a if kind == Kind.M_GROUPED_MXFP8_NT_F16_ROWS else _bf16(a)
    dtype = torch.float32 if kind == Kind.M_GROUPED_MXFP8_NT_F32 else _BF16
    outs = [a.new_empty((a.shape[0], w.shape[1]), dtype=dtype) for w in weights]
    sets = [(a, w, out) for w, out in zip(weights, outs, strict=True)]
    total_rows = a.shape[0] if zero_rest else 0
    _launch(kind, sets, rows, weights[0].shape[1], a.shape[1], total_rows, row_source, scales,
            exponents=exponents, pull=pull)  # fmt: skip
    return outs


def linear_mx(
    a: torch.Tensor,
    weights,
    rows: torch.Tensor,
    row_source=None,
    zero_rest: bool = True,
    out_dtype: torch.dtype = _BF16,
) -> list[torch.Tensor]:
    """`linear` with MXFP8 weights read as stored, without a bf16 copy: each weight a (data
    float8_e4m3fn [E, N, K], scales uint8 [E*N/128, K/128, 32, 16]) pair as mxfp8_quantize
    writes it, N and K multiples of 128; outputs bf16 or (`out_dtype` torch.float32, the
    unrounded sums) fp32. Bit for bit what `linear` (`linear_transposed` for fp32) gives on the
    weights' mxfp8_dequantize values, up to the order of the fp32 accumulation."""
    kinds = {_BF16: Kind.M_GROUPED_MXFP8_NT, torch.float32: Kind.M_GROUPED_MXFP8_NT_F32}
    if out_dtype not in kinds:
        raise ValueError(f"`out_dtype` must be torch.bfloat16 or torch.float32, got {out_dtype}")
    data, scales = mx_weight_operands(a, weights, rows)
    return _linear(kinds[out_dtype], a, data, rows, row_source, zero_rest, scales)


def linear_mx_sum(terms, rows: torch.Tensor, row_source=None, zero_rest: bool = True):
    """a1 @ w1[e]^T + a2 @ w2[e]^T per segment in one fp32 accumulation (one launch) ->
    bf16 [R, N], for two (a [R, K], w) terms of one shape whose w are MXFP8 (data
    float8_e4m3fn [E, N, K], scales) pairs read as stored, N and K multiples of 128: the
    backward's d_x from W_gate's and W_up's transposed pairs. Rows as in `linear_sum`."""
    (a1, w1), (a2, w2) = terms
    _experts(rows, a1, "terms[0][0] (a)")
    _shaped("terms[1][0] (a)", a2, list(a1.shape), "R K", a1.device)
    data, scales = mx_weight_operands(a1, [w1, w2], rows, item="terms[{i}][1]")
    a1, a2 = _bf16(a1), _bf16(a2)
    out = a1.new_empty((a1.shape[0], data[0].shape[1]))
    total_rows = a1.shape[0] if zero_rest else 0
    _launch(Kind.M_GROUPED_MXFP8_NT_PAIR, [(a1, data[0], out), (a2, data[1], None)], rows,
    out.shape[1],
            a1.shape[1], total_rows, row_source, scales)  # fmt: skip
    return out


def mx_weight_operands(
    a: torch.Tensor, weights, rows: torch.Tensor, scale_dtype=torch.uint8, item="weights[{i}]"
):
    """The checked, aligned (data, scales) lists of MXFP8 weights for activations `a` [R, K]
    (`scale_dtype` torch.int16: M_GROUPED_MXFP8_NT_F16_ROWS's f16 factor tiles in the scales'
    place); `item` names weight i in errors."""
    _check_sets("weights", weights)
    experts = _experts(rows, a)
    k = a.shape[1]
    first = weights[0][0] if isinstance(weights[0][0], torch.Tensor) else None
    n = first.shape[1] if first is not None and first.dim() == 3 else None
    if n is not None and (n % 128 or k % 128):
        raise ValueError(f"MXFP8 weights need N and K multiples of 128, got N={n}, K={k}")
    for i, (data, scales) in enumerate(weights):
        name = item.format(i=i)
        check_tensor(f"{name}[0] (data)", data, dtype=torch.float8_e4m3fn,
                     shape=[experts, n, k], dims=["E", "N", "K"], device=a.device)  # fmt: skip
        check_tensor(f"{name}[1] (scales)", scales, dtype=scale_dtype,
                     shape=[experts * n // 128, k // 128, 32, 16],
                     dims=["E*N/128", "K/128", "32", "16"], device=a.device)  # fmt: skip
    data = [extension.aligned(d) for d, _ in weights]
    scales = [extension.aligned(sc) for _, sc in weights]
    return data, scales


def linear_transposed(
    a: torch.Tensor,
    weight_t: torch.Tensor,
    rows: torch.Tensor,
    zero_rest: bool = True,
    row_source=None,
    pull=None,
) -> torch.Tensor:
    """a [R, K] @ w[e] per segment for w [E, K, N] -> fp32 [R, N]; rows past the segments are
    zero, or unspecified when not `zero_rest` (for buffers only the segments of are read); the
    padding rows `row_source` marks are zero. `pull` as in `linear`."""
    _shaped("weight_t", weight_t, [_experts(rows, a), a.shape[1], None], "E K N", a.device)
    a, weight_t = _bf16(a), _bf16(weight_t)
    out = a.new_empty((a.shape[0], weight_t.shape[2]), dtype=torch.float32)
    total_rows = a.shape[0] if zero_rest else 0
    _launch(Kind.M_GROUPED_BF16_NN_F32, [(a, weight_t, out)], rows, out.shape[1], a.shape[1],
            total_rows, row_source, pull=pull)  # fmt: skip
    return out


def linear_sum(terms, rows: torch.Tensor, row_source=None, zero_rest: bool = True):
    """a1 @ w1[e] + a2 @ w2[e] per segment for two (a [R, K], w [E, K, N]) terms of one shape,
    in one fp32 accumulation (one launch) -> bf16 [R, N]; rows past the segments (unless not
    `zero_rest`) and the padding rows `row_source` marks are zero."""
    (a1, w1), (a2, w2) = terms
    experts = _experts(rows, a1, "terms[0][0] (a)")
    weight_shape = [experts, a1.shape[1], w1.shape[2] if w1.dim() == 3 else None]
    _shaped("terms[0][1] (w)", w1, weight_shape, "E K N", a1.device)
    _shaped("terms[1][0] (a)", a2, list(a1.shape), "R K", a1.device)
    _shaped("terms[1][1] (w)", w2, weight_shape, "E K N", a1.device)
    (a1, w1), (a2, w2) = ((_bf16(a), _bf16(w)) for a, w in terms)
    out = a1.new_empty((a1.shape[0], w1.shape[2]))
    total_rows = a1.shape[0] if zero_rest else 0
    _launch(Kind.M_GROUPED_BF16_NN_PAIR, [(a1, w1, out), (a2, w2, None)], rows, out.shape[1],
    a1.shape[1],
            total_rows, row_source)  # fmt: skip
    return out


def weight_grads(pairs, rows: torch.Tensor, row_source=None) -> list[torch.Tensor]:
    """d_out[seg]^T @ a[seg] per expert for each (d_out [R, N], a [R, K]) pair of one shape
    (one launch) -> bf16 [E, N, K] each; experts without rows get exact zeros; the padding rows
    `row_source` marks are left out of the sums."""
    _check_sets("pairs", pairs)
    first_d, first_a = pairs[0]
    _experts(rows, first_a, "pairs[0][1] (a)")
    rows_k = list(first_a.shape)
    for i, (d_out, a) in enumerate(pairs):
        _shaped(f"pairs[{i}][0] (d_out)", d_out, [rows_k[0], first_d.shape[-1]], "R N", a.device)
        _shaped(f"pairs[{i}][1] (a)", a, rows_k, "R K", first_a.device)
    pairs = [(_bf16(d_out), _bf16(a)) for d_out, a in pairs]
    n_out, k_in = pairs[0][0].shape[1], pairs[0][1].shape[1]
    outs = [pairs[0][0].new_empty((rows.shape[0], n_out, k_in)) for _ in pairs]
    sets = [(d_out, a, out) for (d_out, a), out in zip(pairs, outs, strict=True)]
    _launch(Kind.K_GROUPED_BF16_TN, sets, rows, k_in, n_out, row_source=row_source)
    return outs
