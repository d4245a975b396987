"""Board power and SM clock of each rank's GPU while a measurement runs (nvidia-smi samples).

An H200 that reaches its power limit lowers its SM clock, and then a step's time follows the
energy it spends more than its critical path: work moved beside other work still costs power
(NOTES.md, "Power and clocks"). So each timed measurement records, per GPU, the mean and peak
board power, the mean and lowest SM clock, and the share of samples in which the driver named
the software power cap as a reason for a lower clock. Without nvidia-smi (CPU runs) nothing is
sampled.
"""

from __future__ import annotations

import functools
import statistics
import subprocess

import torch
import torch.distributed as dist

INTERVAL_MS = 50


@functools.cache
def _query_fields() -> tuple[str, str] | None:
    """(power field, power-cap reason field) as this driver names them, or None without one.
    `power.draw` is a 1 s average on Ampere and newer, so the instant reading is preferred; the
    clock reasons were renamed from throttle to event in driver 535."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--help-query-gpu"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = done.stdout
    power = "power.draw.instant" if "power.draw.instant" in text else "power.draw"
    for cap in ("clocks_event_reasons.sw_power_cap", "clocks_throttle_reasons.sw_power_cap"):
        if cap in text:
            return power, cap
    return None


def summarize(lines: list[str]) -> dict | None:
    """Mean and peak watts, mean and lowest SM MHz, the share of power-capped samples, from
    `nvidia-smi --format=csv,noheader,nounits` lines of (SM MHz, W, power-cap reason);
    lines that do not parse (a sample cut off when the sampler stopped) are left out."""
    samples = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        try:
            samples.append((float(parts[0]), float(parts[1]), parts[2] == "Active"))
        except (IndexError, ValueError):
            continue
    if not samples:
        return None
    mhz, watts, capped = zip(*samples, strict=True)
    return {
        "power_w_mean": statistics.fmean(watts),
        "power_w_max": max(watts),
        "sm_mhz_mean": statistics.fmean(mhz),
        "sm_mhz_min": min(mhz),
        "power_capped_share": sum(capped) / len(capped),
        "samples": len(samples),
    }


class Sampler:
    """`with Sampler(device) as s:` samples that GPU (by UUID, whatever CUDA's device order);
    afterwards `s.summary` is summarize()'s dict, or None where nothing could be sampled."""

    def __init__(self, device: torch.device | None) -> None:
        self.device, self.summary, self._process = device, None, None

    def __enter__(self) -> Sampler:
        fields = _query_fields()
        if self.device is None or self.device.type != "cuda" or fields is None:
            return self
        uuid = torch.cuda.get_device_properties(self.device).uuid
        command = ["nvidia-smi", "-i", f"GPU-{uuid}", f"--query-gpu=clocks.sm,{','.join(fields)}",
                   "--format=csv,noheader,nounits", "-lms", str(INTERVAL_MS)]  # fmt: skip
        try:
            self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        except OSError:
            self._process = None
        return self

    def __exit__(self, *exc_info) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            out, _ = self._process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            out, _ = self._process.communicate()
        self.summary = summarize(out.splitlines())


def per_rank(summary: dict | None, group) -> list[dict | None]:
    """Every rank's summary, in rank order (an all_gather: every rank must call it)."""
    gathered: list[dict | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, summary, group=group)
    return gathered
