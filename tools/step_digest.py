"""SHA-256 of one step's outputs on fixed inputs, to show that two builds give the same bits.

Runs build_schedule + forward + backward through the public functional API on one GPU (EP 1; a
single-rank process group of its own), in BF16 and MXFP8, with and without the shared expert,
on inputs drawn from fixed seeds, and prints one JSON line per case with a digest of every
output and gradient. Any mok wheel with the functional API runs it, so the lines of an older and
a newer build can be compared directly (`diff`):

    python tools/step_digest.py > digests-new.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist

from mok import functional as F
from mok import ops

# (tokens, hidden, intermediate, local experts, top-k): one MXFP8-legal shape (multiples of 128).
SHAPE = (512, 1024, 512, 8, 4)


def _digest(tensor) -> str:
    if tensor is None:
        return "none"
    if isinstance(tensor, tuple):
        return "+".join(_digest(t) for t in tensor)
    data = tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def _inputs(seed: int, device: torch.device):
    tokens, hidden, inter, experts, topk = SHAPE
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).bfloat16()

    top = torch.randint(0, experts, (tokens, topk), generator=gen, device=device)
    weights = torch.rand(tokens, topk, generator=gen, device=device)
    routed = (randn(experts, inter, hidden, scale=hidden**-0.5),
              randn(experts, inter, hidden, scale=hidden**-0.5),
              randn(experts, hidden, inter, scale=inter**-0.5))  # fmt: skip
    shared = (randn(inter, hidden, scale=hidden**-0.5), randn(inter, hidden, scale=hidden**-0.5),
              randn(hidden, inter, scale=inter**-0.5))  # fmt: skip
    return randn(tokens, hidden), top, weights, routed, shared, randn(tokens, hidden)


def _step(ws, config, seed: int, mxfp8: bool, with_shared: bool) -> dict:
    x, top, rw, routed, shared, grad = _inputs(seed, ws.device)
    shared = shared if with_shared else (None, None, None)
    if mxfp8:
        quantized = [ops.mxfp8_quantize(w, True, True) for w in routed]
        forward_weights = [q[:2] for q in quantized]
        backward_weights = [quantized[0], quantized[1], quantized[2][2:]]
    else:
        forward_weights = backward_weights = list(routed)
    schedule = F.build_schedule(ws, config, top, num_local_experts=SHAPE[3])
    out, ctx = F.forward(config, ws, schedule, x, rw, *shared, *forward_weights)
    grads = F.backward(config, ws, schedule, ctx, grad, x, rw, *shared, *backward_weights)
    F.check_status(ws)
    names = ("d_x", "d_router_weights", "d_routed_gate", "d_routed_up", "d_routed_down",
             "d_shared_gate", "d_shared_up", "d_shared_down")  # fmt: skip
    return {"out": _digest(out)} | {n: _digest(g) for n, g in zip(names, grads, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2, help="input draws per case")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    config = F.MoKConfig()
    tokens, hidden, _, _, topk = SHAPE
    ws = F.create_workspace(config, None, device=device, num_local_tokens=tokens,
                            hidden_size=hidden, topk=topk)  # fmt: skip
    for mxfp8 in (False, True):
        for with_shared in (True, False):
            for seed in range(args.seeds):
                case = {"mxfp8": mxfp8, "shared": with_shared, "seed": seed}
                print(json.dumps(case | _step(ws, config, seed, mxfp8, with_shared)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
