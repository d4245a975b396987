"""One rank's workspace and schedule on the CPU, for tests that call the passes by hand."""

from __future__ import annotations

import torch

from mok import functional as F


def single_rank_step(group, *, tokens: int, hidden: int, topk: int, experts: int, seed: int):
    """(config, workspace, schedule) on the CPU, routing `tokens` tokens uniformly at random
    (from `seed`) over `experts` local experts."""
    config = F.MoKConfig()
    ws = F.create_workspace(config, group, device="cpu", num_local_tokens=tokens,
                            hidden_size=hidden, topk=topk)  # fmt: skip
    top = torch.randint(0, experts, (tokens, topk), generator=torch.Generator().manual_seed(seed))
    return config, ws, F.build_schedule(ws, config, top, num_local_experts=experts)
