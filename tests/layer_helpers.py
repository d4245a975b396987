"""One forward + backward of mok.MoELayer, shared by the CPU and GPU layer tests (top of tests/,
which is on pytest's `pythonpath`)."""

from __future__ import annotations

import torch


def layer_step(layer, call, x, top_experts, router_weights, grad) -> list[torch.Tensor]:
    """`call` (the layer, or the layer compiled) on copies of x and the router weights, then
    backward of `grad`: [output, d_x, d_router_weights, every parameter's gradient]."""
    layer.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    router_weights = router_weights.clone().requires_grad_()
    out = call(x, top_experts, router_weights)
    out.backward(grad)
    return [out.detach(), x.grad, router_weights.grad, *(p.grad for p in layer.parameters())]
