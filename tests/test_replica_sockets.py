"""The gloo memory transport's replica streams (runtime/replica_sockets.py): real TCP sockets on
loopback, each "rank" a thread of this process; the rank's collective is a barrier-backed
all-gather between those threads."""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

import pytest
from hetrun.runtime import replica_sockets
from hetrun.runtime.replica_sockets import ReplicaSockets


def _allgathers(n: int) -> list[Any]:
    barrier, slots = threading.Barrier(n), [None] * n

    def make(rank: int) -> Any:
        def allgather(value: Any) -> list[Any]:
            slots[rank] = value
            barrier.wait()
            out = list(slots)
            barrier.wait()
            return out
        return allgather
    return [make(r) for r in range(n)]


def _pair(deliver: list[Any], allgathers: list[Any] | None = None) -> list[ReplicaSockets]:
    """Two ranks, each the other's partner (sources and dests), built at once like ranks do."""
    ags = allgathers or _allgathers(2)
    out: list[Any] = [None, None]

    def build(r: int) -> None:
        out[r] = ReplicaSockets(r, ags[r], [1 - r], [1 - r], deliver[r])
    threads = [threading.Thread(target=build, args=(r,)) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert all(out), "set-up did not finish"
    return out


def test_blobs_arrive_whole_in_order_and_drain_is_repeatable() -> None:
    got: list[list[bytes]] = [[], []]
    a, b = _pair([lambda m: got[0].append(bytes(m)), lambda m: got[1].append(bytes(m))])
    sent = [bytes([i]) * (1000 + 70_000 * i) for i in range(replica_sockets.MAX_WAITING)]  # none dropped
    for blob in sent:
        a.send(blob)
    b.send(b"x" * 10)
    threads = [threading.Thread(target=s.drain, args=(30,)) for s in (a, b)]
    [t.start() for t in threads]
    [t.join(40) for t in threads]
    assert got[1] == sent and got[0] == [b"x" * 10]
    assert a.error is None and b.error is None and a.skipped == 0
    assert a.thread_cpu_s > 0 and b.thread_cpu_s > 0
    # The streams stay open after a drain: the next snapshots go the same way.
    a.send(b"again")
    threads = [threading.Thread(target=s.drain, args=(30,)) for s in (a, b)]
    [t.start() for t in threads]
    [t.join(40) for t in threads]
    assert got[1][-1] == b"again"
    a.close()
    b.close()


def test_a_connection_without_the_token_is_closed_unread() -> None:
    ags = _allgathers(2)
    intruder: dict[str, Any] = {}

    def rank1_allgather(value: Any) -> list[Any]:
        peers = ags[1](value)
        # Before rank 1 connects, someone else reaches rank 0's listener claiming to be rank 1.
        s = socket.create_connection((peers[0]["hosts"][0], peers[0]["port"]), timeout=10)
        s.sendall(struct.pack("<32sI", b"0" * 32, 1))
        intruder["sock"] = s
        return peers

    got: list[bytes] = []
    a, b = _pair([got.append, lambda m: None], [ags[0], rank1_allgather])
    s = intruder["sock"]
    s.settimeout(10)
    assert s.recv(1) == b""  # closed by rank 0, nothing read from it
    b.send(b"real")
    threads = [threading.Thread(target=x.drain, args=(30,)) for x in (a, b)]
    [t.start() for t in threads]
    [t.join(40) for t in threads]
    assert [bytes(m) for m in got] == [b"real"]
    a.close()
    b.close()


def test_a_partner_gone_stops_replication_and_drain_returns() -> None:
    a, b = _pair([lambda m: None, lambda m: None])
    b.close()  # its process died: the kernel closes its end
    t0 = time.monotonic()
    a.drain(30)
    assert a.error is not None and time.monotonic() - t0 < 10
    a.send(b"after")  # ignored, never raises
    a.close()


def test_a_slow_partner_costs_at_most_the_waiting_blobs(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    got: list[bytes] = []

    def slow(m: Any) -> None:
        release.wait(30)  # the partner stops reading: the sender's socket fills and blocks
        got.append(bytes(m[:1]))

    a, b = _pair([lambda m: None, slow])
    for i in range(12):
        a.send(bytes([i]) * (4 << 20))
        time.sleep(0.02)
    assert a.skipped >= 3  # dropped, not queued: the rest fit in the socket buffers and the queue
    release.set()
    threads = [threading.Thread(target=x.drain, args=(60,)) for x in (a, b)]
    [t.start() for t in threads]
    [t.join(70) for t in threads]
    assert a.error is None and got[-1] == bytes([11])  # the newest arrives
    assert len(got) + a.skipped == 12
    a.close()
    b.close()


def test_local_hosts_offer_the_routable_address_before_loopback(monkeypatch) -> None:
    """A rank of the executor has no MASTER_ADDR: its partners on other hosts reach it at the
    host's routable address (world.routable_address), offered before the host name's (Debian
    maps it to 127.0.1.1) and loopback, which comes last."""
    from hetrun.runtime import replica_sockets
    from hetrun.runtime.world import routable_address

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    hosts = replica_sockets.local_hosts()
    assert hosts[-1] == "127.0.0.1" and all(h.startswith("127.") for h in hosts[hosts.index("127.0.0.1"):])
    addr = routable_address()
    assert addr in hosts and (addr.startswith("127.") or hosts.index(addr) == 0)
