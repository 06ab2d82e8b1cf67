"""The trainer's schedule: a run every `train_every_rewards` new rewards or every
`train_interval_seconds`, in a background thread (embedded) or the `rofu trainer` process."""

from __future__ import annotations

import logging
import threading
import time

from rofu.service.db import rewards as reward_rows
from rofu.service.db.engine import SessionFactory
from rofu.service.lifecycle.trainer import Trainer, TrainReport

log = logging.getLogger("rofu.trainer")


class TrainerLoop:
    """Runs the trainer every `train_every_rewards` new rewards or `train_interval_seconds`."""

    def __init__(self, trainer: Trainer, sessions: SessionFactory) -> None:
        self._trainer = trainer
        self._sessions = sessions
        self._metrics = trainer._metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_run = float("-inf")
        self._rewards_at_last_run = 0

    def due(self) -> bool:
        """Whether enough rewards arrived or enough time passed since the last run."""
        settings = self._trainer.settings
        if time.monotonic() - self._last_run >= settings.train_interval_seconds:
            return True
        new = reward_rows.count_rewards(self._sessions) - self._rewards_at_last_run
        return new >= settings.train_every_rewards

    def step(self) -> TrainReport | None:
        """Run once if due; failures are logged and counted, never raised."""
        if not self.due():
            return None
        self._rewards_at_last_run = reward_rows.count_rewards(self._sessions)
        self._last_run = time.monotonic()
        try:
            return self._trainer.run_once()
        except Exception:
            log.exception("training run failed")
            if self._metrics is not None:
                self._metrics.trainer_failures.inc()
            return None

    def run_forever(self, poll_s: float = 0.5) -> None:
        """Step until `stop()`."""
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # a database outage while checking: try again later
                log.exception("trainer loop check failed")
            self._stop.wait(poll_s)

    def start(self) -> None:
        """Run in a background thread (the embedded default)."""
        self._thread = threading.Thread(target=self.run_forever, name="rofu-trainer", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the loop to stop after the run in progress (safe from a signal handler)."""
        self._stop.set()

    def stop(self) -> None:
        """Stop the background thread, waiting for a run in progress to finish."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join()
