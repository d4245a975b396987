"""The expert elementwise kernels (mok.backends.cuda.elementwise) against the reference's PyTorch
forms (mok.experts.ExpertEngine) on the same GPU tensors.

Rows past `num_tokens` must be zeros; gate and up span the SwiGLU clamp (values beyond +-L,
exact zeros) and router weights take both signs. Fresh data every run (seed printed; replay
with MOK_TEST_SEED).
"""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import module_seed, requires_gpu_module

from mok import mxfp8 as format_reference
from mok.backends.cuda import elementwise as cuda_experts
from mok.backends.cuda import extension, mxfp8
from mok.experts import ExpertEngine

pytestmark = [pytest.mark.gpu, requires_gpu_module()]

# (rows, used rows, inter, limit); 261 rows: an odd count, no multiple of a 128-row tile.
CASES = [
    (256, 256, 128, None), (768, 300, 1536, 7.0), (512, 0, 256, 1.0), (1024, 1000, 3072, None),
    (261, 200, 1024, 7.0),
]  # fmt: skip
IDS = [f"R{r}-used{u}-I{i}-L{lim}" for r, u, i, lim in CASES]


seed = module_seed("expert kernels")


def _data(case, seed):
    rows, used, inter, _ = case
    gen = torch.Generator(device="cuda").manual_seed(seed + hash(case) % 100_000)

    def rand(*shape, scale=4.0):
        t = torch.randn(shape, generator=gen, device="cuda") * scale
        return torch.where(torch.rand(shape, generator=gen, device="cuda") < 0.02, 0.0, t)

    gate, up = rand(rows, inter).bfloat16(), rand(rows, inter).bfloat16()
    num_tokens = torch.tensor([used], dtype=torch.int32, device="cuda")
    return gen, rand, gate, up, num_tokens


def _close(got, ref, used):
    torch.testing.assert_close(got[:used].float(), ref[:used].float(), rtol=2**-7, atol=1e-6)
    assert (got[used:] == 0).all(), "rows past num_tokens must be zero"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_swiglu_forward(case, seed):
    _, _, gate, up, num_tokens = _data(case, seed)
    hidden = cuda_experts.swiglu(gate, up, num_tokens, case[3])
    _close(hidden, ExpertEngine.swiglu(gate, up, case[3]), case[1])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_swiglu_backward_and_router_weight_grad(case, seed):
    rows, used, inter, limit = case
    _, rand, gate, up, num_tokens = _data(case, seed)
    hidden = ExpertEngine.swiglu(gate, up, limit)
    d_h, rw = rand(rows, inter, scale=1.0), rand(rows, scale=1.0)
    got = cuda_experts.swiglu_backward(d_h, rw, gate, up, hidden, num_tokens, limit)
    ref = ExpertEngine.swiglu_backward(d_h, rw, gate, up, hidden, limit)
    d_rw, ref_rw = got[0], ref[0]
    scale = (d_h.abs() * hidden.float().abs()).sum(-1)
    assert ((d_rw[:used] - ref_rw[:used]).abs() <= 1e-5 * scale[:used] + 1e-6).all()
    assert (d_rw[used:] == 0).all()
    for g, r in zip(got[1:], ref[1:], strict=True):
        _close(g, r, used)
    again = cuda_experts.swiglu_backward(d_h, rw, gate, up, hidden, num_tokens, limit)
    assert all(torch.equal(a, b) for a, b in zip(got, again, strict=True)), "not reproducible"
    # scale_hidden: the same outputs and, written in the same pass, scale_rows of hidden.
    *same, scaled = cuda_experts.swiglu_backward(d_h, rw, gate, up, hidden, num_tokens, limit,
                                                 scale_hidden=True)  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(got, same, strict=True)), "scale_hidden changed"
    assert torch.equal(scaled, cuda_experts.scale_rows(hidden, rw, num_tokens)), "scaled hidden"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_swiglu_backward_without_d_hidden_keeps_every_other_bit(case, seed):
    """hidden_grad=False (the functional backward): d_hidden is None and every other output,
    the router weight gradient and the scaled hidden rows included, has the full pass's bits."""
    rows, used, inter, limit = case
    _, rand, gate, up, num_tokens = _data(case, seed)
    hidden = cuda_experts.swiglu(gate, up, num_tokens, limit)
    d_h, rw = rand(rows, inter, scale=1.0), rand(rows, scale=1.0)
    options = {"scale_hidden": True, "zero_rest": False}
    full = cuda_experts.swiglu_backward(d_h, rw, gate, up, hidden, num_tokens, limit, **options)
    lean = cuda_experts.swiglu_backward(d_h, rw, gate, up, hidden, num_tokens, limit, **options,
                                        hidden_grad=False)  # fmt: skip
    assert lean[3] is None
    names = ("d_router_weight", "d_gate", "d_up", "scaled_hidden")
    for name, want, got in zip(names, full[:3] + full[4:], lean[:3] + lean[4:], strict=True):
        assert torch.equal(got[:used].view(torch.uint8), want[:used].view(torch.uint8)), name


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_scale_rows(case, seed):
    rows, used, inter, _ = case
    _, rand, _, _, num_tokens = _data(case, seed)
    x, w = rand(rows, inter).bfloat16(), rand(rows, scale=1.0)
    _close(cuda_experts.scale_rows(x, w, num_tokens), ExpertEngine.scale_rows(x, w), used)


@pytest.mark.parametrize("case", CASES[:4], ids=IDS[:4])  # rows in MXFP8's 128-row tiles
def test_swiglu_mxfp8_is_the_unfused_steps_bit_for_bit(case, seed):
    """The fused SwiGLU + MXFP8 pass writes exactly what the SwiGLU kernel, the rounding of
    hidden (with its transposed pair) and the quantization of gate and up write; with a limit,
    gate and up keep their side of it (mok.mxfp8.keep_limit_side, issue 48 cause 2)."""
    limit = case[3]
    _, _, gate, up, num_tokens = _data(case, seed)
    hidden_q, hidden_t, gate_q, up_q = cuda_experts.swiglu_mxfp8(gate, up, num_tokens, limit)
    hidden = cuda_experts.swiglu(gate, up, num_tokens, limit)
    want_q, want_t = mxfp8.mxfp8_round(hidden, transposed=True)
    want_gate, want_up = mxfp8.mxfp8_quantize(gate)[:2], mxfp8.mxfp8_quantize(up)[:2]
    if limit is not None:
        nearest = want_gate[0].clone(), want_up[0].clone()
        want_gate = format_reference.keep_limit_side(want_gate, gate, limit, both_signs=False)
        want_up = format_reference.keep_limit_side(want_up, up, limit, both_signs=True)
        moved = sum(int((a.view(torch.uint8) != b[0].view(torch.uint8)).sum())
                    for a, b in zip(nearest, (want_gate, want_up), strict=True))  # fmt: skip
        assert moved > 0, "the data must carry some element across the limit"
    want = [want_q, *want_t, *want_gate, *want_up]
    got = [hidden_q, *hidden_t, *gate_q, *up_q]
    names = ["hidden", "hidden_t", "hidden_scale_t", "gate_q", "gate_scale", "up_q", "up_scale"]
    for name, g, w in zip(names, got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), f"{name} differs"


@pytest.mark.parametrize("case", CASES[:4], ids=IDS[:4])  # rows in MXFP8's 128-row tiles
def test_swiglu_backward_of_mxfp8_gate_and_up_is_that_of_their_values_bit_for_bit(case, seed):
    """MXFP8 gate and up (the forward's saved pairs, NaN and all-zero blocks among them) read
    as stored give every output the backward gives on their mxfp8_dequantize values."""
    rows, used, inter, limit = case
    _, rand, gate, up, num_tokens = _data(case, seed)
    gate[:, :32] = float("nan")  # a block of NaN values, and one of zeros, in every row
    up[:, 32:64] = 0.0
    pairs = [mxfp8.mxfp8_quantize(t)[:2] for t in (gate, up)]
    values = [mxfp8.mxfp8_dequantize(*pair) for pair in pairs]
    hidden = cuda_experts.swiglu(*values, num_tokens, limit)
    d_h, rw = rand(rows, inter, scale=1.0), rand(rows, scale=1.0)
    got = cuda_experts.swiglu_backward(d_h, rw, *pairs, hidden, num_tokens, limit)
    want = cuda_experts.swiglu_backward(d_h, rw, *values, hidden, num_tokens, limit)
    names = ("d_router_weight", "d_gate", "d_up", "d_hidden")
    for name, g, w in zip(names, got, want, strict=True):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), f"{name} differs"
    with pytest.raises(TypeError, match="both be tensors or both MXFP8"):
        cuda_experts.swiglu_backward(d_h, rw, pairs[0], values[1], hidden, num_tokens, limit)
    with pytest.raises(ValueError, match=r"`up\[1\] \(scales\)` must be uint8"):
        bad = (pairs[1][0], pairs[1][1][:1])  # one row of tiles too few
        cuda_experts.swiglu_backward(d_h, rw, pairs[0], bad, hidden, num_tokens, limit)


@pytest.mark.parametrize("case", CASES[1:2] + CASES[3:], ids=IDS[1:2] + IDS[3:])
def test_rows_past_num_tokens_stay_untouched_without_zero_rest(case, seed):
    """zero_rest=False (the routed buffers): the SwiGLU kernels write rows < num_tokens as with
    zero_rest and leave the rest of every output as it was (d_router_weight gets zeros)."""
    rows, used, inter, limit = case
    _, rand, gate, up, num_tokens = _data(case, seed)
    d_h, rw = rand(rows, inter, scale=1.0), rand(rows, scale=1.0)
    hidden = cuda_experts.swiglu(gate, up, num_tokens, limit)
    full = cuda_experts.swiglu_backward(d_h, rw, gate, up, hidden, num_tokens, limit,
                                        scale_hidden=True)  # fmt: skip
    module = extension.module_for_device(gate.device)
    stream = torch.cuda.current_stream().cuda_stream
    poison = float("nan")
    kept_hidden = torch.full_like(gate, poison)
    module.swiglu(gate.data_ptr(), up.data_ptr(), kept_hidden.data_ptr(), num_tokens.data_ptr(),
                  rows, inter, limit is not None, limit or 0.0, False, stream)  # fmt: skip
    outs = [torch.full_like(t, poison) for t in full]
    module.swiglu_backward(d_h.data_ptr(), rw.data_ptr(), gate.data_ptr(), up.data_ptr(),
                           hidden.data_ptr(), *(t.data_ptr() for t in outs[1:4]),
                           outs[0].data_ptr(), num_tokens.data_ptr(), rows, inter,
                           limit is not None, limit or 0.0, False, stream,
                           scaled_hidden=outs[4].data_ptr())  # fmt: skip
    assert torch.equal(kept_hidden[:used], hidden[:used]) and kept_hidden[used:].isnan().all()
    assert torch.equal(outs[0], full[0]), "d_router_weight"
    names = ("d_gate", "d_up", "d_hidden", "scaled_hidden")
    for name, got, want in zip(names, outs[1:], full[1:], strict=True):
        assert torch.equal(got[:used], want[:used]), name
        assert got[used:].isnan().all(), f"{name}: rows past num_tokens were written"


def test_bad_width_raises():
    t = torch.zeros(256, 12, dtype=torch.bfloat16, device="cuda")
    num_tokens = torch.tensor([256], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="`inter` must be a positive multiple of 8"):
        cuda_experts.swiglu(t, t, num_tokens, None)
