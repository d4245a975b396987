"""Where the passes run exchanges in the background (mok.passes), the knob that sizes them
(MOK_OVERLAP_CTAS) and the exchanges' wait bound (MOK_COMM_TIMEOUT_S). The GPU side, bitwise
equality with foreground exchanges, is in tests/gpu/test_functional_cuda.py."""

from __future__ import annotations

import pytest
import torch

from mok import experts, passes
from mok.backends.cuda.dense_gemms import sm_carveout
from mok.config import MoKConfig
from mok.ops import mxfp8_quantize
from mok.schedule import MoKSchedule
from mok.settings import comm_timeout_ns as timeout_ns
from mok.settings import overlap_ctas as background_ctas

HIDDEN, INTER, EXPERTS, SEGMENT = 128, 64, 2, 256
ROWS = EXPERTS * SEGMENT


class RecordingEngine:
    """An EP-1 engine whose exchanges return random rows and record how they were asked for;
    it fails a pass that starts the routed GEMMs while a background exchange is not joined."""

    topk = 1
    dispatch_is_local = False  # the order of a pass whose dispatch waits for peers

    def __init__(self) -> None:
        self.log: list[tuple[str, bool]] = []
        self.pending = False
        self.barriers = 0
        self.gen = torch.Generator().manual_seed(0)

    def _exchange(self, kind: str, background: bool) -> None:
        self.log.append((kind, background))
        self.pending |= background

    def pull(self, name, schedule, background=False, *, sync=(True, True)):
        self._exchange(f"pull {name}", background)
        self.barriers += sum(sync)
        return torch.randn(ROWS, HIDDEN, generator=self.gen).to(torch.bfloat16)

    def pull_beside(self, name, schedule, gemm, *, sync=(True, True)):
        return self.pull(name, schedule, sync=sync), None

    def pull_rounded(self, name, schedule, gemm, background=False, *, sync=(True, True)):
        # Rounded as part of the exchange (as the CUDA engine's kernel does), not logged as a
        # routed step.
        rows = self.pull(name, schedule, background, sync=sync)
        rounded = experts.MaskedGemms(gemm.row_expert, gemm.num_experts).mx_round_both(rows)
        return lambda: rounded

    def pull_rounded_rows(self, name, schedule, gemm, rw, background=False, *, sync=(True, True)):
        rows = self.pull(name, schedule, background, sync=sync)
        unlogged = experts.MaskedGemms(gemm.row_expert, gemm.num_experts)
        rounded = experts.mx_round_d_out(unlogged, rows, rw)
        return lambda: rounded

    def pull_router_weights(self, schedule, background=False, *, sync=(True, True)):
        self._exchange("pull router weights", background)
        self.barriers += sum(sync)
        return torch.rand(ROWS, generator=self.gen)

    def push_all(self, pushes, schedule, background=False):
        for _, name in pushes:
            self._exchange(f"push {name}", background)
        self.barriers += 2

    def join(self) -> None:
        self.log.append(("join", False))
        self.pending = False

    def hand_back_pushed(self) -> None:
        # The pushed-into buffers are copied to their arguments on the current stream: every
        # push must be joined by then.
        assert not self.pending, "buffers handed back while a background exchange runs"
        self.log.append(("hand back", False))

    def routed_gemms(self, schedule, num_experts):
        row_expert = experts.row_experts(schedule[3], schedule[2], ROWS)
        return LoggedGemms(self, row_expert, num_experts)

    def shared_gemms(self, tokens):
        self.log.append(("shared gemms", False))
        return experts.MaskedGemms(torch.zeros(tokens, dtype=torch.int64), 1)


class LoggedGemms(experts.MaskedGemms):
    """The routed experts' engine, logging the weight-gradient steps into the pass's log."""

    def __init__(self, engine: RecordingEngine, row_expert, num_experts):
        super().__init__(row_expert, num_experts)
        self.engine = engine

    def linear(self, a, weight):
        assert not self.engine.pending, "routed GEMM before the background exchange joined"
        self.engine.log.append(("routed linear", False))
        return super().linear(a, weight)

    def dequantize(self, data, scales, transposed=False):
        self.engine.log.append(("routed dequantize", self.engine.pending))
        return super().dequantize(data, scales, transposed)

    def scale_rows(self, x, weight):
        self.engine.log.append(("routed scale_rows", self.engine.pending))
        return super().scale_rows(x, weight)

    def mx_round_rows(self, t, row_weight=None):
        self.engine.log.append(("routed mx_round_rows", self.engine.pending))
        return super().mx_round_rows(t, row_weight)

    def swiglu_backward(self, d_h, rw, gate, up, hidden, limit, **options):
        self.engine.log.append((f"routed swiglu_backward scale_hidden={options['scale_hidden']}",
                                False))  # fmt: skip
        self.engine.log.append((f"routed swiglu_backward hidden_grad={options['hidden_grad']}",
                                False))  # fmt: skip
        return super().swiglu_backward(d_h, rw, gate, up, hidden, limit, **options)

    def weight_grads(self, pairs):
        assert not self.engine.pending, "routed weight gradients before the push joined"
        self.engine.log.append(("routed weight_grads", False))
        return super().weight_grads(pairs)


def _weights(gen, experts_count, inter=INTER):
    def w(*shape):
        return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).to(torch.bfloat16)

    return (w(experts_count, inter, HIDDEN), w(experts_count, inter, HIDDEN),
            w(experts_count, HIDDEN, inter))  # fmt: skip


def _mxfp8_forms(weights):
    """(forward, backward) MXFP8 forms of the routed weights, as API.md specifies them."""
    gate, up, down = (mxfp8_quantize(w, True, True) for w in weights)
    return (gate[:2], up[:2], down[:2]), (gate, up, down[2:])


def _run_step(shared_inter: int | None, mxfp8: bool = False, local: bool = False,
              op_outputs: bool = True):  # fmt: skip
    """One forward and backward at top-1 (a RecordingEngine, whose `outputs` are then the
    backward's); no shared expert when `shared_inter` is None; `local`: the engine's dispatch
    waits for no peer (EP 1); `op_outputs` as mok.passes.backward's."""
    gen = torch.Generator().manual_seed(1)
    tokens = 64
    schedule = MoKSchedule(
        torch.zeros(ROWS, dtype=torch.int32),
        torch.arange(ROWS, dtype=torch.int32),
        torch.tensor([ROWS], dtype=torch.int32),
        torch.full((EXPERTS,), SEGMENT, dtype=torch.int32),
    )
    x = torch.randn(tokens, HIDDEN, generator=gen).to(torch.bfloat16)
    routed = _weights(gen, EXPERTS, 128 if mxfp8 else INTER)  # MXFP8 tiles are 128 wide
    routed_fwd, routed_bwd = _mxfp8_forms(routed) if mxfp8 else (routed, routed)
    with_shared = shared_inter is not None
    shared = tuple(w[0] for w in _weights(gen, 1, shared_inter)) if with_shared else None
    engine = RecordingEngine()
    engine.dispatch_is_local = local
    ring = MoKConfig().macrobatch_size
    saved, _, shared_out = passes.forward(engine, x, shared, routed_fwd, schedule, None, mxfp8,
                                          ring)  # fmt: skip
    assert not engine.pending, "forward returned with a background exchange not joined"
    shared_saved = shared_out[:3] if with_shared else None
    engine.outputs = passes.backward(engine, x, shared, routed_bwd, saved, shared_saved, x,
                                     schedule, None, mxfp8, ring, op_outputs)  # fmt: skip
    assert not engine.pending, "backward returned with a background exchange not joined"
    return engine


def test_backward_exchanges_overlap_a_large_shared_expert_only():
    large = passes.MIN_SHARED_INTER_PER_TOPK  # at top-1: the smallest shared expert that overlaps
    exchanges = [(kind, bg) for kind, bg in _run_step(large).log if not kind.startswith("routed")]
    backgrounds = [kind for kind, bg in exchanges if bg]
    assert backgrounds == [  # the backward's exchanges; the forward gained nothing (mok.passes)
        "pull router weights",
        "pull d_y_buffer",
        "push d_x_routed_buffer",
        "push d_router_weight_buffer",
    ]
    for small in (large - 2, None):  # too small to hide an exchange; none at all
        assert not any(bg for _, bg in _run_step(small).log)


@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
def test_the_routed_experts_go_first_where_the_dispatch_waits_for_no_peer(mxfp8):
    """EP 1: each pass enqueues its pull and routed GEMMs before the shared expert (the GPU
    starts on them while the host enqueues the shared GEMMs), except the backward under a
    shared expert large enough to hide the exchanges; where the dispatch waits for peers the
    shared expert goes first."""
    for shared_inter in (64, passes.MIN_SHARED_INTER_PER_TOPK):
        for local in (False, True):
            kinds = [kind for kind, _ in _run_step(shared_inter, mxfp8, local).log]
            backward = kinds.index("pull router weights")
            hides = shared_inter >= passes.MIN_SHARED_INTER_PER_TOPK
            for part, routed_first in ((kinds[:backward], local),
                                       (kinds[backward:], local and not hides)):  # fmt: skip
                first_routed, first_shared = part.index("routed linear"), part.index("shared gemms")
                assert (first_routed < first_shared) == routed_first, (local, hides, part)


def test_mxfp8_pulls_run_beside_the_dequantization():
    """In MXFP8 every pull runs in the background, also without a shared expert to hide it,
    while the routed weights (forward: 3) and the saved activations and transposed weights
    (backward: 7) are dequantized; the routed GEMMs wait for the join (LoggedGemms checks)."""
    log = _run_step(None, mxfp8=True).log
    backgrounds = [kind for kind, bg in log if bg and not kind.startswith("routed")]
    assert backgrounds == ["pull x_buffer", "pull router weights", "pull d_y_buffer"]
    beside = [kind for kind, pending in log if kind == "routed dequantize" and pending]
    assert len(beside) == 3 + 7


def test_routed_wgrad_inputs_are_prepared_beside_the_push():
    """MXFP8: the row-blocked roundings of d_gate and d_up are computed while the background
    push runs (the comm stream's fork is pending), the routed weight-gradient GEMMs only after
    it joined; d_out's router-weighted rounding comes with its pull (no routed step)."""
    log = _run_step(passes.MIN_SHARED_INTER_PER_TOPK, mxfp8=True).log
    kinds = [kind for kind, _ in log]
    roundings = [i for i, kind in enumerate(kinds) if kind == "routed mx_round_rows"]
    assert [log[i] for i in roundings] == [("routed mx_round_rows", True)] * 2
    assert kinds.index("push d_x_routed_buffer") < roundings[0]
    assert roundings[-1] < kinds.index("routed weight_grads")
    assert "join" in kinds[roundings[-1] : kinds.index("routed weight_grads")]
    assert "routed scale_rows" not in kinds


def test_bf16_hidden_rows_are_scaled_by_the_swiglu_backward():
    """BF16: d_W_down's router-weighted hidden rows come from the SwiGLU backward's pass, so no
    scaling pass runs before the weight gradients; MXFP8 scales d_out's rows instead."""
    kinds = [kind for kind, _ in _run_step(passes.MIN_SHARED_INTER_PER_TOPK).log]
    assert "routed swiglu_backward scale_hidden=True" in kinds
    assert "routed scale_rows" not in kinds
    mx_kinds = [kind for kind, _ in _run_step(None, mxfp8=True).log]
    assert "routed swiglu_backward scale_hidden=False" in mx_kinds


@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
def test_the_functional_backward_writes_no_d_hidden(mxfp8):
    """Without the fused op's outputs (mok.functional's call) both d_hidden are None, the
    SwiGLU backward asked not to write them; every other output keeps its bits."""
    for shared_inter in (None, 64):
        full = _run_step(shared_inter, mxfp8)
        lean = _run_step(shared_inter, mxfp8, op_outputs=False)
        for i, (want, got) in enumerate(zip(full.outputs, lean.outputs, strict=True)):
            if i in (6, 7):  # d_hidden_shared, d_hidden_routed
                assert got is None and (want is not None or i == 6 and shared_inter is None)
            elif want is None:
                assert got is None
            else:
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), i
        asked = [kind for kind, _ in lean.log if "hidden_grad" in kind]
        assert asked == ["routed swiglu_backward hidden_grad=False"]
        assert "routed swiglu_backward hidden_grad=True" in [kind for kind, _ in full.log]


def test_each_pass_asks_for_three_barriers():
    """One before the pulls, one before and one after the pushes (cuda_comm's table says what
    each protects); the pulls' trailing barrier is the pushes' leading one."""
    assert _run_step(None).barriers == 2 * 3


def test_overlap_ctas_knob(monkeypatch):
    monkeypatch.delenv("MOK_OVERLAP_CTAS", raising=False)
    assert background_ctas() == 64
    monkeypatch.setenv("MOK_OVERLAP_CTAS", "0")
    assert background_ctas() == 0


@pytest.mark.parametrize("text", ["-1", "many", "2.5"])
def test_overlap_ctas_rejects_bad_values(monkeypatch, text):
    monkeypatch.setenv("MOK_OVERLAP_CTAS", text)
    with pytest.raises(ValueError, match="MOK_OVERLAP_CTAS must be a CTA count >= 0"):
        background_ctas()


def test_comm_timeout_knob(monkeypatch):
    monkeypatch.delenv("MOK_COMM_TIMEOUT_S", raising=False)
    assert timeout_ns() == 5_000_000_000
    monkeypatch.setenv("MOK_COMM_TIMEOUT_S", "0.25")
    assert timeout_ns() == 250_000_000


@pytest.mark.parametrize("text", ["0", "-1", "soon", "nan", "inf", "1e10"])
def test_comm_timeout_rejects_bad_values(monkeypatch, text):
    """Named errors, not float()'s bare one or an int that overflows the kernel's argument."""
    monkeypatch.setenv("MOK_COMM_TIMEOUT_S", text)
    with pytest.raises(ValueError, match=r"MOK_COMM_TIMEOUT_S must be a number of seconds in"):
        timeout_ns()


def test_sm_carveout_is_scoped():
    """cuBLAS's carve-out is set inside the block only and restored after, even on an error."""
    before = torch._C._get_sm_carveout_experimental()
    with sm_carveout(32):
        assert torch._C._get_sm_carveout_experimental() == 32
    assert torch._C._get_sm_carveout_experimental() == before
    with pytest.raises(RuntimeError, match="inside"), sm_carveout(16):
        raise RuntimeError("inside")
    assert torch._C._get_sm_carveout_experimental() == before
    with sm_carveout(0):  # nothing to leave free: the setting is untouched
        assert torch._C._get_sm_carveout_experimental() == before
