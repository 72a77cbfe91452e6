"""Peer-memory snapshots: every rank's state each N iterations, on its node and on
partners' nodes, and the restore that agrees on the freshest step every rank holds.

The ranks talk through a transport (runtime/memory_transport.py): the executor's over MPI,
a command component's (the run API) over torch.distributed gloo and TCP streams of its own. Every
rule below is here once, whichever carries the bytes.

Snapshot (``MemorySnapshots.snapshot``, at the start of an iteration, the same
point and the same tree as an interval checkpoint: workload state, RNG,
iteration, the executor's pipeline): the blob (runtime/ckpt/memory.py) is copied
into a mapped slot of this node's tmpfs on the training thread and, handed to the transport's
replica streams, to ``replicas`` partner ranks on other nodes, which copy it into THEIR node's
slots. Partners: the rank at the same place on the next node(s) in the sorted node list, so one
dead node never takes a rank's own copy and its replica together (with at
least two nodes). Received replicas are copied as they
arrive, by the rank's replica keeper, a process of its own (runtime/replica_keeper.py);
``close`` drains every
stream (no rank leaves while a peer still sends to it).

Restore (``restore``, collective over the world, at a step's start): each
node's lowest rank lists what the node holds; the candidate steps are those
of which every rank has a copy somewhere; for the newest, each rank's copy is
read and its checksums verified by its holder (the rank itself first, then
replicas), a copy that fails is named and the next holder tried; a verified
copy moves to its owner through the transport. If some rank has no verified copy of the
step, the step is dropped and the caller falls back to the store (the shared
checkpoint). The outcome says, per rank, where the state came from.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from hetrun.errors import CheckpointError, RuntimeFailure
from hetrun.rundir import DEFAULTS

from .ckpt import memory
from .ckpt.memory_encode import Encoder
from .idle_cores import IdleMeter
from .memory_transport import wrap

BUDGET = DEFAULTS.memory_budget  # adaptive N: the share of training time the snapshots may take
# The adaptive N's largest, whatever ``checkpoint.memory_every_max`` says: with N the restore
# goes back to the last multiple of N (docs/PREEMPTION.md). The default cap is the job's own
# (hetrun.rundir.DEFAULTS.memory_every_max, 1: at most the interrupted iteration lost): at 16 a
# loaded machine pushed the PPO example to N >= 8 and a node death lost 6 iterations (session
# 28); at 2 a death lost 2 in 3 of 40 PPO deaths and 5 of 20 DDP ones (session 29).
MAX_EVERY = 1024
# The ranks agree on N every AGREE_EVERY steps (non-blocking; applied at the next multiple):
# often enough that a short run leaves N = 1 early (with 8 a run spent its first 15
# snapshots at N = 1, which alone put 4 of 12 80-iteration runs over the 2 % budget:
# benchmarks/node_death.md; with 4, 7), rarely enough that the allreduce has arrived when
# it is needed (ranks run at most a few iterations apart; a rank further ahead waits there).
AGREE_EVERY = 4
# ... and once early: at the rank's second iteration after its start (two snapshots and two
# iteration times measured), applied at the next multiple of AGREE_EVERY, so a run (or a
# restart) spends 2-5 iterations at N = 1 rather than up to 7: at N = 1 a snapshot each
# iteration costs 5-8 % (benchmarks/node_death.md), the warm-up most of a short run's share.
FIRST_AGREE_AFTER = 2
# snapshot()'s phases, in order: the caller's capture of the tree (``started=``), encoding the
# blob's header and digests, framing the blob into this node's slot (its tensors' bytes copied
# there once: runtime/ckpt/memory_slots.py), the frame to the rank's replica keeper (its CPU:
# ``replica_thread_cpu_s``; runtime/replica_keeper.py).
PHASES = ("capture", "encode", "write", "send")
# A process's snapshots after its first (which the cost model leaves out) whose cheapest is the
# cost estimate before the running average takes over (snapshot()).
WARM_SNAPSHOTS = 4
# A measurement setting, never a job's: with B > 0 the tier takes no snapshot in every other block
# of B steps (steps B..2B-1, 3B..4B-1, ...), so a benchmark compares iterations with and without
# it inside one run: the same processes, the same placement on the node's cores, the same
# caches. Run against run, the PPO example's iteration swung 0.022-0.044 s on this VM with the
# tier off in both (benchmarks/node_death.md, session 43): more than the tier's cost. A node
# death in a paused block loses up to B iterations. Read once per process.
PAUSE_ENV = "HETRUN_MEMORY_PAUSE_BLOCKS"


def _pause_blocks() -> int:
    """PAUSE_ENV's block length (0: never paused); a value that is not a positive integer is
    refused, naming the variable, rather than measuring something else."""
    raw = os.environ.get(PAUSE_ENV, "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or int(raw) < 1:
        raise RuntimeFailure(f"{PAUSE_ENV}={raw!r}: expected a positive number of steps; unset it for a job")
    return int(raw)


def partners(nodes: list[str], rank: int, replicas: int) -> list[int]:
    """The ranks that hold ``rank``'s replicas: the same place on the next ``replicas`` nodes.

    ``nodes[r]`` is rank r's node. Never a rank on ``rank``'s own node; fewer
    than ``replicas`` when there are fewer other nodes."""
    order = sorted(set(nodes))
    on = {n: [r for r, m in enumerate(nodes) if m == n] for n in order}
    mine = order.index(nodes[rank])
    place = on[nodes[rank]].index(rank)
    out = []
    for k in range(1, min(replicas, len(order) - 1) + 1):
        ranks = on[order[(mine + k) % len(order)]]
        out.append(ranks[place % len(ranks)])
    return out


@dataclass
class RestoreOutcome:
    """What the memory tier found at a restart."""

    step: int | None = None  # the step restored (None: memory had none every rank holds)
    tree: Any = None  # this rank's state tree at that step
    source: dict[str, Any] = field(default_factory=dict)  # this rank's: node, holder rank, kind
    sources: list[dict[str, Any]] = field(default_factory=list)  # every rank's (rank order)
    rejected: list[dict[str, Any]] = field(default_factory=list)  # copies that failed verification
    reason: str = ""  # why no step, when step is None
    seconds: float = 0.0


class MemorySnapshots:
    """One rank's end of the memory tier. Create it on every rank at the same point
    (its constructor is collective: node names and a communicator of its own).
    ``comm``: an mpi4py communicator or a transport (runtime/memory_transport.py)."""

    pause_blocks = 0  # PAUSE_ENV (set in __init__)

    def __init__(self, comm: Any, run_dir: Any, *, node: str, every: int | None = 1, replicas: int = 1,
                 keep: int = 4, root: Any = None, every_max: int = DEFAULTS.memory_every_max) -> None:
        self.transport = wrap(comm)
        self.rank = self.transport.rank
        self.size = self.transport.size
        self.node = node
        self.nodes: list[str] = list(self.transport.allgather(node))
        # every None: adaptive. Each rank wants the smallest power of two N whose snapshot cost
        # stays within BUDGET of its iterations, and the ranks agree on the largest (an
        # allreduce MAX every AGREE_EVERY steps, applied at the next): every rank uses the same
        # N at the same step, so every rank snapshots the same steps and the newest `keep` a
        # node holds are steps every rank has.
        self.adaptive = every is None
        self._agreeing: Any = None  # the transport's MAX all-reduce in flight (wait() -> log2 N)
        self.every = 1 if every is None else max(1, int(every))
        # The adaptive N's cap (a power of two): the iterations a node death may cost come first,
        # the 2 % budget second. ``wanted_most``: the largest N the budget alone asked for, so
        # the report can say when the cap held N below it (the tier then costs more than 2 %).
        self.every_max = 1 << (min(MAX_EVERY, max(1, int(every_max))).bit_length() - 1)
        self.wanted_most = 1
        # The adaptive N's cost model: what a snapshot costs (EWMA seconds: its capture, encode,
        # slot copy and hand-over on the training thread, and the CPU the replica keeper spent
        # since the last one: this rank's blob sent, the partners' replicas of the same step
        # received and copied here), which N divides. Nothing of the tier runs on the
        # training thread between snapshots (the replicas arrive at the keeper), so
        # there is no per-iteration part (session 26's split of "the looks between actions" went
        # with them: benchmarks/node_death.md, session 28).
        self._cost: float | None = None
        self._iter_s: float | None = None  # EWMA seconds per iteration (between due() calls)
        self._last: float | None = None
        self._first: int | None = None  # the first step due() saw (the same on every rank)
        self._off_thread = 0.0  # the keeper's CPU seconds, as of the last snapshot
        self._window = [0.0, 0]  # N pinned at 1: the snapshots' seconds and count since the model's update
        # ... of which those that ran on cores otherwise idle are not charged (runtime/idle_cores.py):
        # they took no core from training. Read only for the adaptive N (a pread, ~2 us a snapshot).
        self._idle = IdleMeter() if self.adaptive else None
        self.charged_s = 0.0  # the helper threads' CPU seconds the adaptive N charged
        # N -> [the tier's seconds, wall seconds, iterations] while that N was in effect:
        # the tier's share at the N it settled on, beside the whole run's (benchmarks/node_death.md).
        self.by_every: dict[int, list[float]] = {}
        self.partners = partners(self.nodes, self.rank, max(0, int(replicas)))
        self.tier = memory.MemoryTier(run_dir, root, keep=keep)
        # The ranks whose partner this rank is: they send it their replicas.
        self.sources = [r for r in range(self.size) if r != self.rank
                        and self.rank in partners(self.nodes, r, max(0, int(replicas)))]
        self.pause_blocks = _pause_blocks()
        # memory.encode's blob for less of the training thread (a snapshot can come every step):
        # it keeps the header's parts that did not change since the last (runtime/ckpt/memory_encode.py).
        self._encoder = Encoder()
        # The replicas move in a process of the rank's own (runtime/replica_keeper.py), which copies
        # its sources' into this node's slots; none starts where no rank has a partner (one node).
        # Started now, met at the first snapshot (the restore reads the slots without it).
        self.transport.bind(self.sources, self.partners, self.tier, anyone=len(set(self.nodes)) > 1)
        self.taken = 0
        self.seconds = 0.0  # time spent in snapshot(): the tier's cost to training
        # snapshot()'s seconds by phase (PHASES), so a run's cost can be split without a profiler.
        self.phases = dict.fromkeys(PHASES, 0.0)
        self.phases_cpu = 0.0  # ... and the CPU seconds of all but the capture
        self.bytes = 0

    def due(self, step: int) -> bool:
        now = time.perf_counter()
        if self._first is None:
            self._first = step
        if self._last is not None:
            dt = now - self._last
            self._iter_s = dt if self._iter_s is None else 0.8 * self._iter_s + 0.2 * dt
            span = self.by_every.setdefault(self.every, [0.0, 0.0, 0])
            span[1] += dt
            span[2] += 1
        self._last = now
        if self.adaptive:
            self._agree(step)
        if self.pause_blocks and (step // self.pause_blocks) % 2:
            return False
        return step % self.every == 0

    def wanted(self) -> int:
        """This rank's own adaptive N: the smallest power of two (<= ``every_max``) whose
        snapshots take at most BUDGET of its iterations; 1 before a cost is known."""
        if self._cost is None or not self._iter_s:
            return 1
        need, k = self._cost / (BUDGET * self._iter_s), 1
        while k < need and k < MAX_EVERY:
            k *= 2
        self.wanted_most = max(self.wanted_most, k)
        return min(k, self.every_max)

    def _agree(self, step: int) -> None:
        """At each multiple of AGREE_EVERY (a step every rank's loop passes): apply the N the
        ranks agreed on at the previous one, and start the next agreement (non-blocking: the
        result has AGREE_EVERY iterations to arrive); once more early, FIRST_AGREE_AFTER steps
        after the first (every rank restored the same step, so starts at the same one).
        Every rank switches at the same step, so the ranks' snapshot steps (multiples of N)
        stay equal."""
        early = self._first is not None and step == self._first + FIRST_AGREE_AFTER
        if step % AGREE_EVERY and not early:
            return
        if self.every_max == 1:
            # N cannot change (the default cap): no all-reduce. wanted() still records the N the
            # budget asks for, which the report names when the tier costs more than its 2 %.
            self.wanted()
            return
        if self._agreeing is not None:
            self.every = 1 << self._agreeing.wait()
        self._agreeing = self.transport.start_max(self.wanted().bit_length() - 1)

    def snapshot(self, step: int, tree: Any, *, started: float | None = None) -> None:
        """Keep ``tree`` (this rank's state before iteration ``step``) here and on the partners.
        ``started``: the ``time.perf_counter()`` at which the caller began building ``tree``
        (``recovery.snapshot_tree``: the state_dicts and the RNG states, about a third of a
        snapshot's cost after the sleep of the DDP example's step), counted as the tier's
        time: without it the adaptive N saw two thirds of the cost and kept N = 1 where that
        cost the job more than its 2 % (benchmarks/node_death.md, session 21)."""
        if not self.taken:  # every rank's first snapshot is at the same step: meet the keepers there
            self.transport.ready()
        t0 = time.perf_counter() if started is None else started
        c1 = time.thread_time()
        t1 = time.perf_counter()
        got = self._encoder.parts(step, self.rank, tree)
        t2 = time.perf_counter()
        if isinstance(got, bytearray):  # outside the encoder's fast path: a blob of its own
            size = len(got)
            slot = self.tier.write(self.rank, step, got)
        else:  # framed straight into the slot: the tensors' bytes copied once
            head, raws = got
            size = memory.framed_size(head, raws)
            slot = self.tier.write_with(self.rank, step, size,
                                        lambda out: memory.assemble_into(out, step, self.rank, head, raws))
        t3 = time.perf_counter()
        if self.partners:
            self.transport.send(step, slot)
        self.taken += 1
        self.bytes = size
        spent = time.perf_counter() - t0
        for k, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t0 + spent - t3), strict=True):
            self.phases[k] += dt
        # This thread's CPU from the encode on (wall minus it: waiting for a core)
        self.phases_cpu += time.thread_time() - c1
        self.seconds += spent
        self.by_every.setdefault(self.every, [0.0, 0.0, 0])[0] += spent
        if self.taken > 1 and self.adaptive and self.every_max == 1:
            # N cannot change (the default cap): the cost model only tells the report which N the
            # budget would ask for, so it is updated once per AGREE_EVERY snapshots, over their
            # mean: reading the idle cores costs a system call on the training thread (2-8 us,
            # 50-80 after the DDP example's sleep; benchmarks/node_death.md, session 34).
            window = self._window
            window[0] += spent
            window[1] += 1
            if window[1] < AGREE_EVERY:
                return
            spent, count = window[0] / window[1], window[1]
            window[0], window[1] = 0.0, 0
        else:
            count = 1
        # One snapshot's cost to this rank: its own seconds here, and the CPU its replica keeper
        # spent since the last one (its blob sent, the partners' replicas of the same steps
        # received and copied here), less what the rank's cores left idle
        # meanwhile: off the training thread, the helpers take a core from training only where
        # none stood idle (one core per task, bound; not known: all of it is charged).
        off_thread = self.transport.thread_cpu_s
        helpers = off_thread - self._off_thread
        idle = self._idle.idle_s() if self._idle is not None else None
        charged = helpers if idle is None else max(0.0, helpers - idle)
        self.charged_s += charged
        cost = spent + charged / count
        self._off_thread = off_thread
        if self.taken == 1:
            # A process's first snapshot pays once for what the next ones do not (MPI's first
            # message to each partner, the tier's first files, the encoder's first walk): in
            # the PPO job its first iterations' tier cost was ~10x the steady one, so a restart
            # agreed on N = 8 and a node death 24 iterations later lost up to 5 (session 26).
            return
        if self.taken <= 1 + WARM_SNAPSHOTS:
            # The next few: the cheapest of them, not their mean. The early agreement comes
            # after two; one slow one (a first receipt, a partner's first message) set N = 8
            # or 16 for a restart's first iterations. Too low an N costs a few iterations at
            # more than 2 % until the next agreement; too high one risks that many iterations.
            self._cost = cost if self._cost is None else min(self._cost, cost)
            return
        self._cost = cost if self._cost is None else 0.8 * self._cost + 0.2 * cost

    def summary(self) -> dict[str, Any]:
        """The ``memory_tier`` event's fields: what the tier did and cost this rank."""
        failed, why = self.transport.replica_failures
        return {"snapshots": self.taken, "seconds": round(self.seconds, 4), "bytes": self.bytes,
                "phase_s": {k: round(v, 4) for k, v in self.phases.items()},
                "phase_cpu_s": round(self.phases_cpu, 4),
                "replica_thread_cpu_s": round(self.transport.thread_cpu_s, 4),
                "helper_cpu_charged_s": round(self.charged_s, 4),
                "replicas_skipped": self.transport.skipped,
                "every": self.every, "partners": self.partners,
                **({"every_max": self.every_max, "wanted_most": self.wanted_most} if self.adaptive else {}),
                "by_every": {str(n): {"seconds": round(t, 4), "wall_s": round(w, 3), "iterations": k}
                             for n, (t, w, k) in sorted(self.by_every.items())},
                **({"replication_error": str(err)} if (err := getattr(self.transport, "error", None)) else {}),
                **({"replica_write_failures": failed, "replica_write_error": why} if failed else {})}

    def close(self, remove: bool = False) -> None:
        """Collective: every send delivered and written before any rank leaves.
        ``remove``: the run is over; each node's lowest rank deletes the node's snapshots."""
        if self._agreeing is not None:  # every rank started it at the same step
            self._agreeing.wait()
            self._agreeing = None
        self.transport.drain()  # every replica sent to this rank, copied here
        if self._idle is not None:
            self._idle.close()
            self._idle = None
        if remove:
            self.transport.close()  # the keeper ends (else with the process: its socket closes)
            self.transport.barrier()  # every rank is past its last write
            if min(r for r, n in enumerate(self.nodes) if n == self.node) == self.rank:
                import shutil

                shutil.rmtree(self.tier.dir, ignore_errors=True)
        self.tier.close()  # the maps (the slots stay on the tmpfs unless removed)

    # ------------------------------------------------------------ restore
    def restore(self) -> RestoreOutcome:
        """Collective. The newest step every rank holds a verified copy of, loaded on its owner."""
        t0 = time.perf_counter()
        out = RestoreOutcome()
        lead = min(r for r, n in enumerate(self.nodes) if n == self.node) == self.rank
        # [owner, steps] pairs, not a dict: the gloo transport sends JSON (string keys only).
        held = self.transport.allgather([[o, s] for o, s in sorted(self.tier.held().items())] if lead else None)
        holders: dict[int, dict[int, list[int]]] = {}  # owner -> step -> holder ranks
        for r, h in enumerate(held):
            for owner, steps in h or []:
                if 0 <= owner < self.size:
                    # A copy on the owner's own node is read by the owner (no transfer).
                    holder = owner if self.nodes[owner] == self.nodes[r] else r
                    for s in steps:
                        holders.setdefault(owner, {}).setdefault(s, []).append(holder)
        common = set.intersection(*(set(holders.get(o, {})) for o in range(self.size))) if self.size else set()
        if not common:
            missing = [o for o in range(self.size) if not holders.get(o)]
            out.reason = (f"no step every rank holds in memory (ranks with no copy on a live node: {missing})"
                          if missing else "no step every rank holds in memory")
            out.seconds = time.perf_counter() - t0
            return out
        for step in sorted(common, reverse=True):
            got = self._load_step(step, holders, out)
            if got is not None:
                out.step, out.tree = step, got
                break
        else:
            out.reason = "every memory copy of the candidate steps failed verification"
        out.seconds = time.perf_counter() - t0
        return out

    def _load_step(self, step: int, holders: dict[int, dict[int, list[int]]], out: RestoreOutcome) -> Any:
        """This rank's tree at ``step`` when every owner got a verified copy; else None (all ranks agree)."""
        # Holder order per owner: the owner itself (no transfer), then the others by rank.
        order = {o: sorted(holders[o][step], key=lambda h: (h != o, h)) for o in range(self.size)}
        pick = dict.fromkeys(range(self.size), 0)
        mine: dict[int, bytes] = {}  # owner -> a verified blob this rank holds for it
        while True:
            problems = []
            for owner in range(self.size):
                if order[owner][pick[owner]] == self.rank and owner not in mine:
                    where = f"rank {owner} step {step} held on {self.node}"
                    try:
                        blob = self.tier.read(owner, step)
                        head = memory.verify(blob, where)
                        if head["owner"] != owner or head["step"] != step:
                            raise CheckpointError(f"{where}: blob says rank {head['owner']} step {head['step']}")
                        mine[owner] = blob
                    except CheckpointError as exc:
                        problems.append({"owner": owner, "holder": self.rank, "node": self.node,
                                         "step": step, "error": str(exc)})
            bad = [p for ps in self.transport.allgather(problems) for p in ps]
            out.rejected += bad
            if not bad:
                break
            for p in bad:
                pick[p["owner"]] += 1
            if any(pick[o] >= len(order[o]) for o in range(self.size)):
                return None  # some rank has no verified copy: every rank drops this step
        holder_of = {o: order[o][pick[o]] for o in range(self.size)}
        out.sources = [{"rank": o, "holder": h, "node": self.nodes[h],
                        "kind": "own" if h == o else "replica"} for o, h in holder_of.items()]
        out.source = out.sources[self.rank]
        sends = {o: mine[o] for o, h in holder_of.items() if h == self.rank and o != self.rank}
        own = holder_of[self.rank] == self.rank
        got = self.transport.exchange(sends, None if own else holder_of[self.rank])
        blob: Any = mine[self.rank] if own else got
        _head, tree = memory.decode(blob, f"rank {self.rank} step {step} from {self.nodes[holder_of[self.rank]]}")
        # The copy arrived intact everywhere (a failure here raised on its owner: the world aborts).
        self.transport.barrier()
        return tree
