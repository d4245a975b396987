"""Autograd and nn.Module wrappers over mok.functional (BF16, or MXFP8 on the fly).

`MoEFunction.apply` makes the fused forward/backward one autograd node; `MoELayer` owns this
rank's expert weights and calls it. Routing stays the caller's (`top_experts`, `router_weights`
come in), as in the functional API.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from mok import functional as F
from mok import ops
from mok._arguments import check_multiple, check_range, check_tensor, check_type, describe
from mok._moe_arguments import check_limit
from mok.workspace import MAX_TOPK, as_device


class MoEFunction(torch.autograd.Function):
    """out = mok.functional.forward(...), with mok.functional.backward as its gradient.

    apply(config, workspace, schedule, swiglu_limit, mxfp8, x, router_weights, shared_gate,
    shared_up, shared_down, routed_gate, routed_up, routed_down); the shared weights may be None.
    In MXFP8 mode the bf16 routed weights are quantized on every call and receive the gradient
    of their quantized values (straight through).
    """

    @staticmethod
    def forward(ctx, config, workspace, schedule, swiglu_limit, mxfp8, x, router_weights, *weights):
        shared, routed = weights[:3], weights[3:]
        forms = [ops.mxfp8_quantize(w, True, True) for w in routed] if mxfp8 else None
        fwd_routed = [tuple(f[:2]) for f in forms] if mxfp8 else routed
        out, saved = F.forward(
            config, workspace, schedule, x, router_weights, *shared, *fwd_routed, swiglu_limit
        )
        ctx.args = (config, workspace, schedule, saved, swiglu_limit)
        ctx.bwd_routed = [tuple(forms[0]), tuple(forms[1]), tuple(forms[2][2:])] if mxfp8 else None
        ctx.save_for_backward(x, router_weights, *(w for w in weights if w is not None))
        ctx.has_shared = shared[0] is not None
        return out

    @staticmethod
    def backward(ctx, grad_output):
        config, workspace, schedule, saved, swiglu_limit = ctx.args
        x, router_weights, *weights = ctx.saved_tensors
        shared = tuple(weights[:3]) if ctx.has_shared else (None, None, None)
        routed = ctx.bwd_routed or weights[-3:]
        d_x, d_rw, d_gate, d_up, d_down, d_sgate, d_sup, d_sdown = F.backward(
            config,
            workspace,
            schedule,
            saved,
            grad_output.contiguous(),
            x,
            router_weights,
            *shared,
            *routed,
            swiglu_limit,
        )
        # No gradients for config, workspace, schedule, swiglu_limit, mxfp8.
        return (None,) * 5 + (d_x, d_rw, d_sgate, d_sup, d_sdown, d_gate, d_up, d_down)


class MoELayer(nn.Module):
    """This rank's share of an expert-parallel MoE layer: SwiGLU experts (+ optional shared one).

    | argument          | meaning                                                          |
    |-------------------|------------------------------------------------------------------|
    | hidden_size       | H, a multiple of 128                                             |
    | intermediate_size | I, a multiple of 128 (routed and shared experts)                 |
    | num_experts       | experts over the whole EP group, a multiple of its size          |
    | topk              | routes per token                                                 |
    | group             | the EP process group (default: the world)                        |
    | shared_expert     | add a shared expert (default True)                               |
    | swiglu_limit      | optional SwiGLU clamp L                                          |
    | mxfp8             | quantize the routed weights to MXFP8 on every call               |
    | config            | MoKConfig (default MoKConfig())                                  |

    forward(x bf16 [T, H], top_experts int64 [T, k], router_weights float [T, k]) -> bf16 [T, H].
    Unlike the functional API it takes views of any strides (copied when not contiguous) and
    router weights of any float dtype (used in fp32; their gradient comes back in theirs).
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        topk: int,
        *,
        group: dist.ProcessGroup | None = None,
        shared_expert: bool = True,
        swiglu_limit: float | None = None,
        mxfp8: bool = False,
        config: F.MoKConfig | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        # The sizes every call would check, checked once here, before any weight is allocated.
        check_multiple("hidden_size", hidden_size, 128)
        check_multiple("intermediate_size", intermediate_size, 128)
        check_range("topk", topk, 1, MAX_TOPK)
        check_limit(swiglu_limit)
        for name, value in (("shared_expert", shared_expert), ("mxfp8", mxfp8)):
            check_type(name, value, bool)
        if group is not None:
            check_type("group", group, dist.ProcessGroup)
        if config is not None:
            check_type("config", config, F.MoKConfig)
        device = None if device is None else as_device(device)
        ep_size = dist.get_world_size(group) if dist.is_initialized() else 1
        if isinstance(num_experts, bool) or not isinstance(num_experts, int):
            raise TypeError(f"`num_experts` must be an int, got {describe(num_experts)}")
        if num_experts < ep_size or num_experts % ep_size:
            raise ValueError(
                f"`num_experts` must be a positive multiple of the EP group size "
                f"({ep_size}), got {num_experts}"
            )
        self.group, self.topk, self.swiglu_limit, self.mxfp8 = group, topk, swiglu_limit, mxfp8
        self.config = config or F.MoKConfig()
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_experts, self.num_local_experts = num_experts, num_experts // ep_size
        shape_in = (self.num_local_experts, intermediate_size, hidden_size)
        shape_out = (self.num_local_experts, hidden_size, intermediate_size)
        self.routed_gate = _weight(shape_in, device)
        self.routed_up = _weight(shape_in, device)
        self.routed_down = _weight(shape_out, device)
        shared = shared_expert
        self.shared_gate = _weight(shape_in[1:], device) if shared else None
        self.shared_up = _weight(shape_in[1:], device) if shared else None
        self.shared_down = _weight(shape_out[1:], device) if shared else None

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
            f"num_experts={self.num_experts}, num_local_experts={self.num_local_experts}, "
            f"topk={self.topk}, shared_expert={self.shared_gate is not None}, "
            f"swiglu_limit={self.swiglu_limit}, mxfp8={self.mxfp8}"
        )

    def forward(self, x: torch.Tensor, top_experts: torch.Tensor, router_weights: torch.Tensor):
        check_tensor("x", x, dtype=torch.bfloat16, shape=(None, self.hidden_size),
                     dims=("T", "H"), contiguous=False)  # fmt: skip
        x, top_experts = x.contiguous(), top_experts.contiguous()
        if isinstance(router_weights, torch.Tensor) and router_weights.is_floating_point():
            router_weights = router_weights.float().contiguous()
        workspace = F.get_workspace(
            self.config,
            self.group,
            device=x.device,
            num_local_tokens=x.shape[0],
            hidden_size=x.shape[1],
            topk=self.topk,
        )
        schedule = F.build_schedule(
            workspace, self.config, top_experts, num_local_experts=self.num_local_experts
        )
        weights = (
            self.shared_gate,
            self.shared_up,
            self.shared_down,
            self.routed_gate,
            self.routed_up,
            self.routed_down,
        )
        return MoEFunction.apply(
            self.config,
            workspace,
            schedule,
            self.swiglu_limit,
            self.mxfp8,
            x,
            router_weights,
            *weights,
        )


def _weight(shape: tuple[int, ...], device) -> nn.Parameter:
    """bf16 N(0, 1/fan_in), the scale that keeps activations O(1) through the layer."""
    weight = torch.randn(shape, device=device) * shape[-1] ** -0.5
    return nn.Parameter(weight.to(torch.bfloat16))
