"""The floors a run's systems are measured against, in the same run: the bf16 dense GEMM rate,
device-to-device copy bandwidth and NVLink peer copy bandwidth (README.md, "Method"). Timed with
the harness's Timer, like every system."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mok.bench.harness import Dist, Timer, seeded_generator


def gemm_tflops(d: Dist, timer: Timer, n: int) -> float:
    """bf16 torch.mm rate on n³ random data, rotating 3 operand sets (3 × 2n² > L2)."""
    g = seeded_generator(d.device, "gemm", d.rank)
    sets = [
        tuple(torch.randn(n, n, generator=g, device=d.device).bfloat16() for _ in range(2))
        for _ in range(3)
    ]
    out = torch.empty(n, n, dtype=torch.bfloat16, device=d.device)

    def run() -> None:
        for a, b in sets:
            torch.mm(a, b, out=out)

    t = timer.measure(run)
    return len(sets) * 2 * n**3 / (t.median_ms * 1e-3) / 1e12


def copy_gbps(d: Dist, timer: Timer, nbytes: int) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=d.device)
    dst = torch.empty_like(src)
    t = timer.measure(lambda: dst.copy_(src))
    return 2 * nbytes / (t.median_ms * 1e-3) / 1e9


def _peer_copies(nbytes: int, both: bool) -> Callable[[], None]:
    """GPU0 -> GPU1 (and GPU1 -> GPU0) with tensor.copy_, ordered after and before the current
    stream of GPU0 so that the timer's events bracket them."""
    devices = (torch.device("cuda", 0), torch.device("cuda", 1))
    src = [torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=dev) for dev in devices]
    dst = [torch.empty(nbytes, dtype=torch.uint8, device=dev) for dev in reversed(devices)]
    # A cross-device copy_ runs on the source device's current stream and fences the
    # destination device's current stream; each direction gets its own pair of streams so the
    # two directions do not serialise on each other's fences.
    streams = [(torch.cuda.Stream(devices[j]), torch.cuda.Stream(devices[1 - j])) for j in (0, 1)]
    directions = (0, 1) if both else (0,)

    def run() -> None:
        main = torch.cuda.current_stream(devices[0])
        for j in directions:
            for s in streams[j]:
                s.wait_stream(main)
            with torch.cuda.stream(streams[j][0]), torch.cuda.stream(streams[j][1]):
                dst[j].copy_(src[j])
        for j in directions:
            for s in streams[j]:
                main.wait_stream(s)

    return run


def nvlink_gbps(d: Dist, timer: Timer, nbytes: int) -> dict | None:
    """Peer copy bandwidth between GPU 0 and GPU 1 (rank 0 copies, the others idle in step);
    None unless this process sees two GPUs."""
    if not d.cuda or torch.cuda.device_count() < 2:
        return None
    result = {"bytes": nbytes, "peer_access": torch.cuda.can_device_access_peer(0, 1)}
    for name, both in (("unidir_GBps", False), ("bidir_GBps", True)):
        run, error = (lambda: None), None
        if d.rank == 0:
            try:  # e.g. an exclusive-process GPU refuses rank 0's context on GPU 1
                run = _peer_copies(nbytes, both)
            except RuntimeError as e:
                error = f"{type(e).__name__}: {e}"
        if timer.agree_max(float(error is not None)):  # every rank skips, or none
            return {**result, "error": error or "failed on rank 0"}
        t = timer.measure(run)
        result[name] = (2 if both else 1) * nbytes / (t.median_ms * 1e-3) / 1e9
        del run
    torch.cuda.empty_cache()
    return result


def measure_floors(d: Dist, timer: Timer, *, gemm_n: int, copy_bytes: int) -> dict:
    floors = {
        "gemm_n": gemm_n,
        "gemm_bf16_tflops": gemm_tflops(d, timer, gemm_n),
        "copy_bytes": copy_bytes,
        "d2d_copy_GBps": copy_gbps(d, timer, copy_bytes),
        "nvlink": nvlink_gbps(d, timer, copy_bytes),
    }
    if d.cuda:
        torch.cuda.empty_cache()
    return floors
