"""A knob changes speed, never bits (issue 46, item 3): one step of a one-GPU EP group of 2 ranks
gives the same bits, forward and backward, BF16 and MXFP8, for every value of MoKConfig's knobs
in the sweep below: the original's five (comm SMs per pass, minibatch, macrobatch, all-gather
chunk) and mok's overlap_ctas, which moves the backward's exchanges beside the shared expert.
(grouped_gemm picks another GEMM implementation, another summation order: it is held to the
reference by tolerance elsewhere, not to these bits.)
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from gpu_helpers import requires_gpu_module
from gpu_steps import GRAD_NAMES, make, step

from mok import functional as F
from mok import passes
from mok.testing import OneDeviceGroup

pytestmark = [
    pytest.mark.gpu,
    requires_gpu_module(),
    pytest.mark.skipif(int(os.environ.get("WORLD_SIZE", "1")) > 1, reason="one-GPU groups"),
]

EP = 2
# tokens, hidden, inter, local experts, topk, routing: a shared expert large enough for the
# backward's exchanges to run beside it (passes.overlaps_shared), so overlap_ctas matters.
CASE = (256, 1024, 1536, 2, 4, "uniform")
DEFAULT = F.MoKConfig(fwd_num_comm_sms=16, bwd_num_comm_sms=16, overlap_ctas=64)
SWEEP = [
    {"fwd_num_comm_sms": 2, "bwd_num_comm_sms": 2},
    {"fwd_num_comm_sms": 64, "bwd_num_comm_sms": 40},
    {"minibatch_size": 256, "macrobatch_size": 256},
    {"minibatch_size": 4096, "macrobatch_size": 131072},
    {"all_gather_top_experts_chunk_bytes": 16},
    {"overlap_ctas": 0},
    {"overlap_ctas": 1},
]


def _group_step(config, inputs, mode):
    group = OneDeviceGroup(EP, config, device="cuda", num_local_tokens=CASE[0],
                           hidden_size=CASE[1], topk=CASE[4])  # fmt: skip
    return group.run(lambda rank, ws: step(ws, config, inputs[rank], mode)[0])


@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_every_knob_value_gives_the_same_bits(mode):
    inputs = [make(CASE, 23, rank, EP) for rank in range(EP)]
    assert passes.overlaps_shared(inputs[0]["shared"], CASE[4]), "the case must overlap"
    want = _group_step(DEFAULT, inputs, mode)
    for knobs in SWEEP:
        got = _group_step(dataclasses.replace(DEFAULT, **knobs), inputs, mode)
        for rank, (a, b) in enumerate(zip(got, want, strict=True)):
            for name, x, y in zip(("out", *GRAD_NAMES), a, b, strict=True):
                same = (x is None and y is None) or torch.equal(x, y)
                assert same, f"{knobs}: rank {rank}'s {name} changed"
