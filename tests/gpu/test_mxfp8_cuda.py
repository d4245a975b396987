"""The CUDA MXFP8 quantize kernel against the reference (mok.mxfp8.quantize), byte for byte.

Fresh random data every run (the seed is printed, so a failure can be replayed with
MOK_TEST_SEED), outputs poisoned before the kernel writes them, 2-D and 3-D inputs, both layouts,
several sizes, and a bandwidth figure next to the measured copy bandwidth.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from gpu_helpers import device_copy_gb_per_s, median_ms, module_seed, requires_gpu_module

from mok import mxfp8
from mok.backends.cuda import extension as _extension
from mok.backends.cuda import mxfp8 as cuda_backend

pytestmark = pytest.mark.gpu

POISON = 0x5A  # neither a plausible scale byte pattern for these inputs nor 0


requires_module = requires_gpu_module()


seed = module_seed("mxfp8 cuda")


def _random_bf16(
    shape: tuple[int, ...], seed: int, special: bool, row_spread: int = 40
) -> torch.Tensor:
    """Normal data, each row scaled by 2^j for a random j in [-row_spread, row_spread) (0: one
    scale for all, so most 32-row column blocks hold no element below their floor); `special`
    adds zero blocks, +-inf, NaN, bf16 subnormals, values at the top of the range, blocks whose
    scale exponent is at either edge of the kernels' fast rounding form (-121, -120, 98, 99:
    csrc/mxfp8/round.cuh), the largest element 448 * 2^e exactly, the others spread
    below it, and blocks with elements at and just below the floor of the kernels' packed form."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, generator=gen, device="cuda")
    if row_spread:
        j = torch.randint(-row_spread, row_spread, (*shape[:-1], 1), generator=gen, device="cuda")
        x = x * torch.exp2(j.float())
    x = x.to(torch.bfloat16)
    if special:
        flat = x.view(-1, 32)
        count = max(1, flat.shape[0] // 64)
        picks = torch.randint(0, flat.shape[0], (11, count), generator=gen, device="cuda")
        for pick, exponent in zip(picks[6:10], (-121, -120, 98, 99), strict=True):
            block = flat[pick].float()
            top = block.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
            flat[pick] = (block / top * 448.0 * 2.0**exponent).to(torch.bfloat16)
        flat[picks[0]] = 0.0
        flat[picks[1], 3] = float("inf")
        flat[picks[2], 7] = float("-inf")
        flat[picks[3], 11] = float("nan")
        flat[picks[4]] = flat[picks[4]] * 2.0**-120  # bf16 subnormals and underflow to zero
        flat[picks[5], 0] = 3.0e38
        _floor_blocks(flat, picks[10])
    return x


def _floor_blocks(flat: torch.Tensor, pick: torch.Tensor) -> None:
    """Blocks with scale 2^-3 holding their floor 2^(e-6) (the smallest E4M3 normal once
    scaled): in the first 16-element chunk beside a zero and the bf16 just below the floor (the
    kernels' per-element form), alone at the floor in the second (their packed form)."""
    block = flat[pick].float().abs().clamp(1.0, 400.0) * 2.0**-3
    block[:, 0] = 448.0 * 2.0**-3
    floor = 2.0**-9
    block[:, 1], block[:, 2], block[:, 3], block[:, 4] = floor, -floor * (1 - 2.0**-8), 0.0, -floor
    block[:, 16] = floor
    block[:, 17] = -floor
    flat[pick] = block.to(torch.bfloat16)


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, POISON, dtype=torch.uint8, device="cuda").view(dtype)


def _kernel(x: torch.Tensor, normal: bool, transposed: bool):
    """Call the extension directly on poisoned output buffers."""
    module = _extension.module_for_device(x.device)
    experts, rows, cols = (1, *x.shape) if x.dim() == 2 else x.shape
    batch = x.shape[:-2]
    outs = [None, None, None, None]
    if normal:
        outs[0] = _poisoned((*batch, rows, cols), torch.float8_e4m3fn)
        outs[1] = _poisoned((experts * rows // 128, cols // 128, 32, 16), torch.uint8)
    if transposed:
        outs[2] = _poisoned((*batch, cols, rows), torch.float8_e4m3fn)
        outs[3] = _poisoned((experts * cols // 128, rows // 128, 32, 16), torch.uint8)
    address = [0 if t is None else t.data_ptr() for t in outs]
    stream = torch.cuda.current_stream().cuda_stream
    module.mxfp8_quantize(x.data_ptr(), *address, 0, 0, 0, experts, rows, cols, stream)
    return tuple(outs)


def _reference(x: torch.Tensor, normal: bool, transposed: bool):
    """The oracle, run on the CPU so that no GPU arithmetic mode can touch it."""
    return mxfp8.quantize(x.cpu(), normal, transposed)


def _assert_same_bytes(got, want, what: str) -> None:
    for name, g, w in zip(("x_fp8", "x_sc", "x_fp8_t", "x_sc_t"), got, want, strict=True):
        if w is None:
            assert g is None, f"{what}: {name} should be None"
            continue
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: {name} {g.shape} {w.shape}"
        gb, wb = g.cpu().view(torch.uint8), w.cpu().view(torch.uint8)
        bad = (gb != wb).nonzero()
        assert bad.numel() == 0, (
            f"{what}: {name} differs at {bad.shape[0]} bytes, first at {bad[0].tolist()}: "
            f"kernel {gb[tuple(bad[0])].item():#04x}, reference {wb[tuple(bad[0])].item():#04x}"
        )


SHAPES = [(128, 128), (256, 384), (640, 128), (1024, 7168), (2, 128, 256), (5, 384, 640)]
LAYOUTS = [(True, False), (False, True), (True, True)]


@requires_module
@pytest.mark.parametrize("special", [False, True], ids=["randn", "special-values"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=["normal", "transposed", "both"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_kernel_matches_reference(shape, layout, special, seed):
    x = _random_bf16(shape, seed + hash((shape, special)) % 1000, special)
    got = _kernel(x, *layout)
    want = _reference(x, *layout)
    _assert_same_bytes(got, want, f"shape {shape} layout {layout}")


@requires_module
def test_backend_matches_reference_and_is_deterministic(seed):
    x = _random_bf16((3, 512, 256), seed, special=True)
    first = cuda_backend.mxfp8_quantize(x, True, True)
    second = cuda_backend.mxfp8_quantize(x, True, True)
    _assert_same_bytes(first, _reference(x, True, True), "backend")
    _assert_same_bytes(first, second, "second run")


@requires_module
def test_backend_accepts_a_non_contiguous_input(seed):
    base = _random_bf16((256, 384), seed, special=False)
    x = base.t()  # [384, 256], strided
    _assert_same_bytes(
        cuda_backend.mxfp8_quantize(x, True, True), _reference(x, True, True), "transposed view"
    )


@requires_module
@pytest.mark.parametrize("special", [False, True], ids=["randn", "special-values"])
@pytest.mark.parametrize("shape", [(128, 128), (384, 256), (2, 256, 512)], ids=str)
def test_dequantize_matches_reference_bitwise(shape, special, seed):
    """cuda.mxfp8_dequantize == bf16(mok.mxfp8.dequantize), plain and transposed, for both
    layouts, with every scale byte the quantizer writes, E4M3 subnormals and NaN; plus scale
    bytes 0 and 255 forced in."""
    x = _random_bf16(shape, seed, special)
    data, scales, data_t, scales_t = cuda_backend.mxfp8_quantize(x, True, True)
    scales = scales.clone()
    scales.view(-1)[:2] = torch.tensor([0, 255], dtype=torch.uint8)
    for pair, transposed in itertools.product(((data, scales), (data_t, scales_t)), (False, True)):
        got = cuda_backend.mxfp8_dequantize(*pair, transposed=transposed)
        want = mxfp8.dequantize(*pair).to(torch.bfloat16)
        want = want.transpose(-2, -1).contiguous() if transposed else want
        assert got.dtype == torch.bfloat16 and got.shape == want.shape and got.is_contiguous()
        nan = want.isnan()  # NaN payloads may differ; positions may not
        assert torch.equal(got.isnan(), nan)
        assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


def _assert_same_values(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """bf16 tensors equal bit for bit, NaN payloads aside (their positions must match)."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape, what
    nan = want.isnan()
    bad = (got.isnan() != nan) | (~nan & (got.view(torch.int16) != want.view(torch.int16)))
    if bad.any():
        first = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(
            f"{what}: {int(bad.sum())} values differ, first at {list(first)}: got "
            f"{got[first].item()!r}, want {want[first].item()!r}"
        )


ROUND_DATA = {"randn": (False, 40), "special-values": (True, 40), "one-scale": (False, 0)}


@requires_module
@pytest.mark.parametrize("dataset", list(ROUND_DATA))
@pytest.mark.parametrize("shape", [(128, 128), (640, 384), (2, 256, 512)], ids=str)
def test_round_is_quantize_then_dequantize_in_one_pass(shape, dataset, seed):
    """mxfp8_round's values == mxfp8_dequantize(normal pair), its pair == the quantizer's
    transposed pair, and mxfp8_round_rows == the transposed pair dequantized, bit for bit.
    "one-scale" rows share a scale, so the rows rounding's column blocks take its packed form
    (csrc/mxfp8/round.cuh) as well as the per-element ones."""
    special, row_spread = ROUND_DATA[dataset]
    x = _random_bf16(shape, seed, special, row_spread)
    data, scales, data_t, scales_t = cuda_backend.mxfp8_quantize(x, True, True)
    want = cuda_backend.mxfp8_dequantize(data, scales)
    values, pair_t = cuda_backend.mxfp8_round(x, transposed=True)
    _assert_same_values(values, want, "rounded values, with the transposed pair")
    _assert_same_bytes((None, None, *pair_t), (None, None, data_t, scales_t), "transposed pair")
    values, none = cuda_backend.mxfp8_round(x)
    assert none is None
    _assert_same_values(values, want, "rounded values alone")
    want_rows = cuda_backend.mxfp8_dequantize(data_t, scales_t, transposed=True)
    _assert_same_values(cuda_backend.mxfp8_round_rows(x), want_rows, "rounded rows")


@requires_module
@pytest.mark.parametrize("shape", [(256, 384), (2, 128, 256)], ids=str)
def test_round_rows_of_scaled_rows_is_scale_rows_then_round_rows(shape, seed):
    """mxfp8_round_rows(x, row_scale=w) == mxfp8_round_rows(bf16(w[r] * x[r])) bit for bit
    (the MXFP8 backward's d_out rows times their router weights, never stored), with weights
    of both signs, zeros and a NaN row among them; a row_scale of the wrong size is refused."""
    x = _random_bf16(shape, seed, special=True)
    rows = x.numel() // x.shape[-1]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    weight = torch.randn(rows, generator=gen, device="cuda") * 4
    weight[::7] = 0.0
    weight[5] = float("nan")
    scaled = (weight[:, None] * x.reshape(rows, -1).float()).to(torch.bfloat16).reshape(shape)
    want = cuda_backend.mxfp8_round_rows(scaled)
    _assert_same_values(cuda_backend.mxfp8_round_rows(x, row_scale=weight), want, "scaled rows")
    with pytest.raises(ValueError, match="row_scale"):
        cuda_backend.mxfp8_round_rows(x, row_scale=weight[:-1])


@requires_module
def test_round_leaves_tiles_past_used_rows_unwritten(seed):
    """With used_rows = 256 of 640 rows, rows (and transposed columns) from 256 on keep their
    poison and the rest equal the full launch's bytes."""
    x = _random_bf16((640, 384), seed, special=False)
    values, (data_t, scales_t) = cuda_backend.mxfp8_round(x, transposed=True)
    rounded = _poisoned((640, 2 * 384), torch.bfloat16)  # shape in bytes
    out_t = _poisoned((384, 640), torch.float8_e4m3fn)
    scale_t = _poisoned((3, 5, 32, 16), torch.uint8)
    used = torch.tensor([256], dtype=torch.int32, device="cuda")
    module = _extension.module_for_device(x.device)
    stream = torch.cuda.current_stream().cuda_stream
    addresses = (out_t.data_ptr(), scale_t.data_ptr(), rounded.data_ptr(), used.data_ptr())
    module.mxfp8_quantize(x.data_ptr(), 0, 0, *addresses[:3], 0, addresses[3], 1, 640, 384, stream)
    every, head, tail = slice(None), slice(None, 256), slice(256, None)
    cases = [
        (rounded, values, (head,), (tail,)),  # rows
        (out_t, data_t, (every, head), (every, tail)),  # columns of the transposed data
        (scale_t, scales_t, (every, slice(None, 2)), (every, slice(2, None))),  # 128-row tiles
    ]
    for got, full, kept, unwritten in cases:
        assert torch.equal(got[kept].view(torch.uint8), full[kept].view(torch.uint8))
        assert (got[unwritten].view(torch.uint8) == POISON).all(), "wrote past used_rows"


@requires_module
def test_dequantize_rejects_mismatched_scales():
    data = torch.zeros(256, 128, dtype=torch.float8_e4m3fn, device="cuda")
    with pytest.raises(ValueError, match=r"`scales` must be uint8 \[2, 1, 32, 16\]"):
        cuda_backend.mxfp8_dequantize(data, torch.zeros(1, 1, 32, 16, dtype=torch.uint8))


@requires_module
def test_kernel_rejects_bad_arguments():
    module = _extension.module_for_device()
    x = torch.zeros(128, 128, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(128 * 128 + 16, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    o = out.data_ptr()

    def call(out_, scale, out_t, scale_t, rounded, rounded_rows, used, rows):
        module.mxfp8_quantize(x.data_ptr(), out_, scale, out_t, scale_t, rounded, rounded_rows,
                              used, 1, rows, 128, stream)  # fmt: skip

    with pytest.raises(ValueError, match="16-byte aligned"):
        call(o + 1, o, 0, 0, 0, 0, 0, 128)
    with pytest.raises(ValueError, match="multiple of 128"):
        call(o, o, 0, 0, 0, 0, 0, 100)
    with pytest.raises(ValueError, match="at least one"):
        call(0, 0, 0, 0, 0, 0, 0, 128)
    with pytest.raises(ValueError, match="`rounded` must be 16-byte aligned"):
        call(0, 0, 0, 0, o + 2, 0, 0, 128)
    with pytest.raises(ValueError, match="`used_rows` must be 4-byte aligned"):
        call(0, 0, 0, 0, o, 0, o + 1, 128)
    with pytest.raises(ValueError, match="`rounded_rows` is written alone"):
        call(0, 0, 0, 0, o, o, 0, 128)


@requires_module
@pytest.mark.parametrize("shape", [(8192, 7168), (8, 3072, 7168)], ids=["2d", "3d"])
def test_bandwidth(shape, capsys):
    x = torch.randn(shape, device="cuda").to(torch.bfloat16)
    elements = x.numel()
    copy_gbs = device_copy_gb_per_s(elements * 2, iterations=20)
    with capsys.disabled():
        print(f"\nmxfp8 quantize {list(shape)} on {torch.cuda.get_device_name()}:")
        print(f"  device copy (read + write): {copy_gbs:8.0f} GB/s")
        for normal, transposed in LAYOUTS:
            layouts = int(normal) + int(transposed)
            moved = elements * 2 + layouts * (elements + elements // 32)
            ms = median_ms(
                lambda n=normal, t=transposed: cuda_backend.mxfp8_quantize(x, n, t), iterations=20
            )
            name = "both" if layouts == 2 else ("normal" if normal else "transposed")
            print(
                f"  {name:>10}: {ms * 1e3:8.1f} us  {moved / ms / 1e6:8.0f} GB/s "
                f"({moved / ms / 1e6 / copy_gbs:5.1%} of copy)"
            )
