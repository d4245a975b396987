"""MoKConfig: the tuning knobs of the forward and backward passes, validated on construction."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from mok import settings
from mok._arguments import check_multiple

# Custom ops take the capacity as an int64; 2^62 rows leaves room for the padding added to it.
MAX_SCHEDULE_CAPACITY = 2**62


# mok's knobs that change speed, never bits or what the original's arguments say (the fields
# after the original's six).
SPEED_KNOBS = (
    "grouped_gemm", "overlap_ctas", "swiglu_epilogue", "mxfp8_f16_rows", "overlap_dispatch",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class MoKConfig:
    """Tuning knobs; field order and defaults are those of the original package.

    | field                              | meaning                                              |
    |------------------------------------|------------------------------------------------------|
    | fwd_num_comm_sms                   | SMs given to dispatch/combine in the forward (even)  |
    | bwd_num_comm_sms                   | SMs given to communication in the backward (even)    |
    | minibatch_size                     | routed rows per arrival counter (multiple of 256)    |
    | macrobatch_size                    | routed rows saved for backward (multiple of minibatch)|
    | schedule_capacity_multiplier       | routed rows per rank: see schedule_capacity          |
    | all_gather_top_experts_chunk_bytes | chunk of the routing all-gather (multiple of 16)     |

    `schedule_capacity_multiplier` sizes the schedule. With `overlap_dispatch` on, the comm
    SM counts are the CTAs of the dispatch pull that runs beside the GEMM reading its rows (at
    most one a minibatch; the GEMM takes the other SMs, and theirs as the pull's CTAs exit) and
    `minibatch_size` the rows per arrival counter (docs/overlap.md); otherwise they are checked
    and passed to the ops as the original's callers expect but change nothing. The chunk bytes
    are what each CTA of the CUDA routing all-gather copies at a time. `macrobatch_size` bounds
    the routed activations a forward saves: a ring of at most that many rows plus 256 per
    local expert, the backward recomputing the rows before them (docs/macrobatch.md). No knob
    changes a bit of the results.

    mok adds its own speed knobs after them (keyword arguments; each defaults to its
    environment variable, parsed in mok.settings, so a launcher can still set them there):

    | field           | variable            | meaning                                        |
    |-----------------|---------------------|------------------------------------------------|
    | grouped_gemm    | MOK_GROUPED_GEMM    | routed GEMMs: auto / mok (mok's) / torch       |
    | overlap_ctas    | MOK_OVERLAP_CTAS    | CTAs of a background exchange; 0: foreground   |
    | swiglu_epilogue | MOK_SWIGLU_EPILOGUE | experimental: SwiGLU in the gate/up epilogue   |
    | mxfp8_f16_rows  | MOK_MXFP8_F16       | experimental: MXFP8 gate/up GEMM on f16 rows   |
    | overlap_dispatch | -                  | BF16 pulls beside the GEMM reading their rows  |

    None of them changes a bit of the results; the two experimental ones were slower on every
    GPU measured (docs/grouped-gemm.md). `overlap_dispatch` is off: on 1× H100 at EP 1 it is
    no faster than the pull alone at its best knobs and slower at the defaults (docs/overlap.md;
    `mok tune` sweeps it with them). mok.functional's eager passes read them
    from the config, and under torch.compile, where the passes run inside the original's fused
    ops, it hands them the config as their optional `mok_config` (to_json text); an op called in
    the original's form, without it, uses the environment's values (and its launch arguments
    for the comm SMs and the batch sizes). Process-wide settings (the
    backend, the wait bound, debug checks) stay environment variables (mok.settings).
    """

    fwd_num_comm_sms: int = 40
    bwd_num_comm_sms: int = 28
    minibatch_size: int = 4096
    macrobatch_size: int = 131072
    schedule_capacity_multiplier: float = 0.5
    all_gather_top_experts_chunk_bytes: int = 2048
    grouped_gemm: str = field(default_factory=settings.grouped_gemm, kw_only=True)
    overlap_ctas: int = field(default_factory=settings.overlap_ctas, kw_only=True)
    swiglu_epilogue: bool = field(default_factory=settings.swiglu_epilogue, kw_only=True)
    mxfp8_f16_rows: bool = field(default_factory=settings.mxfp8_f16_rows, kw_only=True)
    overlap_dispatch: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        check_multiple("fwd_num_comm_sms", self.fwd_num_comm_sms, 2)
        check_multiple("bwd_num_comm_sms", self.bwd_num_comm_sms, 2)
        check_multiple("minibatch_size", self.minibatch_size, 256)
        check_multiple("macrobatch_size", self.macrobatch_size, self.minibatch_size)
        multiplier = self.schedule_capacity_multiplier
        if isinstance(multiplier, bool) or not isinstance(multiplier, int | float):
            raise TypeError(
                f"`schedule_capacity_multiplier` must be a float, got {type(multiplier).__name__}"
            )
        if not (math.isfinite(multiplier) and multiplier > 0):
            raise ValueError(
                f"`schedule_capacity_multiplier` must be positive and finite, got {multiplier}"
            )
        check_multiple(
            "all_gather_top_experts_chunk_bytes", self.all_gather_top_experts_chunk_bytes, 16
        )
        if self.grouped_gemm not in settings.GROUPED_GEMMS:
            raise ValueError(
                f"`grouped_gemm` must be one of {', '.join(settings.GROUPED_GEMMS)}, "
                f"got {self.grouped_gemm!r}"
            )
        check_multiple("overlap_ctas", self.overlap_ctas, 1, minimum=0)
        for name in ("swiglu_epilogue", "mxfp8_f16_rows", "overlap_dispatch"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"`{name}` must be a bool, got {getattr(self, name)!r}")

    def speed_json(self) -> str:
        """mok's speed knobs (SPEED_KNOBS) as one JSON object: what the fused ops' `mok_config`
        takes. Built from strings, not with json, so that torch.compile traces it to a
        constant."""
        items = []
        for name in SPEED_KNOBS:
            value = getattr(self, name)
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, str):
                text = '"' + value + '"'
            else:
                text = str(value)
            items.append('"' + name + '": ' + text)
        return "{" + ", ".join(items) + "}"

    def to_json(self) -> str:
        """Every field as one JSON object (what `mok tune` writes; from_json reads it back)."""
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, source: str | os.PathLike) -> MoKConfig:
        """A MoKConfig from a JSON object of its fields (text, or the path of a file holding
        it); fields it leaves out keep their defaults, and every value is checked as on
        construction. An unknown field is a ValueError naming it."""
        text = str(source)
        if not text.lstrip().startswith("{"):
            text = Path(source).read_text(encoding="utf-8")
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise ValueError(f"a MoKConfig JSON must be an object, got {type(fields).__name__}")
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"MoKConfig has no field {', '.join(map(repr, unknown))}")
        return cls(**fields)

    def check_device(self, num_sms: int) -> None:
        """Comm SM counts must leave compute SMs on a device with `num_sms` multiprocessors."""
        for name in ("fwd_num_comm_sms", "bwd_num_comm_sms"):
            value = getattr(self, name)
            if value >= num_sms:
                raise ValueError(
                    f"`{name}` must be below the device's SM count ({num_sms}), got {value}"
                )

    def schedule_capacity(self, ep_size: int, num_local_tokens: int, topk: int) -> int:
        """The original's capacity C = T * k * max(2, ceil(EP * schedule_capacity_multiplier)):
        the routed rows a rank can receive, at least twice the mean load (in exact arithmetic,
        so a huge multiplier cannot overflow on the way).

        mok's schedules hold min(C, EP * T * k) rows (no rank receives more routes than exist),
        rounded up to 256, plus 256 per local expert for the segments' padding
        (MoKWorkspace.schedule_rows), so only real routes can overflow; a rank that receives
        more records a capacity-overflow error in the status word and the extra routes
        contribute zero. EP <= 2 or a multiplier >= 1 can never overflow.
        """
        share = math.ceil(Fraction(self.schedule_capacity_multiplier) * ep_size)
        capacity = num_local_tokens * topk * max(2, share)
        if capacity > MAX_SCHEDULE_CAPACITY:
            raise ValueError(
                f"`schedule_capacity_multiplier` must be at most "
                f"{MAX_SCHEDULE_CAPACITY // (num_local_tokens * topk) // ep_size} at EP "
                f"{ep_size}, T {num_local_tokens}, k {topk} (the capacity T * k * ceil(EP * "
                f"multiplier) must stay within {MAX_SCHEDULE_CAPACITY} rows), got "
                f"{self.schedule_capacity_multiplier}"
            )
        return capacity
