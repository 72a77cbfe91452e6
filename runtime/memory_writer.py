"""A rank's memory-tier blobs written into this node's tmpfs on a thread of their own: its own
blobs, every one when the rank has a partner (its replica leaves at once; its own copy is written
in the step's gap, ``not_before``), else from ``memory_tier.WRITE_ON_THREAD_FROM`` bytes (smaller
ones are written on the training thread); and the replicas its partners send it, handed over by
the replica streams' receiving thread and written in the step's gap too (``replica=True``).

Why: a snapshot every iteration put the rank's own blob's tmpfs write on the training thread (PPO
learner: 0.16-0.24 ms of an iteration that is ~45 ms; the MoE LM: 1.2-2.4 ms,
benchmarks/node_death.md). A write is a few system calls, and Python releases the GIL around each,
so on a thread they run beside the training thread's compute instead of in front of it (on a
core the rank does not use: a learner's node has cores its ranks leave idle; each emulated node
here is a process on a 2-core machine, no task binding). The bytes are immutable once handed
over (a blob is a fresh ``bytearray`` per snapshot).

Why ``not_before``: written at once, a small blob's write on this thread cost the DDP command
example more than on the training thread (the thread's wake-up and its GIL hand-backs land in the
middle of the snapshot's own Python: session 28); written half an iteration later it lands in the
step's gap (the example's compute, a GPU's kernels, a collective's wait: the GIL free), and the
training thread pays one hand-over. The own copy then lags the snapshot by at most
``memory_tier.DEFER_MAX_S``; the replica, sent at once, covers a death in that window, and a
survivor is ended well after it (benchmarks/node_death.md, session 39). A received replica's write
was the same system calls and Python on the receiving thread the moment it arrived, which is when
the receiver starts its next step (the ranks snapshot the same step): deferred the same way
(session 40); the owner's death in that window ends this survivor far later than the write.

Order and atomicity are ``MemoryTier.write``'s: one thread writes the rank's blobs, in the order
handed over, so its steps land oldest first and its ``keep`` newest are kept as before. A blob is held by
this node once its write is done (``flush`` waits for that, and starts deferred writes at once: the
restore, the close, exit).

A write of the rank's own blob that fails (the tmpfs full, its directory unwritable) is raised on
the training thread at the next ``submit`` or ``flush``: the rank fails as it did when the write
ran there, one snapshot later, with the same exception. A replica's write that fails is not the
rank's failure (its owner and the store hold the step; the restore verifies what this node
holds): counted (``replica_failures``), the first kept (``replica_error``) for the
``memory_tier`` event, as when it failed on the receiving thread and stopped its stream.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections import deque
from typing import Any

from .ckpt import memory

EXIT_FLUSH_S = 5.0  # at interpreter exit: the writes still queued, at most this long
# Writes waiting at most: behind a slow tmpfs or on a starved node the oldest waiting write is
# dropped for a new one (counted in ``dropped``) rather than holding ever more blobs. A dropped
# step is not held here; the restore takes a step every rank holds.
MAX_QUEUED = 8  # per owner whose blobs this node writes (the rank and its sources: ``TierWriter(owners=)``)


class TierWriter:
    """One rank's writer thread for its node's ``memory.MemoryTier`` (started at the first write)."""

    def __init__(self, tier: memory.MemoryTier, owners: int = 1) -> None:
        self.tier = tier
        self.max_queued = MAX_QUEUED * max(1, owners)
        self._queue: deque[tuple[int, int, Any, float, bool]] = deque()
        self._cv = threading.Condition()
        self._busy = False  # a write taken off the queue and not done
        self._hurry = 0  # flushes waiting: deferred writes start at once
        self._closed = False
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.cpu_s = 0.0  # the thread's CPU seconds in writes: the tier's cost off the training thread
        self.written = 0
        self.dropped = 0
        self.replica_failures = 0
        self.replica_error: BaseException | None = None

    def submit(self, owner: int, step: int, blob: Any, not_before: float = 0.0, *, replica: bool = False) -> None:
        """Queue ``blob`` as ``owner``'s snapshot of ``step``; returns at once. Raises the error
        of an earlier write of the rank's own that failed (not for ``replica``: the receiving
        thread leaves it to the training thread). ``not_before``: a ``time.perf_counter()`` the
        write waits for (the step's gap; a flush does not wait for it)."""
        if not replica:
            self._raise()
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hetrun-memory-writer", daemon=True)
                self._thread.start()
                atexit.register(self._at_exit)
            if len(self._queue) >= self.max_queued:
                self._queue.popleft()
                self.dropped += 1
            idle = not self._queue and not self._busy
            self._queue.append((owner, step, blob, not_before, replica))
            if idle:
                # Woken only from its untimed wait: a thread waiting for an earlier blob's time, or
                # writing, comes to this one after it (a wake-up costs the training thread a GIL
                # hand-back, at every snapshot).
                self._cv.notify()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done (False: ``timeout`` passed first); raises the
        error of a write that failed."""
        with self._cv:
            self._hurry += 1
            self._cv.notify_all()
            try:
                done = self._cv.wait_for(lambda: not self._queue and not self._busy, timeout)
            finally:
                self._hurry -= 1
        self._raise()
        return done

    def close(self) -> None:
        """Every queued write done, then the thread ends (a later ``submit`` starts another)."""
        try:
            self.flush()
        finally:
            with self._cv:
                self._closed = True
                self._cv.notify_all()
            if self._thread is not None:
                self._thread.join()
                atexit.unregister(self._at_exit)
            self._thread, self._closed = None, False

    def _raise(self) -> None:
        err, self._error = self._error, None
        if err is not None:
            raise err

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                # The head's time (a drop may replace the head meanwhile: looked at again)
                while self._queue and not (self._hurry or self._closed):
                    left = self._queue[0][3] - time.perf_counter()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                if not self._queue:
                    continue
                owner, step, blob, _, replica = self._queue.popleft()
                self._busy = True
            try:
                self._write(owner, step, blob, replica)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _write(self, owner: int, step: int, blob: Any, replica: bool, count: bool = True) -> None:
        """One write, its CPU counted (``count``); a failure kept as ``_run`` and ``write_now`` say."""
        c0 = time.thread_time()
        try:
            self.tier.write(owner, step, blob)
            self.written += 1
        except BaseException as exc:
            if replica:  # not this rank's failure: said in the memory_tier event
                self.replica_failures += 1
                self.replica_error = self.replica_error or exc
            elif self._error is None:  # handed to the training thread, raised there
                self._error = exc
        finally:
            if count:
                self.cpu_s += time.thread_time() - c0

    def write_now(self, owner: int, step: int, blob: Any, *, replica: bool = False) -> None:
        """Write ``blob`` on the calling thread (``HETRUN_MEMORY_WRITES=inline``: no writer thread);
        the rank's own write's failure raised here, a replica's counted as the thread counts it.
        One thread per owner: the training thread its own, the receiving thread the replicas. Its
        CPU is not ``cpu_s``: the calling thread counts it (the snapshot's time, the streams' CPU)."""
        if not replica:
            self._raise()
        self._write(owner, step, blob, replica, count=False)
        if not replica:
            self._raise()

    def _at_exit(self) -> None:
        """A rank that ends (a failure raised, the run over) leaves its queued snapshots written:
        the daemon thread would be stopped with them."""
        with contextlib.suppress(BaseException):  # a failed write at exit: that step is not held here
            self.flush(EXIT_FLUSH_S)
