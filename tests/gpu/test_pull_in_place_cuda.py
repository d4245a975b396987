"""The dispatch at EP 1 reads the caller's x, d_y and router weights in place on CUDA (the pull
kernels' `src_direct`): the bits of the same step with the copies into the workspace buffers,
which keep what they held. The reference's in-place path: tests/cpu/test_pull_in_place.py.

Run: torchrun --nproc-per-node=1 -m pytest tests/gpu/test_pull_in_place_cuda.py
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gpu_steps import CASES, GRAD_NAMES, make, step, workspace

from mok import functional as F
from mok.backends.cuda import comm as cuda_comm
from mok.backends.cuda import extension, mxfp8_pulls
from mok.backends.cuda.engine import CudaEngine
from mok.workspace import Buffer

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]

PULLED = (Buffer.X, Buffer.D_Y, Buffer.ROUTER_WEIGHT)


def _copying(self, tensors):
    """CudaEngine.use_sources as it was: every tensor copied into its buffer."""
    return {name: getattr(self.ws, name).copy_(tensor) for name, tensor in tensors.items()}


def _one_rank():
    if dist.get_world_size() > 1:
        pytest.skip("the pulls read in place at EP 1 only")


@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
@pytest.mark.parametrize("case", ["qwen3-235b-like", "dsv4-like", "empty-experts"])
def test_reading_in_place_gives_the_bits_of_the_copies(nccl_group, monkeypatch, case, mode):
    _one_rank()
    data = make(CASES[case], 1234, 0, 1)
    config, ws = workspace(nccl_group, data)
    for name in PULLED:
        getattr(ws, name).fill_(float("nan"))
    in_place, _ = step(ws, config, data, mode)
    for name in PULLED:
        assert getattr(ws, name).isnan().all(), f"{name} was written: EP 1 reads in place"
    monkeypatch.setattr(CudaEngine, "use_sources", _copying)
    copied, _ = step(ws, config, data, mode)
    assert not ws.x_buffer.isnan().any(), "the copies did run"
    for name, a, b in zip(("out", *GRAD_NAMES), in_place, copied, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(a, b), f"{name}: reading in place changed the result"


def test_an_unaligned_input_is_copied_and_gives_the_same_bits(nccl_group):
    _one_rank()
    data = make(CASES["qwen3-235b-like"], 99, 0, 1)
    config, ws = workspace(nccl_group, data)
    aligned, _ = step(ws, config, data, "bf16")
    x = data["x"]
    storage = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    shifted = storage[1:].view(x.shape)  # 2 bytes past an aligned address
    shifted.copy_(x)
    assert shifted.data_ptr() % extension.ALIGNMENT
    ws.x_buffer.fill_(float("nan"))
    got, _ = step(ws, config, {**data, "x": shifted}, "bf16")
    assert not ws.x_buffer.isnan().any(), "an unaligned x is copied into the buffer"
    for name, a, b in zip(("out", *GRAD_NAMES), got, aligned, strict=True):
        if a is not None:
            assert torch.equal(a, b), name


def _schedule(ws, config, data):
    local = data["routed"][0].shape[0]
    return F.build_schedule(ws, config, data["top"], num_local_experts=local)


def test_each_pull_reads_its_source_in_place_like_the_buffer(nccl_group):
    _one_rank()
    data = make(CASES["dsv4-like"], 7, 0, 1)
    config, ws = workspace(nccl_group, data)
    schedule = _schedule(ws, config, data)
    x, rw, grad = data["x"], data["rw"], data["grad"]
    ws.x_buffer.copy_(x)
    ws.router_weight_buffer.copy_(rw)
    ws.d_y_buffer.copy_(grad)
    used = int(schedule.num_tokens)
    assert used > 0
    for source, pull in (
        (x, lambda **s: cuda_comm.pull_rows(ws, Buffer.X, schedule, **s)),
        (rw, lambda **s: cuda_comm.pull_router_weights(ws, schedule, **s)),
    ):
        assert torch.equal(pull(source=source), pull()), "pull_rows / pull_router_weights"
    for rebased in (False, True):
        got = _used(mxfp8_pulls.pull_round(ws, Buffer.X, schedule, rebased=rebased, source=x), used)
        want = _used(mxfp8_pulls.pull_round(ws, Buffer.X, schedule, rebased=rebased), used)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(a, b), f"pull_round rebased={rebased}, output {i}"
    row_weights = cuda_comm.pull_router_weights(ws, schedule)
    got = mxfp8_pulls.pull_round_rows(ws, Buffer.D_Y, schedule, row_weights, source=grad)
    want = mxfp8_pulls.pull_round_rows(ws, Buffer.D_Y, schedule, row_weights)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a[:used], b[:used]), f"pull_round_rows output {i}"


def _used(result, used: int) -> list[torch.Tensor]:
    """pull_round's outputs on the schedule's first `used` rows (the rest are left unwritten):
    the values (and a RebasedRows' exponents), the transposed data and scale tiles."""
    values, (data_t, scale_t) = result
    rows = list(values) if isinstance(values, tuple) else [values]
    return [*(r[:used] for r in rows), data_t[:, :used], scale_t[:, : used // 128]]


def test_a_source_that_cannot_be_read_in_place_is_refused(nccl_group):
    _one_rank()
    data = make(CASES["qwen3-235b-like"], 3, 0, 1)
    config, ws = workspace(nccl_group, data)
    schedule = _schedule(ws, config, data)
    x = data["x"]
    with pytest.raises(ValueError, match="`source` must be a contiguous"):
        cuda_comm.pull_rows(ws, Buffer.X, schedule, source=x[:-1])
    with pytest.raises(TypeError, match="`source` must be torch.bfloat16"):
        cuda_comm.pull_rows(ws, Buffer.X, schedule, source=x.float())
    storage = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    with pytest.raises(ValueError, match="16-byte aligned"):
        cuda_comm.pull_rows(ws, Buffer.X, schedule, source=storage[1:].view(x.shape))
    module = extension.module_for_device(x.device)
    rows = {name: t.data_ptr() for name, t in zip(("peer_rank", "peer_token_idx", "num_tokens"),
                                                  schedule.as_tuple(), strict=False)}  # fmt: skip
    with pytest.raises(ValueError, match="`src_direct` reads the local source in place"):
        module.comm_pull_rows(src_table=0, out=x.data_ptr(), rows=0, row_bytes=x.shape[1] * 2,
                              src_rows=x.shape[0], divisor=1, ep=2, ctas=1, zero_rest=False,
                              stream=0, src_direct=x.data_ptr(), **rows)  # fmt: skip
