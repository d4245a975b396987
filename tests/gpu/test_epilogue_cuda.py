"""The CUDA combine epilogues (mok.backends.cuda.epilogue.fwd_epilogue / bwd_epilogue) against the
arithmetic of mok.ops.fwd_epilogue / bwd_epilogue, bit for bit. One GPU, no process group.

The oracle runs the reference's PyTorch loop on the CPU (so no GPU arithmetic mode can touch it)
and on the GPU; the kernel must equal both. Data has a wide range per row, exact zeros, rows of
-0.0 (the sum starts at +0.0, as torch.zeros does) and weights of both signs and zero; fresh
every run (seed printed; replay with MOK_TEST_SEED).
"""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import device_copy_gb_per_s, gb_per_s, module_seed, requires_gpu_module

from mok import ops
from mok.backends.cuda import epilogue as cuda_epilogue

pytestmark = pytest.mark.gpu


requires_module = requires_gpu_module()

# (T, H, k, with a shared expert)
CASES = [
    (1, 128, 1, False),
    (1, 128, 1, True),
    (3, 128, 255, False),
    (200, 1024, 2, True),
    (64, 4096, 8, True),
    (513, 7168, 6, False),
    (513, 7168, 6, True),
]
CASE_IDS = [f"T{t}-H{h}-k{k}-{'shared' if s else 'noshared'}" for t, h, k, s in CASES]


seed = module_seed("epilogue")


def _inputs(case, seed: int):
    tokens, hidden, topk, with_shared = case
    gen = torch.Generator(device="cuda").manual_seed(seed + hash(case) % 1000)

    def wide(shape):
        x = torch.randn(shape, generator=gen, device="cuda")
        scale = torch.randint(-12, 12, (shape[0], 1), generator=gen, device="cuda")
        x = x * torch.exp2(scale.float())
        return torch.where(torch.rand(shape, generator=gen, device="cuda") < 0.02, 0.0, x)

    combine = wide((tokens * topk, hidden)).to(torch.bfloat16)
    negative_zero_rows = torch.rand(tokens * topk, generator=gen, device="cuda") < 0.05
    combine[negative_zero_rows] = -0.0
    weights = torch.randn((tokens, topk), generator=gen, device="cuda")
    weights = torch.where(
        torch.rand(weights.shape, generator=gen, device="cuda") < 0.1, 0.0, weights
    )
    shared = wide((tokens, hidden)).to(torch.bfloat16) if with_shared else None
    return shared, combine, weights


def _oracle(shared, routed, weights, topk: int) -> torch.Tensor:
    """mok.ops' epilogue loop on whatever device the inputs are on (weights None: unweighted)."""
    rows = routed.float().reshape(-1, topk, routed.shape[1])
    total = torch.zeros_like(rows[:, 0]) if shared is None else shared.float()
    for slot in range(topk):
        term = rows[:, slot] if weights is None else weights[:, slot, None] * rows[:, slot]
        total = total + term
    return total.to(torch.bfloat16)


def _assert_bits(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, f"{name}: {got.shape} {want.shape}"
    got, want = got.cpu(), want.cpu()
    bad = (got.view(torch.int16) != want.view(torch.int16)).nonzero()
    if bad.numel():
        first = tuple(bad[0].tolist())
        pytest.fail(
            f"{name}: {bad.shape[0]} of {got.numel()} elements differ, first at {list(first)}: "
            f"kernel {got[first].item()!r}, reference {want[first].item()!r}"
        )


def _cpu(t):
    return None if t is None else t.cpu()


@requires_module
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fwd_epilogue_matches_reference_bits(case, seed):
    shared, combine, weights = _inputs(case, seed)
    got = cuda_epilogue.fwd_epilogue(shared, combine, weights)
    topk = case[2]
    _assert_bits("vs CPU oracle", got, _oracle(_cpu(shared), combine.cpu(), weights.cpu(), topk))
    _assert_bits("vs GPU oracle", got, _oracle(shared, combine, weights, topk))
    _assert_bits("vs mok.ops.fwd_epilogue", got, ops.fwd_epilogue(shared, combine, weights))
    _assert_bits("second call", cuda_epilogue.fwd_epilogue(shared, combine, weights), got)


@requires_module
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_bwd_epilogue_matches_reference_bits(case, seed):
    shared, routed, _ = _inputs(case, seed)
    topk = case[2]
    got = cuda_epilogue.bwd_epilogue(shared, routed, topk)
    _assert_bits("vs CPU oracle", got, _oracle(_cpu(shared), routed.cpu(), None, topk))
    _assert_bits("vs GPU oracle", got, _oracle(shared, routed, None, topk))
    _assert_bits("vs mok.ops.bwd_epilogue", got, ops.bwd_epilogue(shared, routed, topk))


@requires_module
def test_misaligned_and_strided_inputs(seed):
    shared, combine, weights = _inputs((64, 1024, 4, True), seed)
    flat = torch.empty(combine.numel() + 1, dtype=torch.bfloat16, device="cuda")
    shifted = flat[1:].view(combine.shape)  # starts 2 bytes into an allocation
    shifted.copy_(combine)
    strided_weights = weights.t().contiguous().t()  # same values, column-major
    got = cuda_epilogue.fwd_epilogue(shared, shifted, strided_weights)
    _assert_bits("misaligned/strided", got, _oracle(shared, combine, weights, 4))


@requires_module
def test_bandwidth(seed, capsys):
    tokens, hidden, topk = 8192, 7168, 6
    shared, combine, weights = _inputs((tokens, hidden, 1, True), seed)
    combine = combine.repeat(topk, 1)
    moved = (combine.numel() + 2 * shared.numel()) * 2
    copy = device_copy_gb_per_s(moved // 2)
    weights = weights.repeat(1, topk)
    fwd = gb_per_s(moved, lambda: cuda_epilogue.fwd_epilogue(shared, combine, weights))
    with capsys.disabled():
        print(f"\nfwd epilogue T={tokens} H={hidden} k={topk} on {torch.cuda.get_device_name()}:")
        print(f"  device copy (read + write): {copy:7.0f} GB/s")
        print(f"  fwd_epilogue:               {fwd:7.0f} GB/s ({fwd / copy:.0%} of copy)")
