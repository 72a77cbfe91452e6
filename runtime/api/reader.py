"""Read another component's checkpoints as they land: an evaluator beside a trainer.

    run = hetrun.attach()                       # this process's own component (events, stop)
    trainer = run.checkpoints("trainer")        # the trainer's store in the same run directory
    for step in trainer.follow(idle_timeout=600):
        trainer.load(step, {"model": model})    # decoded, verified, copied in; never unpickled
        ...

Only committed checkpoints are seen (a manifest is written after its shards),
so a step being written is never read half-done. The store keeps the newest
``checkpoint.keep`` steps: a reader that falls behind skips the ones already
collected and says so in the step sequence it yields (it is never an error).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hetrun.runtime.plan_view import PLAN_FILE, checkpoint_root, load_plan

from hetrun.backoff import Backoff, poll_until
from hetrun.errors import CheckpointError, RuntimeFailure

FIRST_POLL_S, MOST_POLL_S = 0.1, 1.0


def store_dir(run_dir: Path, component: str) -> Path:
    """The directory of ``component``'s checkpoint store in ``run_dir`` (plan.json's rule)."""
    if (run_dir / PLAN_FILE).is_file():
        return load_plan(run_dir, validate=False).checkpoint_root(run_dir) / component
    return checkpoint_root(run_dir, None) / component


class CheckpointReader:
    """The committed checkpoints of one component, read from rank ``rank``'s shard.

    Steps are what ``run.save(step, ...)`` was given: the last step done. (The store
    labels a checkpoint with the step a restore resumes at, one more.)"""

    def __init__(self, run_dir: str | Path, component: str, *, rank: int = 0) -> None:
        self.run_dir, self.component, self.rank = Path(run_dir), component, rank
        self.directory = store_dir(self.run_dir, component)

    def steps(self) -> list[int]:
        """Committed steps, oldest first (empty before the first lands)."""
        if not self.directory.is_dir():
            return []
        from hetrun.runtime.ckpt import open_store

        return sorted(s - 1 for s in open_store(self.directory).steps())

    def wait_for_step_after(self, after: int | None, timeout: float | None = None) -> int | None:
        """The oldest committed step newer than ``after``; None when none lands within ``timeout`` s."""
        def newer() -> tuple[int] | None:  # a tuple: step 0 is a step, not "not yet"
            found = next((s for s in self.steps() if after is None or s > after), None)
            return None if found is None else (found,)

        got = poll_until(newer, Backoff(FIRST_POLL_S, MOST_POLL_S), timeout=timeout)
        return None if got is None else got[0]

    def follow(self, *, idle_timeout: float | None = None, stop: Callable[[], bool] | None = None,
               after: int | None = None) -> Iterator[int]:
        """Yield each committed step once (newer than ``after``, when given), in order, as it
        lands. Ends when ``stop()`` is true and nothing newer is there; raises RuntimeFailure
        after ``idle_timeout`` s without one."""
        last = after
        idle_since = time.monotonic()
        while True:
            step = self.wait_for_step_after(last, timeout=MOST_POLL_S)
            if step is not None:
                last, idle_since = step, time.monotonic()
                yield step
                continue
            if stop is not None and stop():
                return
            if idle_timeout is not None and time.monotonic() - idle_since > idle_timeout:
                raise RuntimeFailure(
                    f"no new checkpoint of component {self.component!r} in {idle_timeout:.0f} s "
                    f"(newest seen: {last}) in {self.directory}",
                    hint=f"check that {self.component} is running and saving (hetrun status / report)")

    def follow_loaded(self, objs: Any, *, last_step: int | None = None, idle_timeout: float | None = None,
                      stop: Callable[[], bool] | None = None, after: int | None = None) -> Iterator[int]:
        """``follow()``, each step decoded into ``objs`` (as ``load``) before it is yielded;
        ends after ``last_step`` (the trainer's last): the loop of an evaluator beside a trainer."""
        if last_step is not None and after is not None and after >= last_step:
            return
        for step in self.follow(idle_timeout=idle_timeout, stop=stop, after=after):
            self.load(step, objs)
            yield step
            if last_step is not None and step >= last_step:
                return

    def load(self, step: int, objs: Any) -> None:
        """Decode ``step`` into ``objs``: a dict (name -> tensor or object with load_state_dict)
        for what ``run.save`` wrote, where a subset of the saved names is fine (e.g. only the
        model, not the optimizer); or one object with ``load_state_dict`` that takes the whole
        saved state (an action component's checkpoint: its workload's ``state_dict()``)."""
        from hetrun.runtime.api.run import StateObjects
        from hetrun.runtime.ckpt import open_store
        from hetrun.runtime.ckpt.lossy import decode_state

        if not self.directory.is_dir():
            raise CheckpointError(f"component {self.component!r} has no checkpoints in {self.directory}")
        value, _meta, _tier = open_store(self.directory).load_rank(step + 1, self.rank)
        try:
            state = decode_state(value["workload"])
        except (KeyError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {step} of {self.component!r} holds no saved objects ({exc})",
                                  hint="read a component that saves through run.save") from exc
        (StateObjects(objs) if isinstance(objs, dict) else objs).load_state_dict(state)
