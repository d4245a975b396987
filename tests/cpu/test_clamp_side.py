"""MXFP8 with a SwiGLU limit: the backward's clamp decision is the forward's (issue 48, cause 2).

The backward reads where the clamp was active (gate > L, |up| > L) from the forward's saved
MXFP8 gate and up. Rounding to nearest can carry a value just above L onto it (or one just below
across it), so the saved pair keeps every element on its value's side (mxfp8.keep_limit_side).
"""

from __future__ import annotations

import pytest
import torch

from mok import functional as F
from mok import mxfp8

LIMIT = 7.0
# 7.09375 = 7 + 3/32 is a bf16 value; in a block whose largest element it is, the scale is 2^-5
# and E4M3's grid there is spaced 0.5, so rounding to nearest stores 7.0 = L: clamped in the
# forward, not clamped as read back.
ABOVE = 7.09375


def _near_limit(seed: int) -> torch.Tensor:
    """bf16 [128, 128]: values within a few E4M3 steps of ±L, in blocks of varied scales."""
    gen = torch.Generator().manual_seed(seed)
    near = LIMIT * (1 + (torch.rand(128, 128, generator=gen) - 0.5) * 0.3)
    sign = torch.where(torch.rand(128, 128, generator=gen) < 0.3, -1.0, 1.0)
    block_max = 2.0 ** torch.randint(3, 9, (128, 4, 1), generator=gen).float()
    block_max = block_max.expand(128, 4, 32).reshape(128, 128)
    x = torch.where(torch.rand(128, 128, generator=gen) < 0.1, block_max, sign * near)
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("both_signs", [False, True], ids=["gate", "up"])
@pytest.mark.parametrize("seed", range(4))
def test_saved_values_keep_their_side_of_the_limit(seed, both_signs):
    x = _near_limit(seed)
    nearest = mxfp8.quantize(x)[:2]
    kept = mxfp8.keep_limit_side(nearest, x, LIMIT, both_signs)
    value, stored = x.float(), mxfp8.dequantize(*kept)
    if both_signs:
        value, stored = value.abs(), stored.abs()
    assert torch.equal(stored > LIMIT, value > LIMIT)
    assert torch.equal(kept[1], nearest[1]), "the block scales must not change"
    step = kept[0].view(torch.uint8).int() - nearest[0].view(torch.uint8).int()
    moved = step != 0
    assert moved.any(), "the data must exercise a crossing"
    assert step.abs().max() == 1, "a moved element takes the neighbouring code"
    crossed = (mxfp8.dequantize(*nearest).abs() > LIMIT) != (x.float().abs() > LIMIT)
    if not both_signs:
        crossed = (mxfp8.dequantize(*nearest) > LIMIT) != (x.float() > LIMIT)
    assert torch.equal(moved, crossed), "only elements whose rounding crossed the limit move"


def test_non_finite_values_keep_their_codes():
    x = torch.zeros(128, 128, dtype=torch.bfloat16)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), ABOVE])
    x[1, :2] = torch.tensor([float("nan"), ABOVE])
    nearest = mxfp8.quantize(x)[:2]
    for both_signs in (False, True):
        kept = mxfp8.keep_limit_side(nearest, x, LIMIT, both_signs)
        assert torch.equal(kept[0][0, :3].view(torch.uint8), nearest[0][0, :3].view(torch.uint8))
        assert mxfp8.dequantize(*kept)[1, 1] > LIMIT


def _one_token_step(group, mode_limit: float | None):
    """One token through one expert at EP 1 (MXFP8, no shared expert): gate 0 and up 1 and 2
    land just beyond ±L, every other gate and up is small. Returns the weight gradients."""
    hidden = inter = 128
    config = F.MoKConfig()
    ws = F.create_workspace(config, group, device="cpu", num_local_tokens=1, hidden_size=hidden,
                            topk=1)  # fmt: skip
    schedule = F.build_schedule(ws, config, torch.zeros(1, 1, dtype=torch.int64),
                                num_local_experts=1)  # fmt: skip
    x = torch.zeros(1, hidden)
    x[0, :2] = 1.0
    gate_w, up_w = torch.zeros(1, inter, hidden), torch.zeros(1, inter, hidden)
    gate_w[0, :, 0] = 0.5
    up_w[0, :, 0] = 0.5
    gate_w[0, 0, :2] = torch.tensor([LIMIT, ABOVE - LIMIT])  # gate[0] = ABOVE
    up_w[0, 1, :2] = torch.tensor([LIMIT, ABOVE - LIMIT])  # up[1] = ABOVE
    up_w[0, 2, :2] = -torch.tensor([LIMIT, ABOVE - LIMIT])  # up[2] = -ABOVE
    down_w = torch.full((1, hidden, inter), 0.25)
    weights = [mxfp8.quantize(w.bfloat16(), True, True) for w in (gate_w, up_w, down_w)]
    forward_forms = [w[:2] for w in weights]
    backward_forms = (weights[0], weights[1], weights[2][2:])
    x, rw = x.bfloat16(), torch.ones(1, 1)
    _, ctx = F.forward(config, ws, schedule, x, rw, None, None, None, *forward_forms,
                       swiglu_limit=mode_limit)  # fmt: skip
    grads = F.backward(config, ws, schedule, ctx, torch.ones(1, hidden, dtype=torch.bfloat16),
                       x, rw, None, None, None, *backward_forms,
                       swiglu_limit=mode_limit)  # fmt: skip
    return grads[2][0].float(), grads[3][0].float()


def test_clamped_elements_get_no_gradient(single_rank_group):
    """The forward clamps gate 0 and up 1 and 2: their weight-gradient rows are exactly zero
    (before the fix the saved 7.0 let gradient through: 0.5 per element of these rows)."""
    d_gate_w, d_up_w = _one_token_step(single_rank_group, LIMIT)
    assert torch.equal(d_gate_w[0], torch.zeros_like(d_gate_w[0]))
    assert torch.equal(d_up_w[1:3], torch.zeros_like(d_up_w[1:3]))
    assert d_gate_w[1:].abs().sum() > 0 and d_up_w[3:].abs().sum() > 0, "the rest gets gradient"
    # Without a limit the same rows get gradient.
    free_gate, free_up = _one_token_step(single_rank_group, None)
    assert free_gate[0].abs().sum() > 0 and free_up[1:3].abs().sum() > 0


@pytest.mark.parametrize("both_signs", [False, True], ids=["gate", "up"])
def test_the_oracle_keeps_the_same_side(both_signs):
    """The float64 oracle's independent form (moe_oracle.mx_saved: E4M3's value table) gives
    the values keep_limit_side stores."""
    from moe_oracle import mx_saved

    x = _near_limit(7)
    kept = mxfp8.keep_limit_side(mxfp8.quantize(x)[:2], x, LIMIT, both_signs)
    assert torch.equal(mx_saved(x.double(), LIMIT, both_signs), mxfp8.dequantize(*kept).double())
