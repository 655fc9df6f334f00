"""Progress display of `rljob run`: a step bar (reward, weight version, samples/s, engines) and a status line.

On a terminal these are tqdm bars; elsewhere (CI logs, a test's pipe) one plain line per step
and per event, so a log still tells the story.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

from rljob_client.trainer.loop import StepRecord
from tqdm import tqdm

from controller_runtime.api.status import CellState
from controller_runtime.events import ControllerEvent


def engines_text(statuses: list[Any]) -> str:
    """'1/1 serving' or e.g. '0/1 serving (cell-0 Starting)'."""
    serving = sum(1 for s in statuses if s.state is CellState.Serving)
    others = [f"{'-'.join(s.name.rsplit('-', 2)[-2:])} {s.state}" for s in statuses if s.state is not CellState.Serving]
    text = f"{serving}/{len(statuses)} serving"
    return text + (f" ({', '.join(others)})" if others else "")


class Progress:
    def __init__(self, total_steps: int, engines: Callable[[], list[Any]], stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.engines = engines
        self.bar = tqdm(total=total_steps, desc="steps", unit="step", file=self.stream, disable=not self.tty,
                        dynamic_ncols=True, position=0)
        self._last_status = ""
        self.status_bar = tqdm(total=0, bar_format="{desc}", file=self.stream, disable=not self.tty, position=1)

    def write(self, text: str) -> None:
        if self.tty:
            tqdm.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def status(self, text: str) -> None:
        line = f"{text} | engines {engines_text(self.engines())}"
        if self.tty:
            self.status_bar.set_description_str(line)
        elif line != self._last_status:  # a log gets each distinct status once
            print(line, file=self.stream, flush=True)
        self._last_status = line

    def event(self, event: ControllerEvent) -> None:
        self.write(f"[controller] {event}")

    def step(self, r: StepRecord) -> None:
        rate = r.samples / r.step_seconds if r.step_seconds > 0 else 0.0
        fields = {"reward": f"{r.reward_mean:.3f}", "v": r.weight_version, "samples/s": f"{rate:.0f}",
                  "engines": engines_text(self.engines())}
        if self.tty:
            self.bar.set_postfix(fields, refresh=False)
            self.bar.update(1)
        else:
            print(f"step {r.step + 1}/{self.bar.total}: reward {r.reward_mean:.3f} loss {r.loss:+.4f} "
                  f"weights v{r.weight_version} {rate:.0f} samples/s (rollout {r.rollout_seconds:.2f} s, "
                  f"train {r.train_seconds:.2f} s, sync {r.sync_seconds:.2f} s) engines {fields['engines']}",
                  file=self.stream, flush=True)

    def close(self) -> None:
        self.status_bar.close()
        self.bar.close()
