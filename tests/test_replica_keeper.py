"""The replica keeper (runtime/replica_keeper.py): real keeper processes, real TCP streams, real
tmpfs slots; two ranks' ends in one test process (each emulated node a directory of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch


def _pair(tmp_path: Path, keep: int = 3) -> tuple[list[Any], list[Any]]:
    """Two ranks on two "nodes", each the other's partner: their tiers and keepers (the set-up
    is collective: both ends at once, the allgather a two-thread meeting)."""
    from hetrun.runtime.ckpt import memory
    from hetrun.runtime.replica_keeper import Keeper

    tiers = [memory.MemoryTier(tmp_path / "run", tmp_path / f"node-{r}", keep=keep) for r in (0, 1)]
    meet, values = threading.Barrier(2), [None, None]

    def allgather(rank: int) -> Any:
        def gather(value: Any) -> list[Any]:
            values[rank] = value
            meet.wait(60)
            got = list(values)
            meet.wait(60)
            return got
        return gather

    keepers: list[Any] = [None, None]
    errors: list[BaseException] = []

    def start(rank: int) -> None:
        try:
            keepers[rank] = Keeper(rank, [1 - rank], [1 - rank], tiers[rank].dir, keep)
            keepers[rank].ready(allgather(rank))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return tiers, keepers


def _drain(keepers: list[Any]) -> None:
    threads = [threading.Thread(target=k.drain, args=(60.0,)) for k in keepers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


def test_each_rank_s_blob_lands_in_its_partner_s_slots_and_the_keeper_s_cpu_is_counted(tmp_path: Path) -> None:
    from hetrun.runtime.ckpt import memory

    tiers, keepers = _pair(tmp_path)
    try:
        blobs = {}
        for step in (1, 2, 3, 4):
            for r in (0, 1):
                blobs[r, step] = memory.encode(step, r, {"w": torch.full((300,), float(10 * r + step))})
                keepers[r].send(step, tiers[r].write(r, step, blobs[r, step]))
            # A training step between snapshots: the keepers read each slot before the rank
            # writes over it (back to back, keep 3 snapshots would outrun them: skipped, below).
            deadline = time.monotonic() + 30
            while not all(step in tiers[1 - r].steps(r) for r in (0, 1)) and time.monotonic() < deadline:
                time.sleep(0.005)
        _drain(keepers)
        for r in (0, 1):
            other = tiers[1 - r]
            assert other.held()[r] == [2, 3, 4], other.held()  # keep 3, beside the partner's own
            assert other.read(r, 4) == bytes(blobs[r, 4])
            assert memory.verify(other.read(r, 3))["owner"] == r
            assert keepers[r].error is None and keepers[r].skipped == 0 and keepers[r].failed == 0
            assert keepers[r].cpu_s > 0  # the keeper's own CPU, for the adaptive N
    finally:
        for k in keepers:
            k.close()
    assert all(k._proc.returncode == 0 for k in keepers)
    assert not any(p.name.endswith(".stats") for t in tiers for p in t.dir.iterdir())


def test_a_slot_written_over_before_its_keeper_read_it_is_skipped_not_sent_torn(tmp_path: Path) -> None:
    """keep 1: the rank's next snapshot takes the slot before its keeper came to the last one
    (a keeper behind): that step is skipped and counted, never read half rewritten."""
    from hetrun.runtime.ckpt import memory

    tiers, keepers = _pair(tmp_path, keep=1)
    try:
        first = tiers[0].write(0, 1, memory.encode(1, 0, {"w": torch.ones(8)}))
        second = tiers[0].write(0, 2, memory.encode(2, 0, {"w": torch.zeros(8)}))
        assert first == second == 0
        keepers[0].send(1, first)  # step 1's slot now holds step 2
        keepers[0].send(2, second)
        _drain(keepers)
        assert keepers[0].skipped == 1 and tiers[1].held() == {0: [2]}
    finally:
        for k in keepers:
            k.close()


def test_a_keeper_ends_with_its_rank_even_killed(tmp_path: Path) -> None:
    """The rank SIGKILLed: its keeper ends too (the socket's end, and PR_SET_PDEATHSIG), so no
    keeper holds a dead rank's streams open."""
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from hetrun.runtime.replica_keeper import Keeper\n"
        "k = Keeper(0, [], [], Path(sys.argv[1]), 2)\n"
        "k.ready(lambda v: [v])\n"
        "print(k._proc.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tier")], capture_output=True,
                         text=True, timeout=120)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        # A zombie is ended too (its parent, the killed rank, is gone: init reaps it)
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(") ")[1].startswith("Z"):
                break
        time.sleep(0.05)
    else:
        pytest.fail(f"keeper {pid} outlived its rank by 10 s")


def test_a_keeper_that_cannot_set_up_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    """Its streams' set-up fails (here: a partner the allgather never names): the rank gets a
    ConnectionError with the keeper's reason, after its part in the allgather, and the keeper ends."""
    from hetrun.runtime.replica_keeper import Keeper

    keeper = Keeper(0, [], [3], tmp_path / "tier", 2)  # started: nothing waited for yet
    assert keeper.cpu_s == 0.0 and keeper.error is None
    keeper.send(1, 0)  # before the streams are set up: nothing to send them to
    with pytest.raises(ConnectionError, match="replica keeper"):
        keeper.ready(lambda v: [v])
    assert keeper._proc.wait(10) == 1


def test_a_replica_this_node_cannot_keep_is_counted_and_replication_goes_on(tmp_path: Path) -> None:
    """A received replica whose copy fails (here the owner's directory is a file) is counted with
    its reason apart from the streams' error: the rank's memory_tier event says it, and the
    next replicas (of the other owner, or once the directory is back) still land."""
    from hetrun.runtime.ckpt import memory

    tiers, keepers = _pair(tmp_path)
    try:
        (tiers[1].dir / "rank-000000").write_text("not a directory")
        keepers[0].send(1, tiers[0].write(0, 1, memory.encode(1, 0, {"w": torch.ones(8)})))
        keepers[1].send(1, tiers[1].write(1, 1, memory.encode(1, 1, {"w": torch.ones(8)})))
        _drain(keepers)
        assert keepers[1].failed == 1 and "not kept here" in keepers[1].copy_error
        assert keepers[1].error is None and keepers[0].error is None  # the streams go on
        assert tiers[0].held()[1] == [1]  # the other way round: landed
        (tiers[1].dir / "rank-000000").unlink()
        keepers[0].send(2, tiers[0].write(0, 2, memory.encode(2, 0, {"w": torch.ones(8)})))
        _drain(keepers)
        assert tiers[1].held()[0] == [2]
    finally:
        for k in keepers:
            k.close()
