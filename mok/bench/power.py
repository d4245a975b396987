"""Board power and SM clock of each rank's GPU while a measurement runs (nvidia-smi samples).

An H200 that reaches its power limit lowers its SM clock, and then a step's time follows the
energy it spends more than its critical path: work moved beside other work still costs power
(README.md, "Method"). So each timed measurement records, per GPU, the mean and peak
board power, the mean and lowest SM clock, and the share of samples in which the driver named
the software power cap as a reason for a lower clock, and the energy the GPU used (NVML's
energy counter, read before and after). Without nvidia-smi and the driver's NVML library (CPU
runs) nothing is sampled.
"""

from __future__ import annotations

import ctypes
import functools
import statistics
import subprocess
import time
from collections.abc import Callable

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


@functools.cache
def _nvml() -> ctypes.CDLL | None:
    """The driver's NVML library, initialised, or None where it is absent."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    return lib if lib.nvmlInit_v2() == 0 else None


def energy_reader(uuid: str) -> Callable[[], float | None]:
    """A function returning the GPU's energy counter in joules (NVML counts millijoules since
    the driver loaded; Volta and newer), or None where it cannot be read."""
    lib = _nvml()
    handle = ctypes.c_void_p()
    if lib is None or lib.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}".encode(), ctypes.byref(handle)):
        return lambda: None

    def read() -> float | None:
        millijoules = ctypes.c_ulonglong()
        failed = lib.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(millijoules))
        return None if failed else millijoules.value / 1e3

    return read


class Sampler:
    """`with Sampler(device) as s:` samples that GPU (by UUID, whatever CUDA's device order);
    afterwards `s.summary` is summarize()'s dict with `energy_j` (joules used in the block) and
    `energy_window_s` (the block's seconds) where NVML counts them, or None where nothing could
    be sampled. The counter moves in steps: on 2x H200 (8684ed3's runs) blocks of 3 s agreed with
    mean sampled watts x time within 2-7%, blocks under 1 s were off by up to 12% (0.6 s) and 1.8x
    (0.1-0.2 s)."""

    def __init__(self, device: torch.device | None) -> None:
        self.device, self.summary, self._process = device, None, None
        self._read_energy: Callable[[], float | None] = lambda: None
        self._energy_start: float | None = None
        self._started = 0.0

    def __enter__(self) -> Sampler:
        if self.device is None or self.device.type != "cuda":
            return self
        uuid = torch.cuda.get_device_properties(self.device).uuid
        self._read_energy = energy_reader(str(uuid))
        self._energy_start, self._started = self._read_energy(), time.monotonic()
        fields = _query_fields()
        if fields is None:
            return self
        command = ["nvidia-smi", "-i", f"GPU-{uuid}", f"--query-gpu=clocks.sm,{','.join(fields)}",
                   "--format=csv,noheader,nounits", "-lms", str(INTERVAL_MS)]  # fmt: skip
        try:
            self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        except OSError:
            self._process = None
        return self

    def __exit__(self, *exc_info) -> None:
        energy_end, window_s = self._read_energy(), time.monotonic() - self._started
        lines: list[str] = []
        if self._process is not None:
            self._process.terminate()
            try:
                out, _ = self._process.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                out, _ = self._process.communicate()
            lines = out.splitlines()
        summary = summarize(lines) or {}
        if self._energy_start is not None and energy_end is not None:
            summary["energy_j"] = energy_end - self._energy_start
            summary["energy_window_s"] = window_s
        self.summary = summary or None


def per_rank(summary: dict | None, group, iterations: int) -> list[dict | None]:
    """Every rank's summary, in rank order (an all_gather: every rank must call it), its energy
    as `joules_per_iter` over the block's `iterations` (an untimed setup's share included)."""
    if summary and "energy_j" in summary:
        summary = dict(summary)
        summary["joules_per_iter"] = summary.pop("energy_j") / iterations
    gathered: list[dict | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, summary, group=group)
    return gathered
