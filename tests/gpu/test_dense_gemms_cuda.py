"""The shared expert's GEMMs (mok.backends.cuda.dense_gemms.DenseGemms: cuBLAS over every token row)
against fp32 products.

One GPU, no process group. Weights come as the passes give them: [1, N, K] contiguous (the
forward's) or the transpose of a contiguous [1, K, N] (the backward's W^T, answered in fp32).
Fresh random data every run (seed printed; replay with MOK_TEST_SEED).
"""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import case_generator, module_seed, requires_gpu_module

from mok.backends.cuda.dense_gemms import DenseGemms

pytestmark = [pytest.mark.gpu, requires_gpu_module()]

# (tokens, K, N): a small shape and the DSV4-Pro-like shared expert's d_x (K = I, N = H).
CASES = [(256, 256, 128), (4096, 3072, 7168)]
IDS = [f"T{t}-K{k}-N{n}" for t, k, n in CASES]

seed = module_seed("dense GEMMs")


def _operands(gen, tokens, k, n):
    a = torch.randn((tokens, k), generator=gen, device="cuda").bfloat16()
    w_t = (torch.randn((1, k, n), generator=gen, device="cuda") / k**0.5).bfloat16()
    return a, w_t.transpose(1, 2)  # [1, N, K], the transpose of a contiguous [1, K, N]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_linear_answers_each_layout_in_its_dtype(case, seed):
    """The forward's contiguous [1, N, K] weight gives bf16 rows, the backward's transposed view
    of the same values fp32 rows (d_h stays fp32); both are the same product."""
    gen = case_generator(case, seed)
    a, w_t = _operands(gen, *case)
    w = w_t.contiguous()
    gemms = DenseGemms(case[0], torch.device("cuda"))
    forward, backward = gemms.linear(a, w), gemms.linear(a, w_t)
    assert forward.dtype == torch.bfloat16 and backward.dtype == torch.float32
    assert forward.shape == backward.shape == (case[0], case[2])
    ref = a.float() @ w[0].float().T
    tol = ref.abs().max().item()
    torch.testing.assert_close(backward, ref, rtol=1e-3, atol=1e-3 * tol)
    torch.testing.assert_close(forward.float(), ref, rtol=1e-2, atol=1e-2 * tol)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_linear_sum_adds_both_products_in_fp32(case, seed):
    """d_x = a1 @ W1^T + a2 @ W2^T in fp32: the second product adds the first in cuBLAS's
    epilogue, in place; the bits of the same addmm into a new tensor, the inputs untouched."""
    gen = case_generator(case, seed)
    (a1, w1), (a2, w2) = _operands(gen, *case), _operands(gen, *case)
    kept = [t.clone() for t in (a1, w1, a2, w2)]
    gemms = DenseGemms(case[0], torch.device("cuda"))
    got = gemms.linear_sum([(a1, w1), (a2, w2)])
    assert got.dtype == torch.float32 and got.shape == (case[0], case[2])
    first = gemms.linear(a1, w1)
    out_of_place = torch.addmm(first, a2, w2[0].T, out_dtype=torch.float32)
    assert torch.equal(got, out_of_place)
    ref = a1.float() @ w1[0].float().T + a2.float() @ w2[0].float().T
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())
    for before, after in zip(kept, (a1, w1, a2, w2), strict=True):
        assert torch.equal(before, after)
