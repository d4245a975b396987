"""Helpers of the fault tests of both tiers: a rank's check_status verdict as a message, and a
schedule spoiled as a hand-built one could be."""

from __future__ import annotations

from mok import MoKDeviceError
from mok import functional as F
from mok.schedule import MoKSchedule


def status_message(ws) -> str | None:
    """The MoKDeviceError message check_status raises, or None; any other exception propagates."""
    try:
        F.check_status(ws)
    except MoKDeviceError as error:
        return str(error)
    return None


SCHEDULE_FAULTS = (
    "token-index-past-T*k",
    "negative-token-index",
    "peer-rank-past-EP",
    "peer-rank-below-minus-1",
    "num-tokens-past-the-rows",
    "counts-disagree",
)
_FIELDS = ("peer_rank", "peer_token_idx", "num_tokens", "tokens_per_expert")


def spoiled(schedule: MoKSchedule, fault: str, *, routes_per_rank=0, ep_size=1) -> MoKSchedule:
    """A copy of `schedule` with one entry out of range or one count that disagrees (`fault`,
    one of SCHEDULE_FAULTS), as a hand-built MoKSchedule could hold it."""
    fields = dict(zip(_FIELDS, (t.clone() for t in schedule.as_tuple()), strict=True))
    rows, counts = fields["peer_rank"].shape[0], fields["tokens_per_expert"]
    name, value = {
        "token-index-past-T*k": ("peer_token_idx", routes_per_rank),
        "negative-token-index": ("peer_token_idx", -3),
        "peer-rank-past-EP": ("peer_rank", ep_size),
        "peer-rank-below-minus-1": ("peer_rank", -2),
        "num-tokens-past-the-rows": ("num_tokens", rows + 256),
        "counts-disagree": ("tokens_per_expert", int(counts[0]) + 256),
    }[fault]
    fields[name][0] = value
    return MoKSchedule(**fields)
