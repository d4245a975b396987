"""`torch.ops.mok.*`: the low-level ops, as torch.library custom ops with fake implementations.

This is the compatibility edge. Names, argument order and return order are the original
package's; mok adds optional trailing arguments (`group_name`, `status`). Each op checks its
arguments once and calls what mok.functional calls: the backend that the registry
(mok.backends) picks for the tensors' device, and for the fused ops mok.passes, after packing
their flat arguments into mok's objects. The fake implementations let
`torch.compile(fullgraph=True)` trace a whole step.

| module         | ops                                                           |
|----------------|---------------------------------------------------------------|
| comm           | all_gather_top_experts, barrier_all                           |
| schedule       | schedule (schedule_op: the op, its status word always given;  |
|                | schedule_status: the word of calls without one)               |
| mxfp8          | mxfp8_quantize                                                |
| fused_forward  | dispatch_mlp_swiglu_combine_fwd_bf16, ..._fwd_mxfp8           |
| fused_backward | dispatch_mlp_swiglu_combine_bwd_bf16, ..._bwd_mxfp8           |
| epilogue       | fwd_epilogue, bwd_epilogue                                    |
"""

from mok.ops.comm import all_gather_top_experts, barrier_all
from mok.ops.epilogue import bwd_epilogue, fwd_epilogue
from mok.ops.fused_backward import (
    dispatch_mlp_swiglu_combine_bwd_bf16,
    dispatch_mlp_swiglu_combine_bwd_mxfp8,
)
from mok.ops.fused_forward import (
    dispatch_mlp_swiglu_combine_fwd_bf16,
    dispatch_mlp_swiglu_combine_fwd_mxfp8,
)
from mok.ops.mxfp8 import mxfp8_quantize
from mok.ops.schedule import schedule, schedule_op, schedule_status, schedule_worst_case_rows

__all__ = [
    "all_gather_top_experts",
    "barrier_all",
    "bwd_epilogue",
    "dispatch_mlp_swiglu_combine_bwd_bf16",
    "dispatch_mlp_swiglu_combine_bwd_mxfp8",
    "dispatch_mlp_swiglu_combine_fwd_bf16",
    "dispatch_mlp_swiglu_combine_fwd_mxfp8",
    "fwd_epilogue",
    "mxfp8_quantize",
    "schedule",
    "schedule_op",
    "schedule_status",
    "schedule_worst_case_rows",
]
