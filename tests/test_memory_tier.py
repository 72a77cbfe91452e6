"""The memory tier (runtime/ckpt/memory.py, runtime/memory_tier.py): blobs that check
themselves, a node's directory, partners on other nodes, and the restore that never
takes an unverified copy (real Open MPI ranks; two emulated nodes, a directory each).

Run as a script (under mpirun), this file is the rank body of the `scenario` fixture:
the same restore scenario over the MPI transport and over the gloo one (runtime/memory_transport.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch


def _tree(step: int, rank: int) -> dict:
    g = torch.Generator().manual_seed(100 * rank + step)
    return {"workload": {"w": torch.randn(64, 8, generator=g), "n": np.arange(5) + step,
                         "steps": step, "name": f"r{rank}", "pair": (1, 2.5)},
            "iteration": step, "empty": torch.empty(0)}


def test_encode_decode_round_trip_exact() -> None:
    from hetrun.runtime.ckpt import memory

    tree = _tree(3, 1)
    blob = memory.encode(3, 1, tree, {"k": 1})
    head = memory.verify(blob)
    assert head == {"step": 3, "owner": 1, "meta": {"k": 1}}
    _, back = memory.decode(bytes(blob))
    assert torch.equal(back["workload"]["w"], tree["workload"]["w"])
    assert np.array_equal(back["workload"]["n"], tree["workload"]["n"])
    assert back["workload"]["pair"] == (1, 2.5) and back["workload"]["name"] == "r1"
    assert back["empty"].numel() == 0


@pytest.mark.parametrize("where", ["magic", "ids", "header", "payload", "truncated"])
def test_flipped_byte_is_detected(where: str) -> None:
    from hetrun.runtime.ckpt import memory

    from hetrun.errors import CheckpointError

    blob = memory.encode(2, 0, _tree(2, 0))
    if where == "magic":
        blob[0] ^= 1
    elif where == "ids":  # the prefix's owner/step, which a partner files a replica by
        blob[memory._IDS_AT] ^= 1
    elif where == "header":
        blob[memory._PREFIX + 10] ^= 1
    elif where == "payload":
        blob[-7] ^= 0x40
    else:
        blob = blob[:-1]
    with pytest.raises(CheckpointError, match=r"corrupt|mismatch|magic"):
        memory.verify(blob)
    with pytest.raises(CheckpointError):
        memory.decode(blob)


def test_tier_keeps_newest_and_lists_holdings(tmp_path: Path) -> None:
    from hetrun.runtime.ckpt import memory

    tier = memory.MemoryTier(tmp_path / "run", tmp_path / "shm", keep=2)
    for step in (1, 2, 3):
        tier.write(0, step, memory.encode(step, 0, _tree(step, 0)))
    tier.write(5, 2, memory.encode(2, 5, _tree(2, 5)))
    assert tier.held() == {0: [2, 3], 5: [2]}
    assert memory.verify(tier.read(0, 3))["step"] == 3
    # Another run directory (same name, other path) never sees these.
    other = memory.MemoryTier(tmp_path / "x" / "run", tmp_path / "shm")
    assert other.held() == {}


def test_tier_reuses_the_oldest_slot_and_reads_back_exact_bytes(tmp_path: Path) -> None:
    """A write past ``keep`` goes into the oldest blob's slot: a shorter blob after a longer one
    reads back without the longer one's tail, a longer one grows its slot, and a write of a step
    older than those held (a restore that went back) drops the newer ones: the run goes on from
    there. Nothing but the ``keep`` slots is left."""
    from hetrun.runtime.ckpt import memory

    tier = memory.MemoryTier(tmp_path / "run", tmp_path / "shm", keep=3)
    blobs = {}
    for step in range(1, 11):
        size = 12 - step if step < 6 else 4000 * step  # shorter, then longer than the slots hold
        blobs[step] = bytes(memory.encode(step, 0, {"x": torch.arange(size, dtype=torch.float64)}))
        tier.write(0, step, blobs[step])
        held = tier.held()[0]
        assert held == list(range(max(1, step - 2), step + 1)), (step, held)
        for s in held:
            assert tier.read(0, s) == blobs[s]
    assert sorted(os.listdir(tier.owner_dir(0))) == ["slot-0", "slot-1", "slot-2"]
    # A second process's tier (it lists what the first left) reuses the same way.
    again = memory.MemoryTier(tmp_path / "run", tmp_path / "shm", keep=3)
    eleven = bytes(memory.encode(11, 0, {"x": torch.arange(40, dtype=torch.float64)}))
    again.write(0, 11, eleven)
    assert again.held() == {0: [9, 10, 11]} and again.read(0, 11) == eleven
    # A step older than every one held (a restore that went back): the newer ones are the run's
    # before it, dropped; the run's own follow.
    again.write(0, 5, blobs[5])
    assert again.held() == {0: [5]} and again.read(0, 5) == blobs[5]
    again.write(0, 6, blobs[6])
    assert again.held() == {0: [5, 6]} and again.read(0, 6) == blobs[6]


def test_partners_are_on_other_nodes() -> None:
    from hetrun.runtime.memory_tier import partners

    nodes = ["n1", "n1", "n2", "n2", "n3"]
    assert partners(nodes, 0, 1) == [2]
    assert partners(nodes, 1, 1) == [3]
    assert partners(nodes, 4, 2) == [0, 2]
    assert partners(nodes, 3, 5) == [4, 1]  # only as many as there are other nodes
    assert partners(["n1", "n1"], 0, 1) == []  # one node: no replica possible


def test_a_torn_slot_is_no_copy_and_the_neighbours_stay_whole(tmp_path: Path) -> None:
    """A slot whose write was cut short (a death mid-copy: its header made invalid first, the
    copy half done) is not held and not read; a slot changed under a reader is not its step's
    copy; a flipped byte inside a whole slot is the blob's digests' to catch."""
    from hetrun.runtime.ckpt import memory

    from hetrun.errors import CheckpointError

    tier = memory.MemoryTier(tmp_path / "run", tmp_path / "shm", keep=3)
    blobs = {s: memory.encode(s, 0, _tree(s, 0)) for s in (1, 2, 3)}
    for s, blob in blobs.items():
        tier.write(0, s, blob)
    path, at, n = tier.locate(0, 2)
    k = int(path.name.split("-")[1])
    m = tier._maps[0][k]
    tier._mark(0, k, m, 0, 0, valid=False)  # what a write does first ...
    m[at:at + n // 2] = bytes(n // 2)  # ... and half of its copy: then the rank dies
    for reader in (tier, memory.MemoryTier(tmp_path / "run", tmp_path / "shm", keep=3)):
        assert reader.held() == {0: [1, 3]} and reader.steps(0) == [1, 3]
        with pytest.raises(CheckpointError, match="step 2: not held"):
            reader.read(0, 2)
        assert reader.read(0, 3) == bytes(blobs[3]) and reader.read(0, 1) == bytes(blobs[1])
    # The next process's first write takes the torn slot (empty), not a whole one.
    again = memory.MemoryTier(tmp_path / "run", tmp_path / "shm", keep=3)
    again.write(0, 4, blobs[1])
    assert again.held() == {0: [1, 3, 4]} and again.locate(0, 4)[0] == path
    # A whole slot with a flipped byte is held; verification names it.
    path, at, n = again.locate(0, 3)
    data = bytearray(path.read_bytes())
    data[at + n - 3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert 3 in again.steps(0)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        memory.verify(again.read(0, 3))


def test_a_full_tmpfs_is_an_error_at_the_write_not_a_sigbus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot's pages are allocated when it is made or grown (``posix_fallocate``): a tmpfs that
    cannot back them is an OSError from ``write`` (the rank's own: raised on its training thread),
    never a SIGBUS at the copy's first touch; the slots already whole stay readable."""
    import errno

    from hetrun.runtime.ckpt import memory, memory_slots

    tier = memory.MemoryTier(tmp_path / "run", tmp_path / "shm", keep=2)
    small = memory.encode(1, 0, {"x": torch.ones(4)})
    tier.write(0, 1, small)

    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(memory_slots.os, "posix_fallocate", full)
    with pytest.raises(OSError, match="No space"):
        tier.write(0, 2, memory.encode(2, 0, {"x": torch.ones(1 << 16)}))  # a new slot: allocated
    assert tier.held() == {0: [1]} and tier.read(0, 1) == bytes(small)


def test_a_snapshot_is_copied_into_its_slot_and_its_slot_handed_to_the_keeper(tmp_path: Path) -> None:
    """snapshot(): the blob copied into this node's slot on the training thread, then only its
    step and slot handed to the transport (the keeper reads the slot: runtime/replica_keeper.py);
    a copy that fails is the rank's own failure, raised where it happens."""
    from hetrun.runtime.ckpt import memory
    from hetrun.runtime.ckpt.memory_encode import Encoder
    from hetrun.runtime.memory_tier import PHASES, MemorySnapshots

    m = MemorySnapshots.__new__(MemorySnapshots)
    m._cost, m._off_thread, m._idle, m.charged_s = None, 0.0, None, 0.0
    m.phases, m.phases_cpu, m.by_every, m.every, m.taken = dict.fromkeys(PHASES, 0.0), 0.0, {}, 1, 0
    m.seconds, m.partners, m.rank, m._iter_s = 0.0, [1], 0, 0.05
    m.adaptive, m.every_max, m._window = False, 1, [0.0, 0]
    m.tier = memory.MemoryTier(tmp_path / "run", tmp_path / "shm", keep=3)
    sent: list = []
    met: list = []
    m.transport = type("X", (), {"thread_cpu_s": 0.0, "skipped": 0, "replica_failures": (0, ""),
                                 "ready": lambda self: met.append(m.taken),
                                 "send": lambda self, step, slot: sent.append((step, slot))})()
    m._encoder = Encoder()
    for step in (5, 6):
        m.snapshot(step, _tree(step, 0))
    assert m.tier.steps(0) == [5, 6] and sent == [(5, 0), (6, 1)]
    assert met == [0]  # the keepers met once, at the first snapshot (every rank's same step)
    assert m.tier.read_slot(0, 1, 6) == m.tier.read(0, 6) and m.tier.read_slot(0, 0, 6) is None
    # Framed straight into the slot by the encoder: the reference encoder's bytes exactly.
    assert m.tier.read(0, 6) == bytes(memory.encode(6, 0, _tree(6, 0)))
    assert m.phases["write"] > 0 and m.bytes == len(m.tier.read(0, 6))
    assert "replica_write_failures" not in m.summary()
    m.tier.close()
    shutil.rmtree(m.tier.dir)
    m.tier.dir.parent.mkdir(parents=True, exist_ok=True)
    m.tier.dir.write_text("not a directory")
    with pytest.raises(OSError):  # the rank's own: raised on its thread
        m.snapshot(9, _tree(9, 0))


def test_adaptive_every_is_a_power_of_two_within_budget() -> None:
    from hetrun.runtime.memory_tier import BUDGET, MemorySnapshots

    m = MemorySnapshots.__new__(MemorySnapshots)  # the rule alone, no communicator
    m.adaptive, m.every, m._cost, m._iter_s, m._last, m.size = False, 1, None, None, None, 1
    m._first = None
    m.by_every = {}
    m.every_max, m.wanted_most = 16, 1
    assert m.wanted() == 1 and m.due(3)  # no cost known yet: every iteration
    assert m.due(4) and m.by_every[1][2] == 1  # one iteration timed at N = 1
    m._cost, m._iter_s = 0.010, 0.1  # 10 ms per snapshot, 100 ms iterations
    assert m.wanted() == 8 and m._cost / (8 * m._iter_s) <= BUDGET  # 5 -> 8: 1.25% of the time
    m._cost = 0.0016  # 1.6 ms: 1.6 % of an iteration at N = 1, within the 2 %
    assert m.wanted() == 1
    m._cost = 0.0026  # 2.6 % at N = 1, 1.3 % at 2
    assert m.wanted() == 2
    m._cost = 10.0
    assert m.wanted() == 16 and m.wanted_most == 1024  # capped at every_max; what the budget asked is kept
    m.every_max, m.wanted_most, m._cost = 2, 1, 0.010
    assert m.wanted() == 2 and m.wanted_most == 8
    # The default cap, 1: a snapshot every iteration (a node death costs at most the iteration it
    # interrupted), and no all-reduce to agree on an N that cannot change; what the budget asked
    # is still kept for the report.
    m.every_max, m.wanted_most, m._agreeing = 1, 1, None
    m.transport = type("NoCollectives", (), {"start_max": lambda self, v: pytest.fail("no all-reduce at cap 1")})()
    for step in range(1, 13):
        m._agree(step)
    assert m.every == 1 and m.wanted_most == 8 and m._agreeing is None


def test_a_measurement_pause_skips_every_other_block_and_a_bad_value_is_refused(monkeypatch) -> None:
    """HETRUN_MEMORY_PAUSE_BLOCKS=B (PAUSE_ENV, benchmarks only): no snapshot in steps B..2B-1,
    3B..4B-1, ...; the same steps on every rank (a step number's rule, no clock). Anything but a
    positive integer stops the rank with the variable named."""
    from hetrun.runtime import memory_tier
    from hetrun.runtime.memory_tier import MemorySnapshots

    from hetrun.errors import RuntimeFailure

    m = MemorySnapshots.__new__(MemorySnapshots)
    m.adaptive, m.every, m._iter_s, m._last, m._first, m.by_every = False, 1, None, None, None, {}
    assert all(m.due(s) for s in range(12))  # unset: every step
    m.pause_blocks = 3
    assert [s for s in range(12) if m.due(s)] == [0, 1, 2, 6, 7, 8]
    m.pause_blocks, m.every = 3, 2
    assert [s for s in range(14) if m.due(s)] == [0, 2, 6, 8, 12]
    monkeypatch.setenv(memory_tier.PAUSE_ENV, "20")
    assert memory_tier._pause_blocks() == 20
    for bad in ("0", "-3", "x", "2.5"):
        monkeypatch.setenv(memory_tier.PAUSE_ENV, bad)
        with pytest.raises(RuntimeFailure, match=memory_tier.PAUSE_ENV):
            memory_tier._pause_blocks()
    monkeypatch.delenv(memory_tier.PAUSE_ENV)
    assert memory_tier._pause_blocks() == 0


def test_memory_every_max_is_the_plans_power_of_two() -> None:
    """checkpoint.memory_every_max: default 1, a power of two, else a clear error naming the key."""
    from types import SimpleNamespace

    import yaml
    from hetrun.dag.spec import spec_from_dict
    from hetrun.runtime.recovery import memory_every_max

    from hetrun.errors import SpecError

    assert memory_every_max(SimpleNamespace(checkpoint={})) == 1
    assert memory_every_max(SimpleNamespace(checkpoint={"memory_every_max": 16})) == 16
    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "ppo_cartpole.yaml").read_text())
    doc.setdefault("checkpoint", {})["memory_every_max"] = 8
    assert spec_from_dict(doc).checkpoint.memory_every_max == 8
    for bad, fix in ((3, "use 2 or 4"), (0, "greater than or equal to 1"), (2048, "less than or equal to 1024")):
        doc["checkpoint"]["memory_every_max"] = bad
        with pytest.raises(SpecError, match=r"checkpoint\.memory_every_max") as exc:
            spec_from_dict(doc)
        assert fix in str(exc.value)


def test_the_adaptive_cost_counts_the_replica_threads() -> None:
    """snapshot() charges a snapshot its own seconds on the training thread and the CPU its
    replica threads spent since the last one (on a busy node they take a core from training);
    the first snapshot is left out, the next few give their cheapest, then an EWMA."""
    from hetrun.runtime.memory_tier import PHASES, WARM_SNAPSHOTS, MemorySnapshots

    assert WARM_SNAPSHOTS == 4  # the sequence below

    m = MemorySnapshots.__new__(MemorySnapshots)  # the rule alone: a tier and transport that do nothing
    m._cost, m._off_thread, m._idle, m.charged_s = None, 0.0, None, 0.0
    m.phases, m.phases_cpu, m.by_every, m.every, m.taken = dict.fromkeys(PHASES, 0.0), 0.0, {}, 4, 0
    m.seconds, m.partners, m.rank = 0.0, [], 0
    m.adaptive, m.every_max, m._window = True, 8, [0.0, 0]  # N free to change: the model at every snapshot

    class _Transport:
        thread_cpu_s = 0.0

        def ready(self) -> None:
            pass

    m.tier = type("T", (), {"write": lambda self, *a: None})()
    m.transport = _Transport()
    m._encoder = type("E", (), {"parts": staticmethod(lambda step, owner, tree: bytearray(b"x"))})()
    m.transport.thread_cpu_s = 0.006
    m.snapshot(4, {"x": 1}, started=None)
    # A process's first snapshot pays once for what the next do not: not in the model.
    assert m._cost is None and m._off_thread == pytest.approx(0.006)
    m.transport.thread_cpu_s += 0.001
    m.snapshot(8, {"x": 1}, started=None)
    assert m._cost == pytest.approx(0.001, abs=5e-4)  # the streams' 1 ms and the snapshot's microseconds
    # The next WARM_SNAPSHOTS - 1: the cheapest so far (a slow one does not raise it) ...
    for step, streams in ((12, 0.009), (16, 0.0004), (20, 0.005)):
        m.transport.thread_cpu_s += streams
        m.snapshot(step, {"x": 1}, started=None)
    assert m._cost == pytest.approx(0.0004, abs=5e-4)
    # ... then the running average.
    m.transport.thread_cpu_s += 0.010
    m.snapshot(24, {"x": 1}, started=None)
    assert m._cost == pytest.approx(0.8 * 0.0004 + 0.2 * 0.010, abs=5e-4)
    assert m.taken == 6 and set(m.phases) == set(PHASES)
    # The rank's cores stood idle for longer than the helpers ran: they took no core from
    # training, so only the training thread's seconds are charged; idle shorter than the helpers'
    # CPU: the rest is charged.
    before, charged = m._cost, m.charged_s
    m._idle = type("Idle", (), {"idle_s": lambda self: 0.020})()
    m.transport.thread_cpu_s += 0.010
    m.snapshot(28, {"x": 1}, started=None)
    assert m.charged_s == charged and m._cost == pytest.approx(0.8 * before, abs=2e-4)
    m._idle = type("Idle", (), {"idle_s": lambda self: 0.004})()
    m.transport.thread_cpu_s += 0.010
    m.snapshot(32, {"x": 1}, started=None)
    assert m.charged_s == pytest.approx(charged + 0.006)


def test_a_pinned_n_updates_the_cost_model_once_per_window() -> None:
    """At the default cap (N pinned at 1) the model only names the N the budget would ask for: it
    is updated once per AGREE_EVERY snapshots, from their mean and the helpers' CPU over the
    window, so the idle cores are read (a system call on the training thread) once per window."""
    from hetrun.runtime.memory_tier import AGREE_EVERY, PHASES, MemorySnapshots

    m = MemorySnapshots.__new__(MemorySnapshots)
    m._cost, m._off_thread, m.charged_s = None, 0.0, 0.0
    m.phases, m.phases_cpu, m.by_every, m.every, m.taken = dict.fromkeys(PHASES, 0.0), 0.0, {}, 1, 0
    m.seconds, m.partners, m.rank = 0.0, [], 0
    m.adaptive, m.every_max, m._window = True, 1, [0.0, 0]
    reads = []

    class _Idle:
        def idle_s(self) -> float:
            reads.append(m.taken)
            return 0.0

    m._idle = _Idle()
    m.tier = type("W", (), {"write": lambda self, *a: None})()
    m.transport = type("T", (), {"thread_cpu_s": 0.0, "ready": lambda self: None})()
    m._encoder = type("E", (), {"parts": staticmethod(lambda step, owner, tree: bytearray(b"x"))})()
    m.snapshot(1, {"x": 1})
    assert reads == [1] and m._cost is None  # the first: the baseline, left out of the model
    for step in range(2, 2 + 2 * AGREE_EVERY):
        m.transport.thread_cpu_s += 0.004  # 4 ms of the streams' CPU per snapshot, all charged (no idle)
        m.snapshot(step, {"x": 1})
    assert reads == [1, 1 + AGREE_EVERY, 1 + 2 * AGREE_EVERY]
    # each update: the window's mean own seconds (microseconds here) plus its helpers' CPU / count
    assert m._cost == pytest.approx(0.004, abs=5e-4)
    assert m.charged_s == pytest.approx(0.004 * 2 * AGREE_EVERY)
    m._iter_s, m.wanted_most = 0.06, 1  # 4 ms a snapshot of a 60 ms iteration: the budget asks for N = 4
    assert m.wanted() == 1 and m.wanted_most == 4 and m.taken == 1 + 2 * AGREE_EVERY


def test_idle_meter_reads_the_allowed_cores_idle_time(tmp_path: Path, monkeypatch) -> None:
    """runtime/idle_cores.py: the idle seconds of the CPUs the process may run on, from /proc/stat
    when that is a subset of the machine's (here a stand-in file, two of four CPUs), counted
    between reads; the whole machine's from /proc/uptime; not known without either."""
    import os

    from hetrun.runtime import idle_cores

    stat = tmp_path / "stat"

    def write(idle1: int, idle3: int) -> None:
        stat.write_text("cpu  1 2 3 4 5 0 0 0 0 0\n"
                        f"cpu0 1 0 1 900 9 0 0 0 0 0\ncpu1 1 0 1 {idle1} 5 0 0 0 0 0\n"
                        f"cpu2 1 0 1 700 7 0 0 0 0 0\ncpu3 1 0 1 {idle3} 5 0 0 0 0 0\nintr 1 2 3\n")

    write(100, 300)
    monkeypatch.setattr(idle_cores, "_STAT", str(stat))
    monkeypatch.setattr(idle_cores, "_quota_limited", lambda: False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1, 3})
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    meter = idle_cores.IdleMeter()
    assert meter.known and not meter._whole
    tick = os.sysconf("SC_CLK_TCK")
    write(100 + tick, 300 + 2 * tick)  # cpu1 idle 1 s more, cpu3 2 s; cpu0 and cpu2 not counted
    assert meter.idle_s() == pytest.approx(3.0)
    assert meter.idle_s() == 0.0
    meter.close()
    monkeypatch.setattr(idle_cores, "_STAT", str(tmp_path / "missing"))
    gone = idle_cores.IdleMeter()
    assert not gone.known and gone.idle_s() is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    whole = idle_cores.IdleMeter()  # every CPU allowed: the real /proc/uptime
    assert whole._whole and whole.known and whole.idle_s() >= 0.0
    whole.close()


def test_memory_every_auto_spelling_and_bad_values() -> None:
    from types import SimpleNamespace

    import yaml
    from hetrun.dag.spec import spec_from_dict
    from hetrun.runtime.recovery import memory_every

    from hetrun.errors import SpecError

    def plan(value: object, spares: int = 0) -> SimpleNamespace:
        comps = [{"name": "learner", "spare_nodes": spares}]
        return SimpleNamespace(checkpoint={"memory_every": value}, raw={"components": comps})

    assert memory_every(plan("auto")) is None  # adaptive, spare nodes or not
    assert memory_every(plan(None)) == 0 and memory_every(plan(None, spares=1)) is None
    assert memory_every(plan(4)) == 4 and memory_every(plan(0)) == 0
    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "ppo_cartpole.yaml").read_text())
    doc["checkpoint"]["memory_every"] = "auto"
    assert spec_from_dict(doc).checkpoint.memory_every == "auto"
    for bad in ("sometimes", -1, 2.5, True):
        doc["checkpoint"]["memory_every"] = bad
        with pytest.raises(SpecError, match=r"checkpoint\.memory_every.*whole number.*'auto'") as exc:
            spec_from_dict(doc)
        assert "literal" not in str(exc.value) and "constrained" not in str(exc.value)


def test_spare_nodes_spec_key() -> None:
    from hetrun.dag.spec import JobSpec

    from hetrun.errors import SpecError

    base = {"name": "j", "components": {"tr": {"command": ["python3", "t.py"], "spare_nodes": 1}}}
    with pytest.raises((SpecError, ValueError), match="spare_nodes"):
        JobSpec.model_validate(base)
    base["components"]["tr"]["spare_nodes"] = -1
    with pytest.raises((SpecError, ValueError), match="spare_nodes"):
        JobSpec.model_validate(base)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One launch of four real Open MPI ranks plays the scenario twice: over the MPI transport
    (the executor's), then over the gloo one (the run API's: a torch.distributed world the same
    processes meet through a file, so no port is picked), each on its own directories."""
    from mpi_helpers import run_ranks

    base = tmp_path_factory.mktemp("memory-tier")
    out = base / "out.json"
    run_ranks(4, __file__, str(base), str(out), timeout=110)
    return json.loads(out.read_text())


@pytest.mark.timeout(120)  # the scenario's launch runs inside the first of the two
def test_restore_falls_back_over_mpi(scenario: dict) -> None:
    _check_scenario(scenario["mpi"])


@pytest.mark.timeout(120)
def test_restore_falls_back_over_gloo(scenario: dict) -> None:
    _check_scenario(scenario["gloo"])


def _check_scenario(got: dict) -> None:
    # 1. every copy intact: the newest step, each rank from its own node, equal to the state
    # at the snapshot (changed in place after it).
    assert got["intact"]["step"] == 3 and got["intact"]["tree_ok"]
    assert [s["kind"] for s in got["intact"]["sources"]] == ["own"] * 4
    # 2. rank 1's own copy has a flipped byte: detected, its replica on the other node used.
    flipped = got["flipped"]
    assert flipped["step"] == 3 and flipped["tree_ok"]
    assert flipped["sources"][1] == {"rank": 1, "holder": 2, "node": "b", "kind": "replica"}  # node b's reader
    assert [(r["owner"], r["node"]) for r in flipped["rejected"]] == [(1, "a")]
    # 3. node b's memory gone too: step 3 has no verified copy of rank 1 -> step 2, from node a.
    lost = got["node_lost"]
    assert lost["step"] == 2 and lost["tree_ok"]
    assert {s["node"] for s in lost["sources"]} == {"a"}
    # 4. every copy of rank 0 corrupt: no step -> the caller's store.
    assert got["none"]["step"] is None and "failed verification" in got["none"]["reason"]
    # 5. adaptive N: agreed at step AGREE_EVERY (4; the allreduce started there is applied at 8),
    # the same on every rank.
    agreed = got["agreed"]
    assert agreed["wanted"] == [2, 4, 8, 8]
    for every in agreed["every"]:
        assert every[:7] == [1] * 7 and every[7:] == [8] * 13, every
    # ... and once early, FIRST_AGREE_AFTER (2) steps after the first due() (step 0 here): at 2,
    # applied at 4.
    for every in agreed["early"]:
        assert every[:3] == [1] * 3 and every[3:] == [8] * 17, every
    # 6. replicas written between snapshots: no rank took another snapshot for them to land.
    assert got["landed"]["ok"] and got["landed"]["taken"] == [4] * 4


def _rank_main(base: Path, out: Path) -> None:
    """One rank: the scenario over MPI, then over gloo (the same ranks); rank 0 writes both."""
    import torch.distributed as dist
    from hetrun.runtime.memory_transport import GlooTransport
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    results = {"mpi": _scenario(world, world.Get_rank(), base / "mpi")}
    dist.init_process_group("gloo", init_method=f"file://{base / 'rendezvous'}", rank=world.Get_rank(),
                            world_size=world.Get_size())
    results["gloo"] = _scenario(GlooTransport(), world.Get_rank(), base / "gloo")
    if world.Get_rank() == 0:
        out.write_text(json.dumps(results))
    world.Barrier()
    dist.destroy_process_group()


def _scenario(comm: Any, rank: int, base: Path) -> dict:
    """One rank of the scenario over ``comm`` (an mpi4py communicator or a transport)."""
    from hetrun.runtime.memory_tier import MemorySnapshots

    node = "a" if rank < 2 else "b"  # two emulated nodes, each its own tmpfs directory
    root = base / f"node-{node}"
    mem = MemorySnapshots(comm, base / "run", node=node, every=1, replicas=1, root=root)
    allgather, barrier = mem.transport.allgather, mem.transport.barrier
    for step in (1, 2, 3):
        tree = _tree(step, rank)
        mem.snapshot(step, tree)
        # The script's next step changes its tensors in place: the snapshot holds the state before.
        tree["workload"]["w"].add_(1000.0)
        tree["workload"]["n"] += 7
    mem.close()
    results: dict[str, Any] = {}

    def phase(name: str) -> None:
        got = mem.restore()
        want = _tree(got.step, rank)["workload"] if got.step is not None else None
        ok = got.tree is not None and torch.equal(got.tree["workload"]["w"], want["w"]) and np.array_equal(
            got.tree["workload"]["n"], want["n"])
        oks = allgather(ok)
        results[name] = {"step": got.step, "sources": got.sources, "rejected": got.rejected,
                         "reason": got.reason, "tree_ok": all(oks)}

    phase("intact")
    if rank == 0:
        p, at, n = mem.tier.locate(1, 3)
        data = bytearray(p.read_bytes())
        data[at + n - 3] ^= 0xFF
        p.write_bytes(bytes(data))
    barrier()
    phase("flipped")
    if rank == 2:
        import shutil

        shutil.rmtree(root)
    barrier()
    phase("node_lost")
    if rank == 0:
        for s in mem.tier.steps(0):
            p, at, n = mem.tier.locate(0, s)
            data = bytearray(p.read_bytes())
            data[at + n - 1] ^= 1
            p.write_bytes(bytes(data))
    barrier()
    phase("none")
    # The adaptive N: each rank wants its own, all apply the largest, from the same step.
    mem.adaptive, mem._iter_s, mem.every_max = True, 0.1, 16  # above the default cap of 2
    mem._cost = 0.004 * (rank + 1)  # wants 2, 4, 8, 8
    chosen = []
    for step in range(1, 21):
        mem._agree(step)
        chosen.append(mem.every)
    mem._agreeing.wait()  # the one in flight, before the next round starts another
    mem._agreeing, mem.every, mem._first = None, 1, 0
    early = []
    for step in range(1, 21):
        mem._agree(step)
        early.append(mem.every)
    mem._agreeing.wait()
    mem._agreeing, mem._first = None, None
    results["agreed"] = {"wanted": allgather(mem.wanted()), "every": allgather(chosen),
                         "early": allgather(early)}
    # 6. With N > 1 a replica lands on its partner's node as the partner starts its next
    # iterations (due), not only at its next snapshot N iterations later.
    from hetrun.runtime.memory_tier import partners

    mem.adaptive, mem.every = False, 4
    mem.snapshot(40, _tree(40, rank))
    senders = [q for q in range(mem.size) if rank in partners(mem.nodes, q, 1)]
    landed, polls = False, 0
    while not landed and polls < 5000:
        assert not mem.due(41 + polls % 3)  # no snapshot due at 41..43
        mine = all(40 in mem.tier.steps(q) for q in senders)
        landed = all(allgather(mine))
        polls += 1
    results["landed"] = {"ok": landed, "taken": allgather(mem.taken)}
    mem.close()
    return results


if __name__ == "__main__":
    _rank_main(Path(sys.argv[1]), Path(sys.argv[2]))


def test_heartbeat_is_a_counter_that_advances_and_its_period_is_an_env_variable(tmp_path: Path, monkeypatch) -> None:
    """The monitor judges a node by its heartbeat's content changing (never by comparing a
    shared file's mtime with its clock): the file holds a counter that grows while the rank lives."""
    import time

    from hetrun.runtime import recovery

    from hetrun import rundir
    from hetrun.errors import SpecError

    for bad in ("0", "-1", "fast"):
        with pytest.raises(SpecError, match="HETRUN_HEARTBEAT_S"):
            recovery.heartbeat_s({rundir.HEARTBEAT_ENV: bad})
    assert recovery.heartbeat_s({}) == rundir.HEARTBEAT_DEFAULT_S
    monkeypatch.setenv(rundir.HEARTBEAT_ENV, "0.02")
    path = rundir.RunPaths(tmp_path).heartbeats / "n1"
    recovery.start_heartbeat(tmp_path, "n1")
    try:
        seen: set[int] = set()
        deadline = time.monotonic() + 30
        while len(seen) < 3 and time.monotonic() < deadline:
            text = path.read_text() if path.exists() else ""
            if text.endswith("\n"):
                seen.add(int(text))
            time.sleep(0.01)
        assert len(seen) >= 3, seen  # the value changes: that is what the monitor watches
    finally:
        recovery.stop_heartbeat()
    assert not path.exists()  # ended on purpose: not taken for a death
    # Nothing puts it back after the stop: a writer the loop had started (an `mv`) outlived
    # the loop's SIGKILL and renamed a fresh file into place after the unlink, a stale
    # counter the monitor takes for a dead node (seen at load 25). Every external command
    # is made slow here, as on a starved machine (the old loop failed 10 of 15 this way);
    # stopped at moments spread over the beat.
    slow = tmp_path / "slowbin"
    slow.mkdir()
    for tool in ("mv", "cp", "touch", "tee", "dd"):
        (slow / tool).write_text(f"#!/bin/bash\nsleep 0.02\nexec {shutil.which(tool) or '/bin/' + tool} \"$@\"\n")
        (slow / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{slow}:{os.environ['PATH']}")
    monkeypatch.setenv(rundir.HEARTBEAT_ENV, "0.001")
    for i in range(15):
        recovery.start_heartbeat(tmp_path, "n1")
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.003 * (i % 8))
        recovery.stop_heartbeat()
        time.sleep(0.06)  # longer than any slowed write in flight
        assert not path.exists(), i



def test_heartbeat_survives_stop_signals_and_ends_with_its_rank(tmp_path: Path) -> None:
    """The beat is a process beside the rank (a starved rank's GIL stopped a thread's beat for
    seconds, benchmarks/node_death.md): it must not end at a preemption's SIGTERM while the
    rank checkpoints, and must stop once the rank is gone, so a dead rank looks silent."""
    import signal
    import subprocess
    import time

    from hetrun.runtime import recovery

    path = tmp_path / "n1"
    rank = subprocess.Popen(["sleep", "2.5"])  # stands for the rank: the beat watches its pid
    beat = subprocess.Popen(["bash", "-c", recovery._BEAT, "beat", str(rank.pid), str(path), "0.05"])
    try:
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        beat.send_signal(signal.SIGTERM)  # a stop signal (preemption): the beat must go on
        time.sleep(0.3)
        first = path.read_text()
        time.sleep(0.5)
        assert path.read_text() != first and beat.poll() is None, "the beat stopped at SIGTERM"
        rank.wait(timeout=30)
        assert beat.wait(timeout=30) == 0  # it saw its rank gone
        assert path.read_text().strip().isdigit()  # whole lines only
    finally:
        rank.kill()
        beat.kill()


def test_heartbeat_file_is_never_empty_once_written(tmp_path: Path) -> None:
    """The beat rewrites its line in place, never truncating the file: a node killed mid-write
    leaves the last count or the new one, not an empty file the monitor cannot read (and on
    ext4 a truncate-and-rewrite is flushed at close, which stalled beats under checkpoint I/O
    for seconds; session 29). Read as the monitor does, in a tight loop over many beats."""
    import subprocess
    import time

    from hetrun.runtime import recovery

    path = tmp_path / "n1"
    rank = subprocess.Popen(["sleep", "30"])
    beat = subprocess.Popen(["bash", "-c", recovery._BEAT, "beat", str(rank.pid), str(path), "0.001"])
    try:
        deadline = time.monotonic() + 30
        while not (path.exists() and path.read_bytes().endswith(b"\n")) and time.monotonic() < deadline:
            time.sleep(0.001)
        inode, reads, values = path.stat().st_ino, 0, set()
        stop = time.monotonic() + 1.5
        while time.monotonic() < stop:
            text = path.read_bytes()
            assert text.endswith(b"\n") and text.split(b"\n")[0].isdigit(), text  # a whole count, always
            values.add(int(text.split(b"\n")[0]))
            reads += 1
        assert len(values) > 20 and reads > len(values), (reads, len(values))  # many beats, each read
        assert path.stat().st_ino == inode  # the same file, rewritten in place
    finally:
        rank.kill()
        beat.kill()


def test_the_report_says_when_the_cap_held_n_below_the_budget(tmp_path: Path) -> None:
    """`hetrun report`'s memory tier line, from the ranks' memory_tier events: the N, the busiest
    rank's share, and the cap (checkpoint.memory_every_max) when it held N below the budget's."""
    from hetrun.reports.node_failures import memory_tier_line

    def ev(rank: int, seconds: float, wanted: int, t: float = 1.0) -> dict:
        return {"ev": "memory_tier", "t": t, "component": "learner", "rank": rank, "snapshots": 100,
                "seconds": seconds, "bytes": 180224, "every": 2, "every_max": 2, "wanted_most": wanted,
                "by_every": {"1": {"seconds": 0.0, "wall_s": 2.0, "iterations": 40},
                             "2": {"seconds": 0.0, "wall_s": 8.0, "iterations": 160}}}

    assert memory_tier_line([{"ev": "startup"}]) is None
    line = memory_tier_line([ev(0, 0.1, 2), ev(1, 0.3, 8, t=0.5), ev(1, 0.2, 2, t=2.0)])  # rank 1's newest
    assert line == ("memory tier: a snapshot every 2 iteration(s) (auto, at most 2); 100 snapshots, 176 KiB "
                    "a rank; 2.00 % of the training thread at most (rank 1, learner)"), line
    assert "budget" not in memory_tier_line([ev(0, 0.1, 2), ev(1, 0.15, 8, t=2.0)])  # 1.50 %: within it
    capped = memory_tier_line([ev(0, 0.1, 2), ev(1, 0.3, 8, t=2.0)])
    assert capped.endswith("3.00 % of the training thread at most (rank 1, learner); over the 2 % budget: it "
                           "asked for N = 8 at its most, held at 2 by checkpoint.memory_every_max (a node death "
                           "costs at most about N iterations: raise it to 8 to trade those for speed)"), capped
    # `hetrun report` prints it after the checkpoints, from the run directory's events.jsonl
    from types import SimpleNamespace

    from hetrun.cli.report_cmd import _print_memory_tier
    from hetrun.reports.node_failures import memory_tier_summary
    from rich.console import Console

    assert memory_tier_summary(tmp_path) is None  # no events: no memory tier, no line
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in (ev(0, 0.1, 2), ev(1, 0.3, 8))))
    assert memory_tier_summary(tmp_path) == capped
    console = Console(record=True, width=400)
    _print_memory_tier(console, SimpleNamespace(run_dir=tmp_path))
    assert console.export_text().strip() == capped
