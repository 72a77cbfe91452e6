"""The executor: this rank's share of the plan, iteration after iteration.

Each rank runs the template actions of its component, one iteration after
the other (a component's iterations never overlap: gradient state is per
iteration). Components overlap each other: a rollout rank keeps collecting
for the next iterations while the learner trains, as far as its tolerance
window allows.

Dependencies (``{"id": X, "lag": k}``: X of iteration i-k):
- same component: local order (done set);
- on another component's ``rollout``: a *data* message per feeding rank
  (batch sent point-to-point, rollout rank j feeds learner rank j mod L);
- on any other action of another component (optimize / weight sync): a
  *state* message from that component's leader carrying ``policy_state()``;
  the consumer loads EXACTLY the state sent at iteration
  ``producer.last_run_at_or_before(i - lag_eff)`` (runtime/state_history.py),
  so timing never decides which policy version a rollout uses. Weight sends
  are non-blocking.

Checkpoints: every component saves its own state at every checkpoint
boundary b (b = i + 1 where a ``checkpoint`` action, on any component, runs
at i), at the START of iteration b: a rank that runs ahead saves the state
it had before b, not the one it has when the learner gets there. The state
producer's leader also saves the state messages consumers of iterations >= b
still need (``pipeline``) and sends them again, with their original labels,
when it restores.

Staleness: the planner writes a rollout's tolerance window w as lag 1 + w on
its weight dep; the executor caps it at 1 + pipeline_window. ``training.mode:
coarse`` (or pipeline_window 0) is the synchronous loop: rollout(i) waits for
the weights of iteration i-1 and the learner waits for rollout(i).

Gradient ``sync`` (runtime/grad_sync.py): bucketed async all-reduces
(torch.distributed, gloo on CPU). Buckets start during the backward of the
last micro-batch, as soon as their gradients are final (autograd hooks), the
sync action starts the rest, and the first action that depends on the sync
waits: the reduction overlaps the backward and whatever runs in between.
``HETRUN_SYNC_OVERLAP=0`` turns the hooks off; ``HETRUN_BUCKET_MB`` sizes
buckets (default 1).

Stop agreement (preemption): the run API's (``hetrun.runtime.api.stop.
IterationAgreement``, what ``run.should_stop`` uses with stride 1): every rank
puts its local stop flag into a tiny non-blocking all-reduce when it starts an
iteration, and starts iteration k only once the agreement of iteration k-D is
known, so all ranks stop before the same iteration and checkpoint the same one.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetrun.dag.routing import enforced_lag, fed_ranks, feeding_ranks

from hetrun.errors import HetrunError, RuntimeFailure

from . import mpi_wait, preempt, recovery
from .api.collectives import MPIMaxReduce
from .api.run import save_state
from .api.stop import IterationAgreement
from .context import RankContext
from .dispatch import (
    IterState,
    checkpoint_boundary,
    micro_batches_of,
    peak_memory_bytes,
    run_dispatch,
    saves_at_end,
    sends_state_across,
    sub_actions,
)
from .events import EventLog
from .gc_pause import collector_paused
from .hooks import Hooks, load_hooks
from .plan_view import ActionSpec, Dep, PlanView
from .state_history import StateHistory, pick_for
from .workload import load_workload_class, workload_search_dirs

EXIT_OK = 0


class RankFailed(Exception):
    """An action raised; carries which one for the error event."""

    def __init__(self, action: str | None, iteration: int | None, cause: BaseException,
                 waiting_on: list[int] | None = None) -> None:
        super().__init__(f"{action}@{iteration}: {cause}")
        self.action = action
        self.iteration = iteration
        self.cause = cause
        # A timed-out wait: the other components' ranks whose message never came (a hung
        # rank's peers name it; the post-mortem and node recovery blame its node, not theirs).
        self.waiting_on = waiting_on or []


def effective_lag(plan: PlanView, consumer: ActionSpec, dep: Dep, producer: ActionSpec) -> int:
    """The lag the executor enforces for ``dep`` of ``consumer`` (the rule is the
    planner's: ``hetrun.dag.routing.enforced_lag``)."""
    return enforced_lag(dep.lag, producer.component == consumer.component, plan.mode,
                        plan.pipeline_window)


def agreement_window(plan: PlanView) -> int:
    """D of the stop agreement: the largest lag the executor enforces between
    components (at least 1).

    A rank that starts iteration k needs agreement k-D to be complete, i.e.
    every rank to have started k-D. The cross-component deps already keep a
    rank at most that far ahead of the ranks it depends on, and ranks of one
    component are bound to one iteration by the gradient all-reduce, so this
    gate does not cut into the pipelining it was sized from.
    """
    by_id = {a.id: a for a in plan.actions}
    lags = [effective_lag(plan, a, d, by_id[d.id]) for a in plan.actions for d in a.deps
            if d.id in by_id and by_id[d.id].component != a.component]
    return max([1, *lags])


def evals_not_here(actions: list[ActionSpec], comp_rank: int) -> frozenset[str]:
    """The eval actions this rank passes: on a component that rolls out, only its first rank
    evaluates. Every rollout rank holds the same policy version and evaluation is seeded by
    (seed, version), so the others would repeat the same episodes for the same result."""
    if comp_rank == 0 or not any(a.type == "rollout" for a in actions):
        return frozenset()
    return frozenset(a.id for a in actions if a.type == "eval")


@dataclass
class _Sync:
    gs: Any  # grad_sync.BucketedGradSync
    started: float
    nbytes: int
    action: ActionSpec
    iteration: int
    sub_id: str


class Executor:
    """Runs one rank of a plan under MPI (see runtime/inprocess.py for one process)."""

    def __init__(self, plan: PlanView, world: Any, log: EventLog, run_dir: Path,
                 hooks: Hooks | None = None) -> None:
        import torch

        from .comms.p2p import Mailbox

        self.plan = plan
        self.world = world
        self.log = log
        self.run_dir = run_dir
        self.me = world.component.name
        self.actions = plan.actions_of(self.me)
        self.not_here = evals_not_here(self.actions, world.comp_rank)
        self.by_id = {a.id: a for a in plan.actions}
        self.hooks = hooks or load_hooks()
        use_cuda = world.component.gpus_per_node > 0 and torch.cuda.is_available()
        if world.size > 1:
            world.init_torch(use_cuda=use_cuda)
        device = "cpu"
        if use_cuda:
            local = world.node_rank % max(1, torch.cuda.device_count())
            torch.cuda.set_device(local)
            device = f"cuda:{local}"
        self.ctx = RankContext(
            rank=world.rank, world_size=world.size, component=self.me,
            comp_rank=world.comp_rank, comp_size=world.comp_size, group=world.torch_group,
            comm=world.comp_comm, device=device, seed=plan.seed, run_dir=run_dir,
            node=world.node, node_comm=world.node_comm, world_comm=world.comm,
            world_group=world.torch_world, comp_ranks=world.comp_ranks, plan=plan,
            mode="mpi", comms=plan.comms,
        )
        self.mailbox = Mailbox(world.comm)
        self.timeout_s = world.timeout_s
        self._init_routes()
        self._init_node_sharing()
        # inbox: data[(producer id, iteration)] = {source rank: Message}
        self.data: dict[tuple[str, int], dict[int, Any]] = defaultdict(dict)
        # Received state messages per producer id, as many as the exact-version rule needs.
        self.states: dict[str, StateHistory] = {}
        # Sent state messages per own producer id (component leader): saved with the
        # checkpoint and sent again on restore, so consumers see the same versions.
        self.sent: dict[str, StateHistory] = {}
        self.loaded_version: int | None = None
        self.loaded_from: tuple[str, int] | None = None  # (producer, label) of the loaded state
        self.version = 0  # optimize steps taken on this rank
        self.syncs: dict[str, _Sync] = {}
        self.stop_level = 0  # this rank's local preemption request (0 none, 1 requeue, 2 TERM)
        self._told_hooks = False
        self.agreement: IterationAgreement | None = None
        self.memory: Any = None  # runtime/memory_tier.MemorySnapshots when the memory tier is on
        self.workload: Any = None
        self.num_micro = micro_batches_of(plan, self.me)
        self.overlap: Any = None  # grad sync armed for the last backward of this iteration
        self.grad_sync_id = next(
            (a.id for a in self.actions for _, kind, _ in sub_actions(plan, a)
             if kind == "sync" and not sends_state_across(plan, a)), None)

    # ----------------------------------------------------------------- routes
    def _init_routes(self) -> None:
        plan, me = self.plan, self.me
        ranks = self.world.comp_ranks
        self.in_data: dict[str, list[int]] = {}  # producer id -> global ranks feeding me
        self.in_state: dict[str, int] = {}  # producer id -> global rank of its leader
        self.out_data: dict[str, list[int]] = {}  # my action id -> global ranks I feed
        self.out_state: dict[str, list[int]] = {}  # my action id -> global ranks to send state to
        self.lags: dict[tuple[str, str], int] = {}
        # The largest lag a consumer has on a state producer: how far back its history reaches.
        self.keep_in: dict[str, int] = {}  # producer id -> max lag of my actions on it
        self.keep_out: dict[str, int] = {}  # my producer id -> max lag of other components on it
        for consumer in plan.actions:
            for dep in consumer.deps:
                producer = self.by_id[dep.id]
                lag = self.lags[(consumer.id, dep.id)] = effective_lag(plan, consumer, dep, producer)
                if producer.component == consumer.component:
                    continue
                if producer.type != "rollout":
                    if consumer.component == me:
                        self.keep_in[producer.id] = max(lag, self.keep_in.get(producer.id, 0))
                    if producer.component == me:
                        self.keep_out[producer.id] = max(lag, self.keep_out.get(producer.id, 0))
                src, dst = ranks[producer.component], ranks[consumer.component]
                is_data = producer.type == "rollout"
                if consumer.component == me:
                    if is_data:
                        idx = dst.index(self.world.rank)
                        self.in_data[producer.id] = [
                            src[j] for j in feeding_ranks(len(src), len(dst), idx)]
                    else:
                        self.in_state[producer.id] = src[0]
                if producer.component == me:
                    if is_data:
                        idx = src.index(self.world.rank)
                        targets = [dst[d] for d in fed_ranks(len(src), len(dst), idx)]
                        self.out_data.setdefault(producer.id, [])
                        for t in targets:
                            if t not in self.out_data[producer.id]:
                                self.out_data[producer.id].append(t)
                    elif self.world.comp_rank == 0:
                        self.out_state.setdefault(producer.id, [])
                        for t in dst:
                            if t not in self.out_state[producer.id]:
                                self.out_state[producer.id].append(t)

    # ------------------------------------------------- node-local weight fan-out
    def _init_node_sharing(self) -> None:
        """Opt-in (``HETRUN_SHARED_WEIGHTS=1`` in the job env): weights to a node once.

        For each state producer, the consumer ranks of one node form a group;
        the producer's leader sends each new version to the group's first rank
        only, which publishes it in the group's MPI shared-memory windows
        (runtime/shared_ring.py: one window per version the exact-version
        rule may still need); the others load from the windows. The
        wire transfer and the receive buffer then exist once per node, not
        once per rank. Every rank computes the same groups (collective-safe).
        """
        from mpi4py import MPI

        self.shared: dict[str, Any] = {}
        self._shared_groups: dict[str, Any] = {}  # producer id -> (sub comm, leader, src)
        enabled = os.environ.get("HETRUN_SHARED_WEIGHTS", "0") == "1"
        nodes = mpi_wait.allgather(self.world.comm, self.world.node) if enabled else []
        if not enabled:
            return
        links = sorted({(d.id, c.component) for c in self.plan.actions for d in c.deps
                        if self.by_id[d.id].component != c.component
                        and self.by_id[d.id].type != "rollout"})
        for producer_id, consumer in links:
            ranks = self.world.comp_ranks[consumer]
            groups: dict[str, list[int]] = {}
            for r in ranks:
                groups.setdefault(nodes[r], []).append(r)
            leaders = {g[0]: g for g in groups.values() if len(g) >= 2}
            if producer_id in self.out_state:
                # Send once per shared node group, to its first rank.
                self.out_state[producer_id] = [
                    t for t in self.out_state[producer_id]
                    if t in leaders or not any(t in g for g in leaders.values())]
            if self.me != consumer:
                continue
            names = sorted(groups)
            mine = groups[self.world.node]
            color = names.index(self.world.node) if len(mine) >= 2 else MPI.UNDEFINED
            sub = mpi_wait.split(self.world.comp_comm, color, self.world.rank)
            if len(mine) >= 2:
                self._shared_groups[producer_id] = (sub, mine[0], self.in_state[producer_id])

    def _open_shared_windows(self) -> None:
        from .shared_ring import SharedRing
        from .shared_weights import SharedWeights

        for producer_id in sorted(self._shared_groups):
            sub, leader, src = self._shared_groups[producer_id]
            template = None
            if self.world.rank == leader:
                # The producer sends its initial state first thing: wait for it.
                while producer_id not in self.states:
                    self._accept(self.mailbox.recv_from(src))
                template = self.states[producer_id].items[-1][1].tensors
            # The stop agreement keeps every rank within D iterations of the producer:
            # a reader needs a label >= m - D - L when label m is published.
            versions = self.keep_in.get(producer_id, 0) + agreement_window(self.plan) + 1
            shared = SharedRing([SharedWeights.create(sub, template) for _ in range(versions)])
            if self.world.rank == leader:
                for label, msg in self.states[producer_id].items:
                    shared.publish(msg.tensors, label)
            mpi_wait.meet(sub)
            self.shared[producer_id] = shared
            self.log.emit("shared_weights", producer=producer_id, group_size=sub.Get_size(),
                          bytes=shared.nbytes, leader=leader, versions=versions)

    # ------------------------------------------------------------------- run
    def run(self) -> int:
        # The workload's imports, its model and optimizer (whose first use imports
        # torch._dynamo) and the restore: runtime/gc_pause.py.
        with collector_paused(then_freeze=True):
            start = self._start()
        assert self.agreement is not None
        last_done = start - 1
        for it in range(start, self.plan.iterations):
            self._await_agreement(it)
            if self.agreement.should_stop_before(it):
                break
            self.ctx.iteration = it
            self._check_stop(it)
            self.agreement.contribute(it, self.stop_level)
            self._prune_histories(it)
            if it > start and checkpoint_boundary(self.plan, it):
                self._save_boundary(it)
            if self.memory is not None and it > start and self.memory.due(it):
                # The state an interval checkpoint at `it` would hold, into peer memory.
                recovery.take_snapshot(self.memory, self.workload, it, self._pipeline_state())
            self._run_iteration(it)
            last_done = it
        self._wind_down()
        return self._end(last_done)

    def _start(self) -> int:
        """The workload, restored, and the pipeline primed; the iteration to start at."""
        from .ckpt.state import seed_global_rngs

        wl_cls = load_workload_class(self.plan.workload, workload_search_dirs(self.plan, self.run_dir))
        seed_global_rngs(self.ctx.rank_seed)  # runs of one job save the same RNG states
        try:
            self.workload = wl_cls(self.ctx, **self.plan.workload_args)
        except HetrunError:
            raise
        except Exception as exc:
            raise RankFailed("workload.__init__", None, exc) from exc
        # resume.restore_if_any writes the restore event (restarts, work lost); with the
        # memory tier on, runtime/recovery.py first tries peer-memory snapshots.
        if recovery.restarts_in_allocation(self.plan) and self.world.node_rank == 0:
            recovery.start_heartbeat(self.run_dir, self.world.node)
        if recovery.enabled(self.ctx):
            start, self.memory = recovery.restore(self.ctx, self.workload, self.hooks.restore)
        else:
            start = self.hooks.restore(self.ctx, self.workload)
        if start:
            self.version = start
        self._restore_pipeline(self.hooks.restored_pipeline(self.ctx))
        self.agreement = IterationAgreement(MPIMaxReduce(self.world.comm), agreement_window(self.plan),
                                            start)
        self._send_initial_states(start)
        self._open_shared_windows()
        return start

    def _wind_down(self) -> None:
        """After the last iteration this rank starts: complete what is in flight."""
        assert self.agreement is not None
        self._finish_syncs()
        # Every rank posted the same agreements (all of them started exactly
        # the iterations below the stop): completing them is collective-safe.
        self.agreement.close()
        dropped = self.mailbox.drain(self._accept)
        if dropped:
            self.log.emit("drain", dropped=dropped)
        for shared in self.shared.values():
            shared.free()  # collective over the node group; every member is here
        self.shared.clear()

    def _end(self, last_done: int) -> int:
        """The agreed stop's checkpoint, or the final one; the exit code."""
        assert self.agreement is not None
        code = EXIT_OK
        stop_at = self.agreement.stop_at
        if stop_at is not None and stop_at < self.plan.iterations:
            resume_at = min(last_done + 1, stop_at)
            if not self._told_hooks:
                self._told_hooks = True
                self.hooks.agreed_stop(self.agreement.level)
            self.log.emit("preempt", iteration=resume_at, agreed_at=self.agreement.stopped_at_iteration,
                          window=self.agreement.window, signalled=bool(self.stop_level))
            self._checkpoint(resume_at, reason="preempt")
            code = self.hooks.stop_exit_code(self.ctx)
            if code in (preempt.EXIT_REQUEUE, preempt.EXIT_TERMINATED):
                preempt.say_clean_stop(self.ctx.component, self.ctx.rank, code, resume_at)
        elif last_done + 1 == self.plan.iterations and saves_at_end(self.plan, last_done + 1):
            end = last_done + 1
            self._checkpoint(end, reason="interval" if checkpoint_boundary(self.plan, end) else "final")
        if self.memory is not None:
            # Collective: every replica in flight delivered; a finished run frees the node's memory.
            self.memory.close(remove=code == EXIT_OK and last_done + 1 == self.plan.iterations)
            self.log.emit("memory_tier", **self.memory.summary())
        flushed = self.hooks.flush_checkpoints(self.ctx)
        if isinstance(flushed, dict) and flushed.get("ok") is False:
            self.log.emit("warning", message=f"last checkpoint write failed: {flushed.get('error')}")
        recovery.stop_heartbeat()
        return code


    def _send_initial_states(self, start: int) -> None:
        # Consumers wait for a state labelled >= start-1 before their first
        # action. After a restore the saved history goes first, with its
        # original labels: the versions consumers of iterations >= start load.
        for producer_id, targets in self.out_state.items():
            history = self.sent.get(producer_id)
            for label, tensors in list(history.items) if history is not None else []:
                self._send_state(producer_id, label, targets, tensors)
            if history is None or history.newest is None or history.newest < start - 1:
                self._send_state(producer_id, start - 1, targets)

    # ----------------------------------------------------- pipeline in flight
    def _prune_histories(self, it: int) -> None:
        """Before iteration ``it``: drop state messages no iteration >= it can load."""
        for producer_id, history in self.states.items():
            history.prune(it - self.keep_in.get(producer_id, 0))
        for producer_id, history in self.sent.items():
            history.prune(it - self.keep_out.get(producer_id, 0))

    def _pipeline_state(self) -> dict[str, Any] | None:
        """What the checkpoint holds of the pipeline: the sent states consumers still need."""
        if not self.sent:
            return None
        return {"sent": {pid: [{"iteration": label, "state": tensors} for label, tensors in h.items]
                         for pid, h in sorted(self.sent.items())}}

    def _restore_pipeline(self, saved: Any) -> None:
        if not isinstance(saved, dict) or not isinstance(saved.get("sent"), dict):
            return
        for pid, items in saved["sent"].items():
            if pid in self.out_state:
                self.sent[pid] = StateHistory([(int(x["iteration"]), x["state"]) for x in items])

    def _save_boundary(self, boundary: int) -> None:
        """Every component's state at a checkpoint boundary, whichever carries the action."""
        self._checkpoint(boundary, reason="interval")

    def _run_iteration(self, it: int) -> None:
        # An action that does not run at `it` (``every`` > 1) is passed at once, without
        # waiting for its dependencies: it reads nothing and changes nothing, so the wait
        # would only stall the rank (an every-5 eval on a learner's lag-0 weights held a
        # rollout rank to the learner every iteration). Its same-iteration dependents still
        # check their own deps; those that run load what the exact-version rule names.
        # So is an evaluation this rank leaves to its component's first rank (evals_not_here).
        pending = [a for a in self.actions if a.runs_at(it) and a.id not in self.not_here]
        done = {a.id for a in self.actions if a.id not in {p.id for p in pending}}
        state = IterState()
        while pending:
            ready = [a for a in pending if self._ready(a, it, done)]
            if not ready:
                self._wait_for_progress(pending, it, done)
                continue
            action = max(ready, key=lambda a: a.priority)
            pending.remove(action)
            self._run_action(action, it, state)
            done.add(action.id)
            self._check_stop(it)
        # Data of this iteration is consumed; keep the inbox small.
        for key in [k for k in self.data if k[1] <= it - self._max_data_lag()]:
            del self.data[key]

    def _max_data_lag(self) -> int:
        lags = [self.lags[(a.id, d.id)] for a in self.actions for d in a.deps
                if d.id in self.in_data]
        return max(lags, default=0)

    # ------------------------------------------------------------------ deps
    def _waiting_on(self, pending: list[ActionSpec], it: int, done: set[str]) -> list[int]:
        """The other components' ranks whose message the pending actions still lack (``_ready``'s
        checks, per producer): a data dependency's senders that have not sent, a state
        dependency's sender. Empty when the wait is on this component alone."""
        silent: set[int] = set()
        for action in pending:
            for dep in action.deps:
                producer = self.by_id[dep.id]
                if producer.component == self.me:
                    continue
                src_it = it - self.lags[(action.id, dep.id)]
                if dep.id in self.in_data:
                    if src_it >= 0:
                        got = self.data.get((dep.id, src_it), {})
                        silent.update(r for r in self.in_data[dep.id] if r not in got)
                elif dep.id in self.shared:
                    if self.shared[dep.id].newest() < producer.last_run_at_or_before(src_it):
                        silent.update(self.world.comp_ranks[producer.component])
                elif dep.id in self.in_state:
                    history = self.states.get(dep.id)
                    if history is None or not history.covers(producer.last_run_at_or_before(src_it)):
                        silent.add(self.in_state[dep.id])
        return sorted(silent)

    def _ready(self, action: ActionSpec, it: int, done: set[str]) -> bool:
        for dep in action.deps:
            lag = self.lags[(action.id, dep.id)]
            src_it = it - lag
            producer = self.by_id[dep.id]
            if producer.component == self.me:
                if lag == 0 and dep.id not in done:
                    return False
                continue
            if dep.id in self.in_data:
                if src_it < 0:
                    continue
                got = self.data.get((dep.id, src_it), {})
                if any(r not in got for r in self.in_data[dep.id]):
                    return False
            elif dep.id in self.shared:
                if self.shared[dep.id].newest() < producer.last_run_at_or_before(src_it):
                    return False
            elif dep.id in self.in_state:
                history = self.states.get(dep.id)
                if history is None or not history.covers(producer.last_run_at_or_before(src_it)):
                    return False
        # A deferred sync is completed by its consumer, not waited on here.
        return True

    def _wait_for_progress(self, pending: list[ActionSpec], it: int, done: set[str]) -> None:
        t0 = time.monotonic()
        delay = 0.0002
        # Shared weight windows change without a message to this rank.
        seen = {k: w.newest() for k, w in self.shared.items()}
        while True:
            if self._pump() or self._check_stop(it):
                return
            if any(w.newest() != seen[k] for k, w in self.shared.items()):
                return
            waited = time.monotonic() - t0
            if waited > self.timeout_s:
                blocked = ", ".join(f"{a.id} (needs {[d.id for d in a.deps]})" for a in pending)
                silent = self._waiting_on(pending, it, done)
                comp_of = {r: c for c, ranks in self.world.comp_ranks.items() for r in ranks}
                names = ", ".join(f"{r} ({comp_of.get(r, '?')})" for r in silent)
                raise RankFailed(pending[0].id, it, RuntimeFailure(
                    f"rank {self.world.rank} ({self.me}) waited {waited:.0f}s in iteration {it} "
                    f"for {blocked}; no message arrived"
                    + (f" from rank(s) {names}: stuck, or dead" if silent else ""),
                    hint="a peer is stuck or dead; raise HETRUN_COLLECTIVE_TIMEOUT if an "
                         "action legitimately takes longer",
                ), waiting_on=silent)
            # Back off: ranks share cores with the ranks they wait for.
            time.sleep(delay)
            delay = min(delay * 2, 0.005)

    def _accept(self, msg: Any) -> None:
        if msg.kind == "data":
            self.data[(msg.producer, msg.iteration)][msg.source] = msg
        elif msg.kind == "state":
            self.states.setdefault(msg.producer, StateHistory()).add(msg.iteration, msg)
            shared = self.shared.get(msg.producer)
            if shared is not None:
                # Node leader: one copy for every consumer rank of this node.
                shared.publish(msg.tensors, msg.iteration)

    # ---------------------------------------------------------------- stop
    def _pump(self) -> int:
        """Accept every message that has arrived; returns how many."""
        n = 0
        while (msg := self.mailbox.poll()) is not None:
            self._accept(msg)
            n += 1
        return n

    def _check_stop(self, it: int) -> int:
        """Between actions: accept messages, advance the agreement, read the local flag.

        Returns how many messages were accepted. The flag goes into the
        agreement when the next iteration starts; asking here too arms the
        preemption watchdog as soon as the signal is seen.
        """
        got = self._pump()
        if self.agreement is not None:
            self.agreement.poll()
            if self.agreement.stop_at is not None and not self._told_hooks:
                self._told_hooks = True
                self.hooks.agreed_stop(self.agreement.level)
        if self.stop_level < 2:
            self.stop_level = max(self.stop_level, self.hooks.local_stop_level(self.ctx))
        return got

    def _await_agreement(self, it: int) -> None:
        """Before starting ``it``: wait (pumping messages) until agreement it-D is known."""
        assert self.agreement is not None
        t0 = time.monotonic()
        delay = 0.0002
        while not self.agreement.may_start(it):
            self._check_stop(it)
            if self.agreement.may_start(it):
                return
            waited = time.monotonic() - t0
            if waited > self.timeout_s:
                raise RankFailed("stop-agreement", it, RuntimeFailure(
                    f"rank {self.world.rank} ({self.me}) waited {waited:.0f}s before iteration {it} "
                    f"for the stop agreement of iteration {it - self.agreement.window}",
                    hint="a peer is stuck or dead; raise HETRUN_COLLECTIVE_TIMEOUT if an "
                         "iteration legitimately takes longer"))
            time.sleep(delay)
            delay = min(delay * 2, 0.005)

    def _progress_while(self, busy: Any) -> None:
        """Wait for ``busy()`` to turn false while keeping the agreement moving.

        A blocking wait outside MPI (a gloo all-reduce) would stop this rank's
        part of the non-blocking agreement; a peer gated on it would then
        never join that all-reduce.
        """
        delay = 0.0001
        while busy():
            if self.agreement is None or not self.agreement.pending:
                return  # nothing of ours to progress: a plain wait is fine
            self._check_stop(self.ctx.iteration or 0)
            time.sleep(delay)
            delay = min(delay * 2, 0.002)

    # --------------------------------------------------------------- actions
    def _run_action(self, action: ActionSpec, it: int, state: IterState) -> None:
        self._complete_syncs_for(action)
        self._load_states(action, it)
        try:
            run_dispatch(self, action, it, state)
        except RankFailed:
            raise
        except Exception as exc:
            raise RankFailed(action.id, it, exc) from exc

    # ------------------------------------------- the dispatch's ActionPort
    def rollout_version(self) -> int:
        return self.loaded_version if self.loaded_version is not None else self.version

    def incoming_batch(self, action: ActionSpec, it: int) -> Any:
        """The batches the feeding rollout ranks sent for ``action``, merged; None: none."""
        data_deps = [d for d in action.deps if d.id in self.in_data]
        if not data_deps:
            return None
        batches: list[Any] = []
        for dep in data_deps:
            got = self.data.get((dep.id, it - self.lags[(action.id, dep.id)]), {})
            batches.extend(got[r].tensors for r in self.in_data[dep.id])
        return self.workload.merge_batches(batches)

    def backward(self, micro: int, loss: Any) -> None:
        self._arm_overlap(micro)
        try:
            self.workload.backward(loss)
        finally:
            if self.overlap is not None:
                self.overlap.disarm()

    def grad_sync(self, action: ActionSpec, sub_id: str, it: int) -> int:
        return self._launch_grad_sync(action, sub_id, it)

    def before_optimize(self) -> None:
        self._finish_syncs()

    def optimized(self) -> int:
        self.version += 1
        return self.version

    def record_metrics(self, it: int, sub_id: str, metrics: dict[str, Any]) -> None:
        pass  # the action event carries them

    def event_deferred(self, action: ActionSpec) -> bool:
        # A plain sync's event is written when the reduction completes.
        return action.id in self.syncs and not action.fused

    def emit(self, kind: str, **fields: Any) -> None:
        self.log.emit(kind, **fields)

    def _load_states(self, action: ActionSpec, it: int) -> None:
        """Load the state the exact-version rule names for ``action`` at ``it``."""
        for dep in action.deps:
            src_it = it - self.lags[(action.id, dep.id)]
            shared = self.shared.get(dep.id)
            if shared is not None:
                label = shared.pick(src_it)
                if label is None:
                    label = min(shared.labels())  # restored without history: the oldest, as below
                if self.loaded_from != (dep.id, label):
                    self.workload.load_policy(shared.read(label, self.timeout_s), label + 1)
                    self.loaded_version = label + 1
                    self.loaded_from = (dep.id, label)
                continue
            history = self.states.get(dep.id) if dep.id in self.in_state else None
            picked = pick_for(history, src_it) if history else None
            if picked is None or self.loaded_from == (dep.id, picked[0]):
                continue
            msg = picked[1]
            version = int(msg.meta.get("version", msg.iteration + 1))
            self.workload.load_policy(msg.tensors, version)
            self.loaded_version = version
            self.loaded_from = (dep.id, picked[0])

    def send_outputs(self, action: ActionSpec, it: int, extra: dict[str, Any],
                     state: IterState) -> int:
        from .comms.p2p import pack

        nbytes = 0
        targets = self.out_data.get(action.id)
        if targets:
            buf = pack("data", action.id, it, state.batch, {"steps": extra.get("steps", 0)})
            for t in targets:
                nbytes += self.mailbox.isend(buf, t)
        if action.id in self.out_state:
            # Even after the last iteration: a lag-0 consumer (an evaluator) needs it.
            nbytes += self._send_state(action.id, it, self.out_state[action.id])
        return nbytes

    def _send_state(self, producer_id: str, it: int, targets: list[int],
                    tensors: dict[str, Any] | None = None) -> int:
        from .comms.p2p import pack

        if tensors is None:
            tensors = self.workload.policy_state()
        self.sent.setdefault(producer_id, StateHistory()).add(it, tensors)
        buf = pack("state", producer_id, it, tensors, {"version": it + 1})
        return sum(self.mailbox.isend(buf, t) for t in targets)

    # --------------------------------------------------------- gradient sync
    def _grad_sync(self, params: list[Any]) -> Any:
        from .grad_sync import BucketedGradSync

        mb = float(os.environ.get("HETRUN_BUCKET_MB", "1") or 1)
        return BucketedGradSync(params, self.world.torch_group, self.world.comp_size,
                                bucket_bytes=max(1, int(mb * (1 << 20))))

    def _arm_overlap(self, micro: int) -> None:
        """Before the last micro-batch's backward: buckets launch as gradients become final."""
        if (self.grad_sync_id is None or self.world.comp_size <= 1 or micro != self.num_micro - 1
                or os.environ.get("HETRUN_SYNC_OVERLAP", "1") == "0"):
            return
        self.overlap = self._grad_sync(list(self.workload.parameters_to_sync()))
        self.overlap.arm()

    def _launch_grad_sync(self, action: ActionSpec, sub_id: str, it: int) -> int:
        if self.world.comp_size <= 1:
            return 0
        gs = self.overlap or self._grad_sync(list(self.workload.parameters_to_sync()))
        self.overlap = None
        gs.launch_rest()
        started = gs.first_launch or time.time()
        self.syncs[action.id] = _Sync(gs, started, gs.nbytes, action, it, sub_id)
        return int(gs.nbytes)

    def _complete_syncs_for(self, action: ActionSpec) -> None:
        for dep in action.deps:
            if dep.id in self.syncs:
                self._complete_sync(dep.id)

    def _finish_syncs(self) -> None:
        for sid in list(self.syncs):
            self._complete_sync(sid)

    def _complete_sync(self, sync_id: str) -> None:
        s = self.syncs.pop(sync_id)
        wait0 = time.time()
        s.gs.launch_rest()
        self._progress_while(lambda: not all(h.is_completed() for h in s.gs.handles))
        s.gs.finish()
        end = time.time()
        # A sync fused into a bigger dispatch is reported as a part of it
        # ("part_of"), so reports do not count its time twice.
        fused = s.sub_id != sync_id
        self.log.emit(
            "action", type="sync", id=s.sub_id, iteration=s.iteration, start=s.started, end=end,
            bytes=s.nbytes, peak_mem=peak_memory_bytes(), overlapped=round(wait0 - s.started, 6),
            waited=round(end - wait0, 6), buckets=len(s.gs.buckets),
            launched_in_backward=s.gs.launched_in_backward,
            **({"part_of": sync_id} if fused else {}),
        )

    # ----------------------------------------------------------- checkpoints
    def _checkpoint(self, resume_at: int, reason: str) -> None:
        self._prune_histories(resume_at)  # the same content whichever path saves at resume_at
        save_state(self.ctx, self.log, self.workload, resume_at, reason=reason,
                   pipeline=self._pipeline_state())

