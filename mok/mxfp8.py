"""The MXFP8 format: pure-PyTorch quantize/dequantize reference and the scale swizzle.

This is the oracle the CUDA quantize kernel is compared against byte for byte; it runs on CPU or
CUDA tensors and has no Python loop over elements.

Format (OCP MX, DESIGN.md §4)
-----------------------------
Every 32 consecutive elements along the reduction (last) dimension form a block with one E8M0
scale byte ``b``; the block represents ``element * 2**(b - 127)``.

- ``e`` is the smallest integer with ``amax <= 448 * 2**e`` (that is ``ceil(log2(amax / 448))``
  in exact arithmetic), found from the exponent and mantissa of ``amax`` without a float log2.
  ``b = clamp(e, -127, 127) + 127``; an all-zero block gets ``b = 0``.
- Elements are E4M3 (``torch.float8_e4m3fn``): round-to-nearest-even of ``x / 2**(b - 127)``
  (an exact power-of-two scaling), saturated to ±448. Zero keeps its sign (``-0.0`` -> 0x80).

Non-finite inputs (the CUDA kernel must do the same):

- ``±inf``: the block's amax is inf, so ``e`` clamps to 127 (``b = 254``); the inf elements
  saturate to ±448 (0x7E / 0xFE) and the block's finite elements, scaled by 2**-127, become ±0.
  Dequantizing gives back ±inf (448 * 2**127 overflows fp32).
- ``NaN``: ignored when taking the block amax (as CUDA ``fmaxf`` does), so the other elements
  quantize as if it were absent; every NaN element becomes the canonical E4M3 NaN 0x7F whatever
  its sign. An all-NaN block gets ``b = 0``.

Tensors
-------
================  ====================  ====================================================
name              dtype                 shape
================  ====================  ====================================================
``x``             bf16                  ``[M, N]`` or ``[E, M, N]``; M, N multiples of 128
``x_fp8``         float8_e4m3fn         same as ``x``; blocks along N
``x_sc``          uint8                 ``[E*M/128, N/128, 32, 16]`` (E = 1 for 2-D)
``x_fp8_t``       float8_e4m3fn         ``[N, M]`` or ``[E, N, M]`` (the transpose of x); blocks
                                        along M
``x_sc_t``        uint8                 ``[E*N/128, M/128, 32, 16]``
``scales_rc``     uint8                 ``[R, C/32]``: row-major, unswizzled
================  ====================  ====================================================

Swizzle: for a ``[R, C]`` matrix the scales are cut into 128-row x 128-column tiles (4 scale
bytes per row per tile); tile ``(R/128 index, C/128 index)`` holds 512 bytes, and the byte of
local row ``r`` and k-block ``kb`` (0..3) sits at offset ``(r % 32)*16 + (r // 32)*4 + kb``. A
3-D tensor is swizzled as its ``[E*M, N]`` row stack (M % 128 == 0, so no tile spans experts).

Where MXFP8 mode quantizes what
-------------------------------
Each GEMM operand is quantized with its blocks along the dimension that GEMM reduces over: the
normal form (blocks along the last dim) serves a product that reduces over the last dim, the
transposed form one that reduces over the second-to-last. For the routed weights (API.md,
``nn.Linear`` layout) this gives: gate and up ``[E, I, H]`` normal for the forward (reduce over
H) and transposed ``[E, H, I]`` for the backward input gradient (reduce over I); down
``[E, H, I]`` normal for the forward (reduce over I) and transposed ``[E, I, H]`` for the
backward input gradient (reduce over H) -- the forms ``backward`` takes in MXFP8 mode.
"""

from __future__ import annotations

import torch

from mok._arguments import check_multiple, check_tensor, describe

BLOCK = 32  # elements per E8M0 scale
TILE = 128  # rows and columns of one swizzled scale tile
E4M3_MAX = 448.0
_E4M3_NAN = 0x7F  # canonical E4M3 NaN byte (also what cvt.rn.satfinite gives for NaN)
_E8M0_NAN = 0xFF
_FP32_2_POW_M127 = 0x00400000  # bits of 2**-127, an fp32 subnormal (exponent field 0)
_FP32_QNAN = 0x7FC00000


def _pow2(biased: torch.Tensor) -> torch.Tensor:
    """``2**(b - 127)`` as exact fp32 for integer ``b`` in [0, 255] (255 gives NaN).

    An E8M0 byte is an fp32 exponent field, so shifting it into place builds the power of two
    with no rounding; only ``b = 0`` (2**-127) needs the subnormal bit pattern instead.
    """
    bits = biased.to(torch.int32) << 23
    bits = torch.where(biased == 0, _FP32_2_POW_M127, bits)
    bits = torch.where(biased == _E8M0_NAN, _FP32_QNAN, bits)
    return bits.view(torch.float32)


def _block_amax(blocks: torch.Tensor) -> torch.Tensor:
    """Max |x| over the last dim of fp32 ``[..., 32]`` blocks, NaN ignored (like CUDA fmaxf)."""
    mag = blocks.abs()
    mag = torch.where(torch.isnan(mag), 0.0, mag)
    return mag.amax(dim=-1)


def _byte_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """E8M0 byte for fp32 block maxima (non-negative, never NaN)."""
    # amax = mant * 2**expo with mant in [0.5, 1), and 448 = 0.875 * 2**9, so
    # amax <= 448 * 2**e  <=>  mant <= 0.875 * 2**(e + 9 - expo). The smallest such e is
    # expo - 9 when mant <= 0.875 (the exact boundary) and expo - 8 otherwise. frexp is exact,
    # including for subnormal amax, so no rounded log2 can push e off by one.
    mant, expo = torch.frexp(amax)
    e = expo - 9 + (mant > 0.875).to(torch.int32)
    # ceil(log2(0)) and ceil(log2(inf)) are -inf and +inf; frexp does not return those.
    e = torch.where(amax == 0, -127, e)
    e = torch.where(torch.isinf(amax), 127, e)
    return (e.clamp(-127, 127) + 127).to(torch.uint8)


def scale_bytes(x: torch.Tensor) -> torch.Tensor:
    """E8M0 scale bytes of bf16 or float32 ``x`` ``[..., C]`` (C % 32 == 0): uint8 ``[..., C/32]``.

    NaN elements are ignored; see the module docstring for the rule.
    """
    _check_blocked_float("x", x)
    blocks = x.float().unflatten(-1, (-1, BLOCK))
    return _byte_from_amax(_block_amax(blocks))


def to_e4m3(y: torch.Tensor) -> torch.Tensor:
    """Round float32 ``y`` to E4M3: nearest-even, saturated to ±448, every NaN -> 0x7F."""
    rank = y.dim() if isinstance(y, torch.Tensor) else 0
    check_tensor("y", y, dtype=torch.float32, shape=[None] * rank, contiguous=False)
    # torch's cast is round-to-nearest-even for every value inside ±448 (subnormals included),
    # but turns larger values into NaN, so saturation is done first and explicitly.
    saturated = y.clamp(-E4M3_MAX, E4M3_MAX)
    bits = saturated.to(torch.float8_e4m3fn).view(torch.uint8)
    bits = torch.where(torch.isnan(y), _E4M3_NAN, bits)
    return bits.view(torch.float8_e4m3fn)


def _quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 ``[R, C]`` -> (float8_e4m3fn ``[R, C]``, unswizzled uint8 ``[R, C/32]``)."""
    blocks = x.float().unflatten(-1, (-1, BLOCK))
    scales_rc = _byte_from_amax(_block_amax(blocks))
    # 2**(127 - b) = _pow2(254 - b). x * 2**(127 - b) is exact whenever the product is an fp32
    # normal; a product below 2**-126 is far under the smallest E4M3 rounding boundary (2**-10),
    # so any fp32 rounding there cannot change the E4M3 result.
    inverse = _pow2(254 - scales_rc.to(torch.int32))
    data = to_e4m3(blocks * inverse.unsqueeze(-1)).flatten(-2)
    return data, scales_rc


def _quantize_matrix(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize bf16 ``[..., R, C]`` (any strides) with blocks along C; scales swizzled."""
    # Made contiguous first so the fp8 data comes out contiguous even for a transposed view.
    data, scales_rc = _quantize_rows(x.contiguous().reshape(-1, x.shape[-1]))
    return data.reshape(x.shape), swizzle_scales(scales_rc)


def quantize(
    x: torch.Tensor, return_normal: bool = True, return_transposed: bool = False
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Quantize bf16 ``[M, N]`` / ``[E, M, N]`` to MXFP8 -> ``(x_fp8, x_sc, x_fp8_t, x_sc_t)``.

    The normal pair has blocks along N; the transposed pair is ``x.transpose(-1, -2)`` made
    contiguous and quantized with blocks along M. A pair not asked for is ``(None, None)``.
    Shapes are in the module docstring.
    """
    _check_flags(return_normal, return_transposed)
    _check_matrix("x", x, torch.bfloat16)
    x_fp8, x_sc = _quantize_matrix(x) if return_normal else (None, None)
    x_fp8_t, x_sc_t = _quantize_matrix(x.transpose(-1, -2)) if return_transposed else (None, None)
    return x_fp8, x_sc, x_fp8_t, x_sc_t


def dequantize(data_fp8: torch.Tensor, scales_swizzled: torch.Tensor) -> torch.Tensor:
    """MXFP8 back to float32 of ``data_fp8``'s shape: ``element * 2**(byte - 127)``, exactly.

    ``data_fp8`` float8_e4m3fn ``[R, C]`` or ``[E, R, C]`` with blocks along C; ``scales_swizzled``
    uint8 ``[E*R/128, C/128, 32, 16]``. A byte of 255 (E8M0 NaN) gives NaN; products beyond the
    fp32 range give ±inf.
    """
    _check_matrix("data_fp8", data_fp8, torch.float8_e4m3fn)
    rows = data_fp8.numel() // data_fp8.shape[-1]
    cols = data_fp8.shape[-1]
    check_tensor(
        "scales_swizzled",
        scales_swizzled,
        dtype=torch.uint8,
        shape=[rows // TILE, cols // TILE, 32, 16],
        dims=["E*R/128", "C/128", "32", "16"],
        device=data_fp8.device,
        contiguous=False,
    )
    scales_rc = unswizzle_scales(scales_swizzled, rows, cols)
    blocks = data_fp8.reshape(rows, cols // BLOCK, BLOCK).float()
    return (blocks * _pow2(scales_rc).unsqueeze(-1)).reshape(data_fp8.shape)


def swizzle_scales(scales_rc: torch.Tensor) -> torch.Tensor:
    """Row-major uint8 ``[R, C/32]`` -> swizzled ``[R/128, C/128, 32, 16]`` (R, C % 128 == 0)."""
    check_tensor(
        "scales_rc",
        scales_rc,
        dtype=torch.uint8,
        shape=[None, None],
        dims=["R", "C/32"],
        contiguous=False,
    )
    rows, groups = scales_rc.shape
    check_multiple("scales_rc.shape[0] (R)", rows, TILE)
    check_multiple("scales_rc.shape[1] (C/32)", groups, TILE // BLOCK)
    # Row index = row_tile*128 + (r // 32)*32 + r % 32, column = k_tile*4 + kb; reorder the
    # axes to (row_tile, k_tile, r % 32, r // 32, kb), which is the offset formula.
    tiles = scales_rc.reshape(rows // TILE, 4, 32, groups // 4, 4)
    return tiles.permute(0, 3, 2, 1, 4).reshape(rows // TILE, groups // 4, 32, 16)


def unswizzle_scales(scales_swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Swizzled uint8 ``[R/128, C/128, 32, 16]`` -> row-major ``[R, C/32]``; ``cols`` is C."""
    check_multiple("rows", rows, TILE)
    check_multiple("cols", cols, TILE)
    check_tensor(
        "scales_swizzled",
        scales_swizzled,
        dtype=torch.uint8,
        shape=[rows // TILE, cols // TILE, 32, 16],
        dims=["R/128", "C/128", "32", "16"],
        contiguous=False,
    )
    tiles = scales_swizzled.reshape(rows // TILE, cols // TILE, 32, 4, 4)
    return tiles.permute(0, 3, 2, 1, 4).reshape(rows, cols // BLOCK)


def _check_flags(return_normal: object, return_transposed: object) -> None:
    for name, flag in (("return_normal", return_normal), ("return_transposed", return_transposed)):
        if not isinstance(flag, bool):
            raise TypeError(f"`{name}` must be a bool, got {describe(flag)}")
    if not (return_normal or return_transposed):
        raise ValueError(
            "`return_normal` and `return_transposed` must not both be False: nothing to return"
        )


def _check_matrix(name: str, value: object, dtype: torch.dtype) -> None:
    """``value`` is a ``dtype`` tensor [M, N] or [E, M, N] with M and N multiples of 128."""
    rank = value.dim() if isinstance(value, torch.Tensor) else 2
    # Type and dtype first (TypeError), whatever the rank.
    check_tensor(name, value, dtype=dtype, shape=[None] * rank, contiguous=False)
    if rank not in (2, 3):
        raise ValueError(f"`{name}` must be [M, N] or [E, M, N], got {describe(value)}")
    check_multiple(f"{name}.shape[-2] (M)", value.shape[-2], TILE)
    check_multiple(f"{name}.shape[-1] (N)", value.shape[-1], TILE)


def _check_blocked_float(name: str, value: object) -> None:
    """``value`` is a bf16 or float32 tensor [..., C] with C a multiple of 32."""
    if not isinstance(value, torch.Tensor) or value.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"`{name}` must be bf16 or float32 [..., C], got {describe(value)}")
    if value.dim() == 0:
        raise ValueError(f"`{name}` must be bf16 or float32 [..., C], got {describe(value)}")
    check_multiple(f"{name}.shape[-1] (C)", value.shape[-1], BLOCK)


def keep_limit_side(
    pair: tuple[torch.Tensor, torch.Tensor], values: torch.Tensor, limit: float, both_signs: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The MXFP8 `pair` of `values` with every element on the side of `limit` its value is on.

    The SwiGLU backward decides from the forward's saved MXFP8 gate and up where the clamp was
    active (gate > L; |up| > L with `both_signs`); rounding to nearest can carry a value just
    above L onto it, or one just below across it, and the backward would then decide otherwise
    than the forward did. Such elements take the neighbouring E4M3 code on the value's side
    instead (one step in magnitude; the block scale is unchanged, and E4M3 codes of one sign are
    ordered by magnitude); docs/mxfp8.md, "The clamp's side".
    """
    data, scales = pair
    stored = dequantize(data, scales)
    value = values.float()
    if both_signs:
        stored, value = stored.abs(), value.abs()
    codes = data.view(torch.uint8).to(torch.int16)
    magnitude = codes & 0x7F
    # 0x7E (448) has no larger finite neighbour: only an inf input saturates there, and its
    # block's scale makes the stored value inf, on the inf's side already.
    up = (value > limit) & (stored <= limit) & (magnitude < 0x7E)
    down = (value <= limit) & (stored > limit) & (magnitude > 0)
    codes = codes + up.to(torch.int16) - down.to(torch.int16)
    return codes.to(torch.uint8).view(torch.float8_e4m3fn), scales
