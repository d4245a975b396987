"""Run a function on N gloo ranks, one spawned worker process per rank (the CPU tier's EP).

`run_on_ranks(fn, world_size, *args)` starts one process per rank, joins them in a gloo group over
TCP on a free local port, calls `fn(rank, world_size, *args)` in each and returns the results in
rank order. `fn` must be importable by module and name (spawn pickles it by reference).

Results come back as pickle files (CPU tensors and plain values), not through a multiprocessing
queue: torch sends tensors through a queue as shared-memory handles that die with the worker, and
a full queue deadlocks a join. A worker's exception comes back as its formatted traceback and is
raised here as RankError. The run is bounded by a wall-clock timeout and every collective by the
gloo timeout, so a rank stuck waiting for a failed peer ends the run instead of hanging the suite.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

# How long the surviving ranks may keep running after one rank failed: long enough to report
# their own error (usually the same one), short enough not to wait for the collective timeout.
_GRACE_AFTER_FAILURE_S = 5.0
_POLL_S = 0.05


class RankError(RuntimeError):
    """One or more ranks raised, died or timed out; the message holds every rank's story."""


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_result(directory: Path, rank: int, payload: Any, suffix: str) -> None:
    """Write `rank`.ok (the result) or `rank`.error (a traceback) atomically, so the parent
    never reads half a file."""
    try:
        data = pickle.dumps(payload)
    except Exception:  # an unpicklable result is the worker's bug: report it as one
        data, suffix = pickle.dumps(traceback.format_exc()), "error"
    partial = directory / f"{rank}.partial"
    partial.write_bytes(data)
    os.replace(partial, directory / f"{rank}.{suffix}")


def _worker(fn, rank, world_size, port, directory, args, collective_timeout_s) -> None:
    try:
        import torch
        import torch.distributed as dist

        # Ranks share the machine's cores; one thread each avoids oversubscription.
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=collective_timeout_s),
        )
        try:
            result = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
    except BaseException:
        _write_result(Path(directory), rank, traceback.format_exc(), "error")
        # Skip a clean exit's atexit hooks: a peer may still hold the dead group open.
        os._exit(1)
    _write_result(Path(directory), rank, result, "ok")


def _failed(directory: Path, processes) -> bool:
    reported = any((directory / f"{rank}.error").exists() for rank in range(len(processes)))
    died = any(p.exitcode not in (None, 0) for p in processes)
    return reported or died


def _wait(processes, directory: Path, timeout_s: float) -> bool:
    """Wait for every rank; returns False when the deadline passed with ranks still running."""
    deadline = time.monotonic() + timeout_s
    while any(p.is_alive() for p in processes):
        now = time.monotonic()
        if now >= deadline:
            return False
        if _failed(directory, processes):
            deadline = min(deadline, now + _GRACE_AFTER_FAILURE_S)
        time.sleep(_POLL_S)
    return True


def _stop(processes) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()


def _collect(directory: Path, processes, finished: bool, timeout_s: float) -> list[Any]:
    results, problems = [], []
    for rank, process in enumerate(processes):
        ok, error = directory / f"{rank}.ok", directory / f"{rank}.error"
        if ok.exists():
            results.append(pickle.loads(ok.read_bytes()))
        elif error.exists():
            problems.append(f"rank {rank} raised:\n{pickle.loads(error.read_bytes())}")
        elif not finished:
            problems.append(f"rank {rank} was still running after {timeout_s:.0f} s (stopped)")
        else:
            problems.append(f"rank {rank} exited with code {process.exitcode} and no result")
    if problems:
        raise RankError(f"{len(problems)} of {len(processes)} ranks failed\n" + "\n".join(problems))
    return results


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 300.0,
    collective_timeout_s: float = 120.0,
) -> list[Any]:
    """`[fn(rank, world_size, *args) for every rank]`, each rank in its own gloo process."""
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="mok-ranks-") as tmp:
        directory = Path(tmp)
        port = free_port()
        processes = [
            context.Process(
                target=_worker,
                args=(fn, rank, world_size, port, tmp, args, collective_timeout_s),
                name=f"mok-rank-{rank}",
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        try:
            finished = _wait(processes, directory, timeout_s)
        finally:
            _stop(processes)
        return _collect(directory, processes, finished, timeout_s)
