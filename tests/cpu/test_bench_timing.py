"""The benchmark harness's timing: one call's time, kernels' busy time on a timeline, and
measurements that take several functions in turns."""

from __future__ import annotations

import time

import pytest
from bench_modules import load


def test_local_ms_times_one_call_without_a_process_group():
    harness = load("harness")
    calls = []
    ms = harness.local_ms(lambda: (calls.append(1), time.sleep(0.02)), cuda=False)
    assert calls == [1]
    assert 20.0 <= ms < 2000.0


def test_interleaved_measurement_alternates_and_shares_the_budget(single_rank_group):
    """Timer.measure_interleaved: warm-up and timed calls take the fns in turn (a, b, a, b, ...),
    each fn gets its own Timing of its own calls, and budget_s bounds their total."""
    import torch

    harness = load("harness")
    d = harness.Dist(0, 1, torch.device("cpu"), single_rank_group)
    timer = harness.Timer(d, warmup_s=0.0, budget_s=0.1, max_iters=50)
    calls = []
    slow = timer.measure_interleaved(
        [lambda: (calls.append("a"), time.sleep(0.01)), lambda: calls.append("b")]
    )[0]
    assert calls == ["a", "b"] * (len(calls) // 2) and len(calls) % 2 == 0
    assert slow.warmup_iters == 1 and 1 + slow.iters == len(calls) // 2
    assert slow.min_ms >= 10.0 and slow.iters <= 11 and slow.power is None  # 0.1 s / 10 ms
    calls.clear()
    fast, slow = timer.measure_interleaved([lambda: calls.append("b"), lambda: time.sleep(0.01)])
    assert fast.iters == slow.iters and fast.median_ms < 10.0 <= slow.median_ms
    assert timer.measure(lambda: None).power is not None  # one fn keeps its power record


def test_timeline_counts_overlapping_kernels_once_and_the_host_waits_apart():
    """harness.timeline_ms on kernel spans (µs): the marker [0, 10], the call's first kernel
    20 µs after it, a second stream's kernel inside the first one, then a 10 µs gap."""
    harness = load("harness")
    spans = [(100.0, 150.0), (0.0, 10.0), (30.0, 80.0), (40.0, 60.0), (70.0, 90.0)]
    first, idle, busy = harness.timeline_ms(spans)
    assert (first, idle, busy) == pytest.approx((0.020, 0.010, 0.110))
    assert harness.timeline_ms([(0.0, 10.0)]) == (0.0, 0.0, 0.0)  # the call launched nothing


def test_host_ahead_puts_a_sleep_kernel_before_the_start_event(monkeypatch):
    """local_ms(host_ahead=True) enqueues the sleep before the start event and the call after
    it, so the host's way to the first launch is not timed; without it, no sleep."""
    import torch

    harness = load("harness")
    order, made = [], []

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            self.name = "end" if made else "start"
            made.append(self)

        def record(self) -> None:
            order.append(f"record {self.name}")

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end) -> float:
            return 1.5

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: order.append(f"sleep {cycles}"))
    assert harness.local_ms(lambda: order.append("call"), host_ahead=True) == 1.5
    assert order == [f"sleep {harness.HOST_AHEAD_CYCLES}", "record start", "call", "record end"]
    order.clear()
    made.clear()
    harness.local_ms(lambda: order.append("call"))
    assert order == ["record start", "call", "record end"]
