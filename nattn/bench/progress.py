"""A progress bar over the problems: tqdm when installed, plain lines otherwise."""

from __future__ import annotations

import sys


class Progress:
    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self._bar = total, 0, None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, unit="problem", file=sys.stderr, leave=False)
            except ImportError:
                self._bar = None

    def step(self, label: str) -> None:
        """Announce the problem about to run."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_description(label)
        else:
            print(f"[{self.done + 1}/{self.total}] {label}", file=sys.stderr, flush=True)

    def advance(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)

    def write(self, text: str) -> None:
        """Print above the bar (so the bar does not garble the table)."""
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
