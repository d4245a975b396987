"""The device status word: problems only the device can see, reported without a trap or a sync.

Kernels and reference ops OR bits into `workspace.status` (int32 [1]); `check_status` reads it
once (the only host sync) and raises a clear error naming every recorded problem, then clears it.
"""

from __future__ import annotations

import torch

INVALID_EXPERT_ID = 1
CAPACITY_OVERFLOW = 2
TIMEOUT = 4
RANKS_DISAGREE = 8
INVALID_SCHEDULE = 16
OUT_OF_STEP = 32

_MESSAGES = {
    INVALID_EXPERT_ID: (
        "`top_experts` held an expert id outside [0, ep_size * num_local_experts); "
        "those routes contributed exactly zero"
    ),
    CAPACITY_OVERFLOW: (
        "a rank received more routed rows than the schedule capacity "
        "(T * k * max(2, ceil(EP * schedule_capacity_multiplier))); the extra routes "
        "contributed zero. "
        "Raise MoKConfig.schedule_capacity_multiplier (1.0 can never overflow)"
    ),
    TIMEOUT: (
        "a device-side barrier gave up waiting for another rank of the EP group "
        "(MOK_COMM_TIMEOUT_S, default 5 s): a rank crashed, is stalled, or ran a different "
        "sequence of mok ops; data exchanged after the timeout is unreliable"
    ),
    RANKS_DISAGREE: (
        "the ranks of the EP group passed different num_local_experts to build_schedule: "
        "they read each other's expert ids differently, so the step's results are invalid"
    ),
    INVALID_SCHEDULE: (
        "a schedule not made by build_schedule held rows out of range (a peer rank outside "
        "[-1, EP), a peer token index outside [0, T * k)) or counts that disagree (num_tokens "
        "not a multiple of 256 within the schedule's rows, tokens_per_expert negative, not "
        "multiples of 256 or not summing to num_tokens); those rows, or with bad counts every "
        "row, contributed exactly zero"
    ),
    OUT_OF_STEP: (
        "the ranks of the EP group reached a device barrier from different exchanges (every "
        "rank must call the same mok functions in the same order): the data they exchanged "
        "in this step is invalid"
    ),
}


class MoKDeviceError(RuntimeError):
    """Raised by `check_status` for problems recorded on the device."""


def record(status: torch.Tensor, bit: int, condition: torch.Tensor) -> None:
    """OR `bit` into `status` where the boolean tensor `condition` has any True (no sync)."""
    status.bitwise_or_(condition.any().to(torch.int32) * bit)


def word(status: torch.Tensor, num_local_experts: int) -> torch.Tensor:
    """int32 [2]: this rank's (status word, num_local_experts), what `combine` gathers."""
    experts = torch.full((1,), num_local_experts, dtype=torch.int32, device=status.device)
    return torch.cat((status, experts))


def combine(status: torch.Tensor, gathered: torch.Tensor, num_local_experts: int) -> None:
    """OR every rank's status word into `status`, and RANKS_DISAGREE if any rank's
    num_local_experts differs from this one's (`gathered`: every rank's `word`, int32 [EP, 2]);
    no sync, so that all ranks of a group reach the same verdict for a step."""
    or_words(status, gathered[:, 0])
    record(status, RANKS_DISAGREE, gathered[:, 1] != num_local_experts)


def or_words(status: torch.Tensor, words: torch.Tensor) -> None:
    """OR the status words `words` (int32 [EP], every rank's) into `status` (no sync)."""
    bits = torch.arange(31, device=status.device, dtype=torch.int32)
    present = ((words[:, None] >> bits) & 1).amax(0)
    status.bitwise_or_((present << bits).sum().to(torch.int32))


def raise_for(value: int) -> None:
    """Raise MoKDeviceError listing the problems in a status value (no-op for 0)."""
    if value == 0:
        return
    problems = [text for bit, text in _MESSAGES.items() if value & bit]
    unknown = value & ~sum(_MESSAGES)
    if unknown:
        problems.append(f"unknown status bits {unknown:#x}")
    raise MoKDeviceError("mok device status: " + "; ".join(problems))


def check(status: torch.Tensor) -> None:
    """Read the status word (one host sync), clear it, and raise for anything recorded."""
    value = int(status.item())
    status.zero_()
    raise_for(value)
