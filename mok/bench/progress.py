"""Progress of long command-line work (`mok bench`, `mok tune`): a tqdm bar where tqdm is
installed (the `cli` extra), else one line per finished step, so a run of minutes is never silent.
Only the rank that reports (rank 0) shows it."""

from __future__ import annotations

import sys
import time


class Progress:
    """`with Progress(total, "tune") as bar: ... bar.step("what finished")`."""

    def __init__(self, total: int, label: str, *, enabled: bool = True) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self.done, self.start, self._bar = 0, time.monotonic(), None

    def __enter__(self) -> Progress:
        if self.enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=self.total, desc=self.label, unit="step", file=sys.stderr)
        return self

    def step(self, note: str) -> None:
        """One step finished; `note` says which (and how it went)."""
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(note[:60], refresh=False)
            self._bar.update(1)
            return
        elapsed = time.monotonic() - self.start
        print(f"[{self.label} {self.done}/{self.total}, {elapsed:6.1f} s] {note}", flush=True)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
