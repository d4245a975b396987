"""Helpers of every GPU test module (tests/gpu/): the one reason a test that needs the GPU skips,
and kernel timing. It sits at the top of tests/ because that directory is on pytest's `pythonpath`
(pyproject.toml), so it imports by name under --import-mode=importlib (a conftest.py does not).
"""

from __future__ import annotations

import os
import secrets
import statistics

import pytest
import torch


def gpu_skip_reason() -> str | None:
    """Why the CUDA backend cannot run here (no GPU, or no mok module for its arch), or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (none visible)"
    from mok.backends.cuda import extension

    try:
        extension.module_for_device(torch.device("cuda", 0))
    except NotImplementedError as error:
        return str(error)
    return None


def requires_gpu_module() -> pytest.MarkDecorator:
    """A skipif mark that skips with gpu_skip_reason() (decided once, when the module loads)."""
    reason = gpu_skip_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def skip_without_gpu_module() -> None:
    """pytest.skip with gpu_skip_reason(), for fixtures; returns when the GPU can run mok."""
    reason = gpu_skip_reason()
    if reason is not None:
        pytest.skip(reason)


def skip_without_grouped_gemms() -> None:
    """pytest.skip unless GPU 0's mok module carries the grouped GEMMs (built for sm_90a)."""
    from mok.backends.cuda import grouped_gemm

    if not grouped_gemm.available(torch.device("cuda", 0)):
        pytest.skip("this GPU's mok module has no grouped GEMMs (they are built for sm_90a)")


def case_generator(case, seed: int) -> torch.Generator:
    """A CUDA generator for one test case: the module's seed plus a salt from the case."""
    return torch.Generator(device="cuda").manual_seed(seed + hash(str(case)) % 100_000)


def spread_mxfp8_weight(gen: torch.Generator, experts: int, n: int, k: int, spread: int):
    """(data, scales) of an MXFP8 weight [E, N, K] quantized by mok's kernel from random bf16
    whose rows' magnitudes span 2^-spread .. 2^min(spread, 118) (bf16 stays finite), so blocks
    get scale bytes from 0 to ~245 and, past spread 126, dequantized values that are bf16
    subnormals."""
    from mok.backends.cuda import mxfp8

    values = torch.randn((experts, n, k), generator=gen, device="cuda")
    high = min(spread, 118) + 1
    exponents = torch.randint(-spread, high, (experts, n, 1), generator=gen, device="cuda")
    data, scales, _, _ = mxfp8.mxfp8_quantize((values * 2.0**exponents).bfloat16(), True, False)
    return data, scales


def segment_sizes(rows) -> torch.Tensor:
    """The grouped GEMMs' `rows` argument (int32 [E] on the GPU) for a list of segment sizes."""
    return torch.tensor(rows, dtype=torch.int32, device="cuda")


def poison_next_allocation(shape, dtype: torch.dtype, count: int = 1) -> None:
    """Leaves `count` NaN-filled blocks of this size in the CUDA caching allocator's pool, so
    that the next allocations of that size on the current stream (a kernel's outputs) start as
    NaN rather than as whatever fresh memory holds (often zeros, which would hide unwritten
    rows). The blocks are held together until all are filled, so they are distinct."""
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device="cuda") for _ in range(count)]
    del blocks


def poison_cached_memory(value: float, large_gib: int = 4, small_blocks: int = 3000) -> None:
    """Fills the CUDA caching allocator's pools with `value`: `large_gib` 1 GiB blocks (split
    for allocations above 1 MiB) and `small_blocks` 512 KiB ones (the small pool), filled and
    freed, so the next allocations of any size start as `value` instead of as what the previous
    run left there. A kernel that reads memory no kernel of its run wrote then gives other
    results, which a run repeated on the same allocations hides."""
    torch.cuda.empty_cache()
    large = [torch.full((1 << 28,), value, device="cuda") for _ in range(large_gib)]
    small = [torch.full((1 << 17,), value, device="cuda") for _ in range(small_blocks)]
    del large, small


def module_seed(label: str):
    """A module-scoped `seed` fixture for one-GPU test modules: MOK_TEST_SEED when set, else a
    fresh random seed, printed as "<label> test seed: ..." so a failure can be replayed."""

    @pytest.fixture(scope="module")
    def seed() -> int:
        value = int(os.environ.get("MOK_TEST_SEED") or secrets.randbits(31))
        print(f"\n{label} test seed: MOK_TEST_SEED={value}")
        return value

    return seed


def median_ms(run, before=None, iterations: int = 10) -> float:
    """Median time of `run()` on the current stream, after one untimed warm-up call; `before()`
    (e.g. a barrier that lines the ranks up) runs before each timed call, outside the timed
    region."""
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def gb_per_s(nbytes: int, run, before=None, iterations: int = 10) -> float:
    """GB/s of `run()` moving `nbytes`, from median_ms."""
    return nbytes / median_ms(run, before, iterations) / 1e6


def device_copy_gb_per_s(nbytes: int, iterations: int = 10) -> float:
    """GB/s (read + write) of a torch copy of `nbytes` bytes on the device: the yardstick that the
    bandwidth tests print next to their kernels."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return gb_per_s(2 * nbytes, lambda: dst.copy_(src), iterations=iterations)
