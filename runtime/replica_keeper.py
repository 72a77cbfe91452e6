"""The replica keeper: a process of its own beside each rank that moves the rank's memory-tier
replicas. It sends the rank's blobs, read from the rank's slots on this node's tmpfs, to the
rank's partners, and copies the replicas its sources send into this node's slots
(runtime/ckpt/memory_slots.py). The rank's part of a snapshot is its encode, the copy into its
own slot and a 17-byte frame to its keeper.

Why a process: with the tier's writes in mapped slots, what the tier still cost the PPO
example's whole iteration inside one run came from the replica streams (1.06-1.07 with them,
0.98 without: benchmarks/node_death.md, session 43): two threads in the rank's process that
woke at every snapshot and took the GIL from the training thread for their Python between
system calls. Here they take a core's time only, and only where the node has one to give; the
keeper's own Python has a GIL of its own.

The rank's end is ``Keeper``; the keeper's is ``main`` (``python -m
hetrun.runtime.replica_keeper FD``, FD its end of a Unix socket pair). Frames both ways: a u32
length and a payload, ``J`` + JSON (bind, the one allgather its streams' set-up needs, drain,
their answers) or ``S`` + the step (u64) and slot (u32) of a blob the rank has put in its slot.
The keeper's counters (its CPU seconds, the replicas it skipped and failed to copy, the first
error) are in a small file beside the slots that both map (``_Stats``): the rank reads them at
its snapshots without a round trip. The keeper ends when the rank's end closes (the rank done,
or dead: then at once, its streams closed, which its partners see), or at the latest
``ORPHAN_CHECK_S`` after its parent is gone (a process the rank forked may hold the socket's
end open). Not ``PR_SET_PDEATHSIG``: it fires when the *thread* that started the keeper ends,
which need not be the rank's end.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_LEN = struct.Struct("<I")
_SNAP = struct.Struct("<QI")  # step, slot
# CPU seconds, replicas skipped, replica copies failed, the lengths of the streams' first error
# and of the first failed copy's, whose texts follow (_ERR_MAX bytes each at most)
_STATS = struct.Struct("<dqqII")
_ERR_MAX = 240
STATS_BYTES = 512
START_TIMEOUT_S = 60.0  # the keeper's start and its first answer (an interpreter, no torch)
SETUP_TIMEOUT_S = 180.0  # its streams' set-up (replica_sockets.CONNECT_TIMEOUT_S and margin)
EXIT_TIMEOUT_S = 5.0
ORPHAN_CHECK_S = 1.0
KEEPER_NICE = 10  # _yield_to_the_rank


def _send(sock: socket.socket, kind: bytes, payload: bytes) -> None:
    sock.sendall(_LEN.pack(1 + len(payload)) + kind + payload)


def _send_json(sock: socket.socket, doc: dict[str, Any]) -> None:
    _send(sock, b"J", json.dumps(doc).encode())


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def _read_frame(f: Any) -> tuple[bytes, bytes] | None:
    """``_recv`` from a buffered reader of the socket (the keeper's end)."""
    head = f.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    n = _LEN.unpack(head)[0]
    body = f.read(n)
    return None if len(body) < n else (body[:1], body[1:])


def _recv(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """(kind, payload) of the next frame; None at the end of the stream."""
    head = _recv_exact(sock, _LEN.size)
    if head is None:
        return None
    body = _recv_exact(sock, _LEN.unpack(head)[0])
    return None if body is None else (body[:1], body[1:])


class _Stats:
    """The keeper's counters in a file both processes map (written by the keeper only)."""

    def __init__(self, path: Path, create: bool) -> None:
        fd = os.open(path, (os.O_RDWR | os.O_CREAT) if create else os.O_RDONLY, 0o644)
        try:
            if create:
                os.ftruncate(fd, STATS_BYTES)
            self.map = mmap.mmap(fd, STATS_BYTES, access=mmap.ACCESS_WRITE if create else mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self.skipped = self.failed = 0
        self.error = ""  # the streams' (replication stopped)
        self.copy_error = ""  # a received replica's copy that failed (replication goes on)
        self._lock = threading.Lock()  # the main and the receiving thread both put

    def put(self) -> None:
        with self._lock:
            err, copy = self.error.encode()[:_ERR_MAX], self.copy_error.encode()[:_ERR_MAX]
            at = _STATS.size
            self.map[at:at + len(err)] = err  # (each text is set once: its bytes before its length)
            self.map[at + _ERR_MAX:at + _ERR_MAX + len(copy)] = copy
            _STATS.pack_into(self.map, 0, time.process_time(), self.skipped, self.failed, len(err), len(copy))

    def keep(self) -> None:
        """The counters as they are now, kept in memory (the file is about to go)."""
        if not isinstance(self.map, bytes):
            frozen = bytes(self.map)
            self.map.close()
            self.map = frozen  # type: ignore[assignment]

    def get(self) -> tuple[float, int, int, str, str]:
        cpu, skipped, failed, n, m = _STATS.unpack_from(self.map, 0)
        at = _STATS.size
        return (cpu, skipped, failed, bytes(self.map[at:at + n]).decode(errors="replace"),
                bytes(self.map[at + _ERR_MAX:at + _ERR_MAX + m]).decode(errors="replace"))


class Keeper:
    """The rank's end: starts the keeper (at once, not waiting for it), ``ready`` sets up its
    streams (collective: every rank at the same point, ``allgather`` the transport's), then
    ``send`` a blob the rank put in its slot, ``drain``, ``close``. ``ready`` raises
    ConnectionError when the keeper cannot start or set up.

    Why apart: a new interpreter takes ~0.1-0.25 s to start on a loaded node; waited for at the
    tier's start it delayed a restarted job's restore by that much (benchmarks/node_death.md,
    session 43). The restore needs no keeper (it reads the slots), so the ranks meet for the
    streams at their first snapshot, the keeper long up by then."""

    def __init__(self, rank: int, sources: list[int], dests: list[int], tier_dir: Path, keep: int) -> None:
        self.rank = rank
        self._bound = False
        tier_dir.mkdir(parents=True, exist_ok=True)
        self._stats_path = tier_dir / f"keeper-{rank:06d}.stats"
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._ctrl = mine
        self._error: BaseException | None = None
        self._closed = False
        self._stats: _Stats | None = None
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "hetrun.runtime.replica_keeper", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        _send_json(mine, {"op": "bind", "rank": rank, "sources": sources, "dests": dests,
                          "dir": str(tier_dir), "keep": keep, "stats": str(self._stats_path)})

    def ready(self, allgather: Callable[[Any], list[Any]]) -> None:
        """Collective, once (later calls return at once): the keeper's streams set up."""
        if self._bound:
            return
        self._bound = True
        # Its streams' set-up asks for one allgather (their addresses). A keeper that fails first
        # still gets this rank's part in it: the other ranks' keepers wait in the same allgather.
        msg = self._answer(START_TIMEOUT_S)
        if msg.get("op") == "allgather":
            got = allgather(msg["value"])
            _send_json(self._ctrl, {"op": "allgathered", "value": got})
            msg = self._answer(SETUP_TIMEOUT_S)
        else:
            allgather(None)
        if msg.get("op") != "bound":
            self._closed = True
            self._ctrl.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(EXIT_TIMEOUT_S)
            raise ConnectionError(f"rank {self.rank}'s replica keeper: {msg.get('error') or msg}")
        self._stats = _Stats(self._stats_path, create=False)

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        self._ctrl.settimeout(timeout_s)
        try:
            got = _recv(self._ctrl)
        except OSError as exc:
            return {"op": "failed", "error": f"no answer in {timeout_s:g} s ({exc})"}
        finally:
            self._ctrl.settimeout(None)
        if got is None:
            return {"op": "failed", "error": f"it ended (exit status {self._proc.poll()})"}
        return json.loads(got[1])

    @property
    def error(self) -> BaseException | None:
        if self._error is None and self._stats is not None and (text := self._stats.get()[3]):
            self._error = ConnectionError(text)
        return self._error

    @property
    def cpu_s(self) -> float:
        return self._stats.get()[0] if self._stats is not None else 0.0

    @property
    def skipped(self) -> int:
        return self._stats.get()[1] if self._stats is not None else 0

    @property
    def failed(self) -> int:
        """Received replicas the keeper could not copy into this node's slots."""
        return self._stats.get()[2] if self._stats is not None else 0

    @property
    def copy_error(self) -> str:
        """Why the first of them failed ("" when none did)."""
        return self._stats.get()[4] if self._stats is not None else ""

    def send(self, step: int, slot: int) -> None:
        """The rank's blob of ``step`` is in its slot ``slot``: to the partners. Never waits for
        them (a frame of 17 bytes; a keeper gone sets ``error``)."""
        if self._error is not None or self._closed or self._stats is None:
            return
        try:
            _send(self._ctrl, b"S", _SNAP.pack(int(step), int(slot)))
        except OSError as exc:
            self._error = ConnectionError(f"rank {self.rank}'s replica keeper is gone ({exc})")

    def drain(self, timeout_s: float) -> None:
        """Collective, as ``ReplicaSockets.drain``: every blob sent so far is on the partners'
        nodes and every replica the sources sent before their drain is in this node's slots."""
        if self._error is not None or self._closed or self._stats is None:
            return
        try:
            _send_json(self._ctrl, {"op": "drain", "timeout": timeout_s})
        except OSError as exc:
            self._error = ConnectionError(f"rank {self.rank}'s replica keeper is gone ({exc})")
            return
        msg = self._answer(timeout_s + START_TIMEOUT_S)
        if msg.get("op") != "drained":
            self._error = ConnectionError(f"rank {self.rank}'s replica keeper: {msg.get('error') or msg}")

    def close(self) -> None:
        """The keeper ends (its streams closed); waits for it briefly, then kills it. Its last
        counters stay readable (``cpu_s``, ``skipped``, ``failed``, ``error``); ``send`` does nothing."""
        self._error = self._error or self.error  # read before the counters' file goes
        self._closed = True
        with contextlib.suppress(OSError):
            self._ctrl.close()
        try:
            self._proc.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._stats is not None:
            self._stats.keep()
        with contextlib.suppress(OSError):
            self._stats_path.unlink()


def _end_with_parent() -> None:
    """A thread that ends this process once its parent (the rank) is gone: a rank killed leaves
    no keeper holding its partners' streams, even where a child of the rank keeps the socket's
    end open."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="hetrun-keeper-orphan", daemon=True).start()


def _yield_to_the_rank() -> None:
    """``SCHED_BATCH`` at nice ``KEEPER_NICE``, before any thread starts (both are per thread on
    Linux, and inherited): the rank's frame wakes this process at every snapshot, and a woken
    process at the rank's own priority preempted the rank's training thread on its core to read
    and send the blob (the snapshot's "send" phase 0.12-0.40 ms where the frame's write is a few
    microseconds: benchmarks/node_death.md, session 43). A batch process never preempts at its
    wake-up; at nice 10 it still gets a tenth of a core the rank keeps busy (its work is ~2 %:
    ~0.5 ms a PPO iteration), and any core idle at once."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.nice(KEEPER_NICE)


def main(fd: int) -> int:
    _yield_to_the_rank()
    _end_with_parent()
    ctrl = socket.socket(fileno=fd)
    frames = ctrl.makefile("rb")  # buffered: the frames that queued up, in one system call
    got = _read_frame(frames)
    if got is None:
        return 0
    bind = json.loads(got[1])

    from hetrun.runtime.ckpt.memory_slots import MemoryTier, peek
    from hetrun.runtime.replica_sockets import ReplicaSockets

    from hetrun.errors import CheckpointError

    tier = MemoryTier.at(bind["dir"], int(bind["keep"]))
    stats = _Stats(Path(bind["stats"]), create=True)
    stats.put()
    rank = int(bind["rank"])

    def deliver(view: memoryview) -> None:
        """A source's replica, copied into this node's slot for its owner and step."""
        try:
            owner, step = peek(view, "received replica")
            tier.write(owner, step, view)
        except (CheckpointError, OSError) as exc:
            stats.failed += 1
            stats.copy_error = stats.copy_error or f"a received replica not kept here: {exc}"
        stats.put()

    def allgather(value: Any) -> list[Any]:
        _send_json(ctrl, {"op": "allgather", "value": value})
        answer = _read_frame(frames)
        if answer is None:
            raise ConnectionError("the rank ended during the replica streams' set-up")
        return json.loads(answer[1])["value"]

    try:
        streams = ReplicaSockets(rank, allgather, [int(r) for r in bind["sources"]],
                                 [int(r) for r in bind["dests"]], deliver)
    except Exception as exc:  # said to the rank, which raises it
        with contextlib.suppress(OSError):
            _send_json(ctrl, {"op": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    _send_json(ctrl, {"op": "bound"})
    behind = 0  # the rank's blobs written over in their slot before this keeper read them
    try:
        while (got := _read_frame(frames)) is not None:
            kind, payload = got
            drain = None
            if kind == b"S":
                step, slot = _SNAP.unpack(payload)
                blob = tier.read_slot(rank, slot, step)
                if blob is None:  # written over before this keeper came to it: behind
                    behind += 1
                else:
                    streams.send(blob)
            elif (drain := json.loads(payload)).get("op") == "drain":
                streams.drain(float(drain["timeout"]))
            # The counters before the drain's answer: once it has it, a partner's rank may end
            # and close its stream, which is no failure of this run's replication.
            if streams.error is not None and not stats.error:
                stats.error = str(streams.error)
            stats.skipped = behind + streams.skipped
            stats.put()
            if drain is not None and drain.get("op") == "drain":
                _send_json(ctrl, {"op": "drained"})
    except OSError:
        pass  # the rank's end gone
    finally:
        streams.close()
        tier.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
