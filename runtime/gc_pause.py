"""The cyclic garbage collector paused while a rank imports and builds its heavy objects.

A rank's start imports torch, the workload's modules (gymnasium, the model) and,
with the first optimizer, torch._dynamo (and triton): millions of new objects, and
the collector walks them again each time an allocation threshold passes, finding
no garbage. Measured (torch + gymnasium + an AdamW, 4 alternating pairs at load ~1):
3.3 s -> 2.6 s median.

Re-enabled as it was, the collector would still walk those objects soon after: about
480,000 of them sit in the youngest generation, and the first collection after the
block (0.15 CPU-s here), then the middle and the oldest generation's (0.17 s each)
walk them all, during the rank's first steps, on every start and restart, beside the
other ranks' starts on the same cores. With ``then_freeze`` (the rank's start:
runtime/entry.py, runtime/executor.py) the survivors are moved to the permanent
generation instead (``gc.freeze``), which no collection walks; reference counting
still frees them as ever. What that costs: a reference cycle made during the start
and dropped later is freed only at exit, not at the next collection.

At exit they are unfrozen (``gc.unfreeze``, an atexit handler) so that the
interpreter's shutdown collects them: left frozen, they outlived it, and triton's
bindings printed pages of "leaked" warnings into every rank's log.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused(then_freeze: bool = False) -> Iterator[None]:
    """No cyclic collection inside the block; nested blocks keep it off until the outermost
    ends. ``then_freeze``: the outermost block's end freezes what exists (module doc)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if then_freeze:
                gc.freeze()
                atexit.unregister(gc.unfreeze)  # registered once, however many starts freeze
                atexit.register(gc.unfreeze)
            gc.enable()
