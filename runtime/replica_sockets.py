"""Replica streams for the gloo memory transport: one TCP connection per (rank, partner) pair.

Why not gloo: a replica moved by ``dist.isend``/``dist.recv`` on a thread of the tier's own cost
the DDP command example +5 % per step at one snapshot a step (43 KB blobs, a 54 ms step;
benchmarks/node_death.md), about 2.9 ms a step where the tier's own code took 1.0 ms: the
torch wrappers around every send and receive, the gloo group's event-loop thread (0.5 ms of
CPU a round, not counted anywhere) and a thread that holds the GIL between them. Plain sockets
on two threads of their own (one sends, one receives) spend their time in ``sendall`` and
``recv_into``, which release the GIL, and their CPU time is all counted (``thread_cpu_s``).

Set-up is collective (every rank at the same point, through the transport's ``allgather``):
each rank listens, the ranks exchange their addresses and rank 0's random token, each rank
connects to its partners (trying their addresses in turn) and accepts exactly its sources; a
connection that does not open with the token and an expected rank is closed unread, one that
does is acknowledged, and the listener is closed once the sources are in. A frame is a little-endian u64 length and
the blob; ``FLUSH`` instead of a length marks a drain (everything before it has been sent), so
a drain waits for one mark from every source and the streams stay open for the next snapshots.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

_LEN = struct.Struct("<Q")
FLUSH = (1 << 64) - 1
_HELLO = struct.Struct("<32sI")  # rank 0's token (hex), the connecting rank
_ACK = b"\x01"  # the listener took the connection as one of its sources
MAX_WAITING = 3  # blobs queued and not yet on the wire (memory held for a slow partner)
_WAITALL = getattr(socket, "MSG_WAITALL", 0)
CONNECT_TIMEOUT_S = 120.0  # set-up only: a partner slower to reach the tier than this is gone


def local_hosts() -> list[str]:
    """Addresses peers may reach this rank at, most likely first: the one it reaches the job's
    rendezvous (``MASTER_ADDR``) from (a UDP "connect" sends nothing; it only picks the route),
    then the host's routable address. Loopback last: right only when the partner shares the host,
    and a wrong guess is refused by the token check below, then the next address is tried."""
    found: list[str] = []
    master = os.environ.get("MASTER_ADDR")
    if master:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master, 9))
            found.append(probe.getsockname()[0])
    # The executor's ranks have no MASTER_ADDR: the address its own rendezvous uses across hosts
    # (world.routable_address: not Debian's 127.0.1.1 alias for the host name).
    from .world import routable_address

    found.append(routable_address())  # (it resolves the host name itself: a non-loopback address first)
    found.append("127.0.0.1")
    unique = list(dict.fromkeys(found))
    return [h for h in unique if not h.startswith("127.")] + [h for h in unique if h.startswith("127.")]


def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    """Fill ``view`` from ``sock``; False at end of stream (the peer is gone). ``MSG_WAITALL``: a
    43 KB blob in one system call (and one wait for the GIL after it), not one per segment
    that has arrived; short only at the stream's end, a signal, or on a socket with a timeout
    (set-up), where the loop goes on."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], 0, _WAITALL)
        if n == 0:
            return False
        got += n
    return True


def _send_frame(sock: socket.socket, head: bytes, blob: Any) -> None:
    """``head`` and ``blob`` in one system call (``sendmsg``), the rest if it stopped short: two
    ``sendall`` calls cost a second system call and, with TCP_NODELAY, a second segment that woke the
    partner's receiving thread for the 8 bytes alone, at every snapshot."""
    sent = sock.sendmsg([head, blob])
    if sent < len(head):
        sock.sendall(head[sent:])
        sent = len(head)
    if sent - len(head) < len(blob):
        sock.sendall(memoryview(blob)[sent - len(head):])


class ReplicaSockets:
    """This rank's replica connections: ``send`` queues a blob for every partner; every blob a
    source sends is handed to ``deliver`` on the receiving thread, as a view of a buffer the next
    blob from that source reuses (``deliver`` copies what it keeps). ``error`` says why replication
    stopped (a partner gone); nothing is retried half-way."""

    def __init__(self, rank: int, allgather: Callable[[Any], list[Any]], sources: list[int],
                 dests: list[int], deliver: Callable[[Any], None]) -> None:
        self.rank, self.sources, self.dests = rank, sorted(sources), sorted(dests)
        self._deliver = deliver
        self.error: BaseException | None = None
        self._cpu = 0.0
        self._cpu_lock = threading.Lock()
        # Drains: marks sent by this rank's sender, received from each source (under _marks).
        self._marks = threading.Condition()
        self._sent_marks = 0
        self._got_marks = dict.fromkeys(self.sources, 0)
        # Listen on every interface (which one a partner reaches is not known here), accept and
        # acknowledge the sources on a thread while this rank connects to its partners (each
        # waits for the other's acknowledgement), then stop listening.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind(("", 0))
            listener.listen(max(1, len(self.sources)) + 8)
            peers = allgather({"hosts": local_hosts(), "port": listener.getsockname()[1],
                               "token": secrets.token_hex(16)})
            token = str(peers[0]["token"]).encode()
            accepted: dict[str, Any] = {}

            def accept() -> None:
                try:
                    accepted["in"] = self._accept(listener, token)
                except OSError as exc:
                    accepted["error"] = exc
            acceptor = threading.Thread(target=accept, name="hetrun-replicas-accept", daemon=True)
            acceptor.start()
            self._out = [self._connect(peers[d], token) for d in self.dests]
            acceptor.join()
            if "error" in accepted:
                raise accepted["error"]
            self._in = accepted["in"]
        finally:
            listener.close()
        # Blobs (and drain marks, None) waiting for the sender. At most MAX_WAITING blobs wait
        # (besides the one on the wire): a partner slower than the snapshots (a slow link, a hung
        # peer) never makes this rank hold more; the oldest waiting one is dropped for a new
        # one and counted in ``skipped`` (the restore picks a step every rank holds either way).
        self._pending: collections.deque[Any] = collections.deque()
        self._ready = threading.Condition()
        self.skipped = 0
        self._sender = threading.Thread(target=self._send_loop, name="hetrun-replicas-send", daemon=True)
        self._receiver = threading.Thread(target=self._recv_loop, name="hetrun-replicas-recv", daemon=True)
        self._sender.start()
        self._receiver.start()

    @property
    def thread_cpu_s(self) -> float:
        with self._cpu_lock:
            return self._cpu

    def _count(self, t0: float) -> None:
        with self._cpu_lock:
            self._cpu += time.thread_time() - t0

    def _connect(self, peer: dict[str, Any], token: bytes) -> socket.socket:
        """A stream to ``peer``: the first of its addresses that answers and acknowledges this
        rank's token (a listener of another job, met at a wrong address, closes instead)."""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        tried: list[str] = []
        while True:
            for host in peer["hosts"]:
                left = deadline - time.monotonic()
                sock = None
                try:
                    sock = socket.create_connection((str(host), int(peer["port"])), timeout=max(0.1, min(5.0, left)))
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sock.sendall(_HELLO.pack(token, self.rank))
                    sock.settimeout(max(0.1, min(30.0, left)))
                    if sock.recv(1) == _ACK:
                        sock.settimeout(None)
                        return sock
                    tried.append(f"{host}: refused the token")
                except OSError as exc:
                    tried.append(f"{host}: {exc}")
                if sock is not None:
                    sock.close()
            if time.monotonic() > deadline:
                raise ConnectionError(f"rank {self.rank} reached no address of its partner's replica "
                                      f"stream ({'; '.join(tried[-4:])})")
            time.sleep(0.2)

    def _accept(self, listener: socket.socket, token: bytes) -> dict[int, socket.socket]:
        got: dict[int, socket.socket] = {}
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while len(got) < len(self.sources):
            listener.settimeout(max(0.1, deadline - time.monotonic()))
            conn, _ = listener.accept()  # socket.timeout past the deadline: the set-up fails
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            hello = bytearray(_HELLO.size)
            try:
                ok = _recv_exact(conn, memoryview(hello))
            except OSError:
                ok = False
            their_token, src = _HELLO.unpack(hello) if ok else (b"", -1)
            if not ok or their_token != token or src not in self.sources or src in got:
                conn.close()  # not one of this job's ranks, or not one that sends here
                continue
            conn.sendall(_ACK)
            conn.settimeout(None)
            got[src] = conn
        return got

    def send(self, blob: Any) -> None:
        if self.error is not None:
            return
        with self._ready:
            waiting = 0
            for item in reversed(self._pending):  # the blobs queued since the last drain mark
                if item is None:
                    break
                waiting += 1
            if waiting >= MAX_WAITING:
                del self._pending[len(self._pending) - waiting]
                self.skipped += 1
            self._pending.append(blob)
            self._ready.notify()

    def _next(self) -> Any:
        with self._ready:
            while not self._pending:
                self._ready.wait()
            return self._pending.popleft()

    def _send_loop(self) -> None:
        while True:
            blob = self._next()
            t0 = time.thread_time()
            try:
                for sock in self._out:
                    if blob is None:
                        sock.sendall(_LEN.pack(FLUSH))
                    else:
                        _send_frame(sock, _LEN.pack(len(blob)), blob)
            except OSError as exc:
                self._stop(exc)
                return
            finally:
                self._count(t0)
            if blob is None:
                with self._marks:
                    self._sent_marks += 1
                    self._marks.notify_all()

    def _recv_loop(self) -> None:
        if not self._in:
            return
        head = bytearray(_LEN.size)
        self._bufs: dict[int, bytearray] = {}  # per source, reused: ``deliver`` copies what it keeps
        try:
            if len(self._in) == 1:
                # One source (one replica a rank, the default): block in its socket's recv, no
                # selector (its Python and one more GIL wait per blob, on a busy rank's step).
                ((src, sock),) = self._in.items()
                while True:
                    self._recv_frame(src, sock, head)
            sel = selectors.DefaultSelector()
            try:
                for src, sock in self._in.items():
                    sel.register(sock, selectors.EVENT_READ, src)
                while True:
                    for key, _ in sel.select():
                        self._recv_frame(key.data, key.fileobj, head)
            finally:
                sel.close()
        except (OSError, ValueError) as exc:  # ConnectionError included: a source gone; ValueError: closed here
            self._stop(exc)

    def _recv_frame(self, src: int, sock: Any, head: bytearray) -> None:
        """One frame from ``src``: a blob delivered, or a drain mark counted. Its CPU is counted
        (a blocking wait for it is not CPU)."""
        t0 = time.thread_time()
        try:
            if not _recv_exact(sock, memoryview(head)):
                raise ConnectionError(f"rank {src} closed its replica stream")
            (n,) = _LEN.unpack(head)
            if n == FLUSH:
                with self._marks:
                    self._got_marks[src] += 1
                    self._marks.notify_all()
                return
            buf = self._bufs.get(src)
            if buf is None or len(buf) < n:
                buf = self._bufs[src] = bytearray(n)  # a source's blobs keep about their size
            view = memoryview(buf)[:n]
            if not _recv_exact(sock, view):
                raise ConnectionError(f"rank {src} closed its replica stream mid-blob")
            self._deliver(view)
        finally:
            self._count(t0)

    def _stop(self, exc: BaseException) -> None:
        with self._marks:
            self.error = self.error or exc
            self._marks.notify_all()

    def drain(self, timeout_s: float) -> None:
        """Every blob queued so far sent, and every blob each source queued before its matching
        drain received and delivered (drains are collective: the n-th here meets each source's
        n-th). Raises nothing: a partner gone or too slow sets ``error``."""
        with self._marks:
            want = self._sent_marks + 1
        with self._ready:
            self._pending.append(None)
            self._ready.notify()
        deadline = time.monotonic() + timeout_s
        with self._marks:
            while self.error is None and not (self._sent_marks >= want
                                              and all(n >= want for n in self._got_marks.values())):
                left = deadline - time.monotonic()
                if left <= 0:
                    self.error = TimeoutError(f"replica streams not drained in {timeout_s:g} s")
                    break
                self._marks.wait(left)

    def close(self) -> None:
        for sock in [*self._out, *self._in.values()]:
            with contextlib.suppress(OSError):
                sock.close()
