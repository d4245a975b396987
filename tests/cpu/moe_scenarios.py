"""The MoE scenarios of the numerical tests: deterministic inputs, and the worker that runs them
through `mok.functional` (schedule, forward, backward, check_status) on every rank of a gloo group.

Every scenario's inputs are a pure function of (scenario, EP), so the worker processes and the
float64 oracles in the test process build bit-identical tensors without sending any. Each EP size
runs every scenario in one spawn (`RunCache`); the tests only read the cached results.

Shapes are small (T = 40, H = 128, I = 256, 4 local experts, top-2) so the suite stays fast, and
the data is chosen so that: T is a multiple of nothing special; the last local expert of every
rank never gets a token (its weight gradients must be exactly zero); routing is skewed; router
weights are positive, negative and exactly zero; "hot" (T = 136) sends every token to one expert,
EP * 136 rows (several 256-row padded segments at EP >= 2); "invalid" carries expert ids -1 and
>= EP * E; "wide" spreads token magnitudes over many binades. Workers reuse one workspace per T
across scenarios, as a model reuses one across layers; the REPEATED scenarios also run twice more
(same workspace, fresh workspace) for the determinism tests.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import pytest
import torch
from distributed import RankError, run_on_ranks
from fault_helpers import status_message

import mok
from mok import functional as F

EP_SIZES = (1, 2, 4)
TOKENS, HOT_TOKENS, HIDDEN, INTER, LOCAL_EXPERTS, TOPK = 40, 136, 128, 256, 4, 2
# gate and up are ~N(0, 1) with the weight scaling below, so about 10% of gate values and 20% of
# up values exceed this limit: the clamp and its gradient mask are exercised, not just present.
LIMIT = 1.25
# Large enough that a leaked invalid route would dominate the output.
INVALID_WEIGHT = 1000.0
# Capacity multiplier 1.0 can never overflow (the default 0.5 could on skewed routing, and an
# overflow would drop routes that these tests expect to be computed).
CONFIG_KWARGS = {"schedule_capacity_multiplier": 1.0}
SCHEDULE_FIELDS = ("peer_rank", "peer_token_idx", "num_tokens", "tokens_per_expert")
GRAD_NAMES = (
    "d_x",
    "d_router_weights",
    "d_routed_gate",
    "d_routed_up",
    "d_routed_down",
    "d_shared_gate",
    "d_shared_up",
    "d_shared_down",
)


@dataclass(frozen=True)
class Scenario:
    mode: str  # "bf16" or "mxfp8"
    shared: bool
    clamp: bool
    routing: str = "skewed"  # "skewed", "hot" (one expert > 256 rows) or "invalid" ids
    # Token magnitudes spread over many binades: MX blocks along tokens then mix tiny and large
    # rows, the only way a wrong MXFP8 block direction shows (within one binade MX rounding does
    # not depend on the block scale).
    wide: bool = False

    @property
    def name(self) -> str:
        parts = [self.mode, "shared" if self.shared else "noshared"]
        parts += ["clamp" if self.clamp else "noclamp"]
        parts += [] if self.routing == "skewed" else [self.routing]
        return "-".join(parts + (["wide"] if self.wide else []))

    @property
    def limit(self) -> float | None:
        return LIMIT if self.clamp else None

    @property
    def tokens(self) -> int:
        return HOT_TOKENS if self.routing == "hot" else TOKENS


SCENARIOS = {
    s.name: s
    for s in [
        *(
            Scenario(m, sh, c)
            for m in ("bf16", "mxfp8")
            for sh in (True, False)
            for c in (True, False)
        ),
        Scenario("bf16", True, True, "invalid"),
        Scenario("mxfp8", False, True, "invalid"),
        Scenario("bf16", True, True, "hot"),
        Scenario("mxfp8", True, False, "hot"),
        Scenario("mxfp8", True, False, wide=True),
    ]
}
# The scenario run repeatedly for the determinism tests, per mode.
REPEATED = {"bf16": "bf16-shared-clamp", "mxfp8": "mxfp8-shared-clamp"}


def _seed(name: str, ep: int) -> int:
    return sum(ord(c) * 31**i for i, c in enumerate(name)) % 2**31 + ep


def _routing(scenario: Scenario, ep: int, tokens: int, gen: torch.Generator) -> torch.Tensor:
    """int64 [EP, T, k]: distinct skewed experts per token; local expert E-1 never used."""
    num_experts = ep * LOCAL_EXPERTS
    usable = torch.arange(num_experts) % LOCAL_EXPERTS != LOCAL_EXPERTS - 1
    skew = 0.75 ** torch.arange(num_experts, dtype=torch.float64) * usable
    probs = skew.expand(ep * tokens, -1)
    top = torch.multinomial(probs, TOPK, generator=gen).reshape(ep, tokens, TOPK)
    if scenario.routing == "hot":
        # Slot 0 of every token goes to expert 1 (never chosen by slot 1: moved to expert 0).
        top[..., 1] = torch.where(top[..., 1] == 1, 0, top[..., 1])
        top[..., 0] = 1
    if scenario.routing == "invalid":
        pick = torch.rand(top.shape, generator=gen)
        top = torch.where(pick < 0.08, -1, top)
        top = torch.where(pick > 0.92, num_experts + (pick * 100).long() % 3, top)
    return top


def _router_weights(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """fp32: 60% positive, 25% negative, 15% exactly zero (every sign must get its gradient)."""
    magnitude = 0.05 + 0.95 * torch.rand(shape, generator=gen)
    pick = torch.rand(shape, generator=gen)
    return magnitude * torch.where(pick < 0.25, -1.0, torch.where(pick < 0.4, 0.0, 1.0))


def is_invalid(top: torch.Tensor, ep: int) -> torch.Tensor:
    return (top < 0) | (top >= ep * LOCAL_EXPERTS)


def make_inputs(name: str, ep: int) -> dict:
    """Global inputs of every rank: x/grad [EP, T, H], top/rw [EP, T, k], routed weights for all
    EP * E experts ([EP*E, I, H] gate/up, [EP*E, H, I] down; expert e on rank e // E), shared
    weights (the same on every rank) or None."""
    scenario = SCENARIOS[name]
    return inputs_for(scenario, ep, _seed(name, ep), scenario.tokens)


def inputs_for(scenario: Scenario, ep: int, seed: int, tokens: int) -> dict:
    """make_inputs for any scenario, seed and T (the property tests draw them)."""
    gen = torch.Generator().manual_seed(seed)
    num_experts = ep * LOCAL_EXPERTS

    def weight(*shape):  # nn.Linear-like init: each output is ~N(0, |input|^2 / fan_in)
        return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).bfloat16()

    top = _routing(scenario, ep, tokens, gen)
    rw = torch.where(is_invalid(top, ep), INVALID_WEIGHT, _router_weights(top.shape, gen))
    inputs = {
        "top": top,
        "rw": rw,
        "x": torch.randn(ep, tokens, HIDDEN, generator=gen).bfloat16(),
        "grad": torch.randn(ep, tokens, HIDDEN, generator=gen).bfloat16(),
        "gate": weight(num_experts, INTER, HIDDEN),
        "up": weight(num_experts, INTER, HIDDEN),
        "down": weight(num_experts, HIDDEN, INTER),
        "shared": None,
    }
    if scenario.wide:
        # Powers of two keep the bf16 values exact: x spans 2^+-2 per token, grad 2^+-8.
        for key, spread in (("x", 2), ("grad", 8)):
            exponent = torch.randint(-spread, spread + 1, (ep, tokens, 1), generator=gen)
            inputs[key] = inputs[key] * torch.exp2(exponent.float()).bfloat16()
    if scenario.shared:
        inputs["shared"] = (weight(INTER, HIDDEN), weight(INTER, HIDDEN), weight(HIDDEN, INTER))
    return inputs


# ------------------------------------------------------------------------ worker side (per rank)


def _local(inputs: dict, rank: int):
    """This rank's (top, x, rw, grad, shared, routed): its tokens and its experts' weights."""
    experts = slice(rank * LOCAL_EXPERTS, (rank + 1) * LOCAL_EXPERTS)
    routed = tuple(inputs[k][experts].contiguous() for k in ("gate", "up", "down"))
    shared = inputs["shared"] or (None, None, None)
    return (
        inputs["top"][rank],
        inputs["x"][rank],
        inputs["rw"][rank],
        inputs["grad"][rank],
        shared,
        routed,
    )


def _weight_forms(routed, mode: str):
    """(forward, backward) forms of the routed weights; MXFP8 as API.md lists them."""
    if mode == "bf16":
        return routed, routed
    gate, up, down = (tuple(mok.ops.mxfp8_quantize(w, True, True)) for w in routed)
    return (gate[:2], up[:2], down[:2]), (gate, up, down[2:])


def _workspace(config, tokens: int):
    return F.create_workspace(
        config, None, device="cpu", num_local_tokens=tokens, hidden_size=HIDDEN, topk=TOPK
    )


def _step(ws, config, scenario: Scenario, inputs: dict, rank: int):
    """One training step through the public API: schedule, forward, backward."""
    top, x, rw, grad, shared, routed = _local(inputs, rank)
    fwd_weights, bwd_weights = _weight_forms(routed, scenario.mode)
    limit = scenario.limit
    schedule = F.build_schedule(ws, config, top, num_local_experts=LOCAL_EXPERTS)
    out, ctx = F.forward(config, ws, schedule, x, rw, *shared, *fwd_weights, swiglu_limit=limit)
    grads = F.backward(
        config, ws, schedule, ctx, grad, x, rw, *shared, *bwd_weights, swiglu_limit=limit
    )
    return {"out": out, "grads": dict(zip(GRAD_NAMES, grads, strict=True))}, schedule, ctx


def _invalid_extras(ws, config, scenario: Scenario, inputs: dict, rank: int, ep: int) -> dict:
    """Buffer rows of the invalid routes (from the step just run), then a twin step whose
    invalid routes have router weight 0: if those routes contribute exactly zero, the twin's
    outputs are bitwise those of the step with weight INVALID_WEIGHT."""
    invalid = is_invalid(inputs["top"][rank], ep).reshape(-1)
    extras = {
        "combine_rows": ws.combine_buffer[invalid].clone(),
        "d_x_routed_rows": ws.d_x_routed_buffer[invalid].clone(),
    }
    twin_inputs = dict(inputs, rw=torch.where(is_invalid(inputs["top"], ep), 0.0, inputs["rw"]))
    extras["twin"] = _step(ws, config, scenario, twin_inputs, rank)[0]
    status_message(ws)  # the twin recorded the invalid ids again: leave a clean status behind
    return extras


def _run_scenario(rank: int, ep: int, name: str, workspaces: dict) -> dict:
    """One scenario on the worker's workspace for its T, reused across scenarios as a model
    reuses one workspace across layers, so each step starts from another step's leftovers."""
    scenario = SCENARIOS[name]
    inputs = make_inputs(name, ep)
    config = F.MoKConfig(**CONFIG_KWARGS)
    if scenario.tokens not in workspaces:
        workspaces[scenario.tokens] = _workspace(config, scenario.tokens)
    ws = workspaces[scenario.tokens]
    result, schedule, ctx = _step(ws, config, scenario, inputs, rank)
    result["schedule"] = dict(zip(SCHEDULE_FIELDS, schedule.as_tuple(), strict=True))
    if scenario.mode == "bf16":
        result["x_routed"] = ctx.x_routed.clone()
    result["status"] = status_message(ws)
    result["status_after_check"] = status_message(ws)
    if scenario.routing == "invalid":
        result.update(_invalid_extras(ws, config, scenario, inputs, rank, ep))
    if name in REPEATED.values():
        # Determinism: the same step again right away (the workspace now holds this step's
        # own leftovers), and on a workspace that has never run anything.
        result["again"] = _step(ws, config, scenario, inputs, rank)[0]
        fresh = _workspace(config, scenario.tokens)
        result["fresh"] = _step(fresh, config, scenario, inputs, rank)[0]
    return result


def run_all(rank: int, ep: int) -> dict:
    """Every scenario on this rank; a scenario that raises records its traceback and the rest
    still run (a failure symmetric across ranks, the usual kind, leaves the group usable)."""
    results, workspaces = {}, {}
    for name in SCENARIOS:
        try:
            results[name] = _run_scenario(rank, ep, name, workspaces)
        except Exception:
            results[name] = {"error": traceback.format_exc()}
    return results


# ------------------------------------------------------------------------ test side


class RunCache:
    """Spawns each EP size once (on first use) and hands out per-scenario, per-rank results."""

    def __init__(self) -> None:
        self._runs: dict[int, list[dict] | Exception] = {}

    def results(self, ep: int, name: str) -> list[dict]:
        if ep not in self._runs:
            try:
                self._runs[ep] = run_on_ranks(run_all, ep, timeout_s=300, collective_timeout_s=60)
            except RankError as error:
                self._runs[ep] = error
        runs = self._runs[ep]
        if isinstance(runs, Exception):
            pytest.fail(f"the EP={ep} workers failed:\n{runs}", pytrace=False)
        per_rank = [rank_results[name] for rank_results in runs]
        errors = [f"rank {r}:\n{res['error']}" for r, res in enumerate(per_rank) if "error" in res]
        if errors:
            pytest.fail(f"{name} raised at EP={ep}\n" + "\n".join(errors), pytrace=False)
        return per_rank
