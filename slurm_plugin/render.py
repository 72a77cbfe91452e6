"""Render a plan into one sbatch script for a Slurm heterogeneous job.

The script has one ``#SBATCH`` block per het component (separated by
``#SBATCH hetjob``), then a bash body that starts the runtime on every rank
with one ``srun`` across all het groups, forwards the preemption signal to it,
and turns the runtime's exit code 85 ("checkpointed on a time-limit signal")
into ``scontrol requeue``.

What goes into the script is one typed ``BatchRequest``
(``batch_request.build_request``: built and gated once from the spec and the
placed plan); this module only writes it out. Output is deterministic for a
given (request, run_dir, python): golden files compare it byte for byte.
Values were gated by ``quoting`` when the request was built (see that module
for why ``#SBATCH`` lines are validated rather than quoted); the bash part
shell-quotes every word it writes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hetrun.rundir import (
    DEAD_NODES_PREFIX,
    HEARTBEAT_ENV,
    HEARTBEATS,
    IN_ALLOCATION_RESTARTS,
    LOGS,
    NODE_TIMEOUT_DEFAULT_S,
    NODE_TIMEOUT_ENV,
    SILENT_NODES_PREFIX,
    WARM_SOCKET_ENV,
    WARM_STEP_NAME,
    WARM_SWITCH_ENV,
)

from . import quoting
from .batch_request import BatchRequest, ComponentRequest, SlurmOptions, build_request
from .postmortem import KILL_MARK, SIGNAL_MARK

if TYPE_CHECKING:
    from hetrun.dag.plan import Plan
    from hetrun.dag.spec import JobSpec

REQUEUE_EXIT_CODE = 85
# Spare nodes: a node whose heartbeat has not changed for this long (seconds;
# $HETRUN_NODE_TIMEOUT overrides) is presumed dead by the batch script's monitor (docs/PREEMPTION.md).
NODE_TIMEOUT_S = NODE_TIMEOUT_DEFAULT_S
_LOGS = f'"$HETRUN_RUN_DIR"/{LOGS}'


def _component_block(c: ComponentRequest, name: str, opts: SlurmOptions) -> list[str]:
    lines = [
        f"--job-name={name}",
        f"--nodes={c.nodes + c.spare_nodes}",
        f"--ntasks-per-node={c.tasks_per_node}",
        f"--cpus-per-task={c.cpus_per_task}",
    ]
    if c.gpus_per_node:
        lines.append(f"--gres=gpu:{c.gpu_type}:{c.gpus_per_node}" if c.gpu_type else f"--gres=gpu:{c.gpus_per_node}")
    if c.mem_mb:
        lines.append(f"--mem={c.mem_mb}M")
    if c.nodelist:  # a start by preemption: the victims placement chose (Slurm adds idle nodes)
        lines.append(f"--nodelist={','.join(c.nodelist)}")
    for key in ("partition", "account", "qos", "time", "constraint"):
        value = c.partition if key == "partition" else getattr(opts, key)
        if value is not None:
            lines.append(f"--{key}={value}")
    lines.extend(opts.extra_component)
    return [f"#SBATCH {line}" for line in lines]


def srun_command(components: Sequence[str], run_dir: Path, python: str,
                 groups: Sequence[int] | None = None) -> list[str]:
    """The srun words that start the runtime on every rank of every component.

    One heterogeneous step (``srun A : B``, one part per het group) gives one
    MPI_COMM_WORLD with ranks numbered group after group. Each part names its
    component (``HETRUN_COMPONENT``): Slurm's het variables give each group's
    *allocated* tasks, not the step's, so with spare nodes in a group before
    another the ranks after it would count themselves into it. A part per group,
    rather than a single ``--het-group=0,1``, lets each component write its own
    ``logs/<component>-%j-%t.out`` (%j is the component's job id).
    """
    logs = quoting.sbatch_path(run_dir / "logs", "log directory")
    runtime = [python, "-m", "hetrun.runtime", str(run_dir)]
    groups = list(range(len(components))) if groups is None else list(groups)
    # A rank that dies (or exits non-zero, before MPI_Init included) must end
    # the step at once: its peers would otherwise wait in a collective until
    # HETRUN_COLLECTIVE_TIMEOUT. srun's own --kill-on-bad-exit=1 does end it,
    # but with SIGTERM, which the survivors take for a preemption (and srun
    # then waits KillWait): ~20 s measured. The batch script's srun reader
    # (srun_reader) SIGKILLs the step on the first death instead: 0.2-0.4 s.
    words = ["srun", "--mpi=pmix", "--kill-on-bad-exit=0"]
    if len(components) == 1 and groups == [0]:
        return [*words, f"--output={logs}/{components[0]}-%j-%t.out", *runtime]
    for i, (group, name) in enumerate(zip(groups, components, strict=True)):
        if i:
            words.append(":")
        words += [f"--het-group={group}", f"--output={logs}/{name}-%j-%t.out", "env",
                  f"HETRUN_COMPONENT={name}", *runtime]
    return words


def command_srun(comp: ComponentRequest, group: int, het_size: int, run_dir: Path, python: str) -> list[str]:
    """The srun words of a command component: its own step (its own rank space, no MPI),
    each rank through ``hetrun.runtime.command_rank``, which sets torchrun's variables
    and runs the user's argv (every word shell-quoted by the caller)."""
    assert comp.command is not None
    logs = quoting.sbatch_path(run_dir / "logs", "log directory")
    words = ["srun", "--mpi=none", "--kill-on-bad-exit=0"]
    if het_size > 1:
        words.append(f"--het-group={group}")
    return [*words, f"--output={logs}/{comp.name}-%j-%t.out",
            python, "-m", "hetrun.runtime.command_rank", str(run_dir), comp.name, "--", *comp.command]


def launch_steps(comps: Sequence[ComponentRequest], run_dir: Path, python: str) -> list[list[str]]:
    """One srun per job step: the action components together (one MPI world), then
    each command component alone (its own torchrun-style world)."""
    actions = [(i, c.name) for i, c in enumerate(comps) if c.command is None]
    steps = []
    if actions:
        steps.append(srun_command([n for _, n in actions], run_dir, python, [i for i, _ in actions]))
    steps += [command_srun(c, i, len(comps), run_dir, python) for i, c in enumerate(comps) if c.command is not None]
    return steps


def _launch_lines(steps: Sequence[list[str]], traps: Sequence[str]) -> list[str]:
    """Start the job's steps in the background, stderr to the reader's FIFO; ``$_hetrun_pid``
    is what the batch shell forwards signals to and waits for."""
    if len(steps) == 1:
        return [f'{quoting.sh_join(steps[0])} 2>"$_hetrun_fifo" &', "_hetrun_pid=$!"]
    lines = [
        "_hetrun_steps() {",
        "    # Several steps (command components run alone): forward the signals to each srun;",
        "    # the highest exit code wins, as srun's own over its tasks.",
        "    local pids=() rc=0 one p",
        *[f"    trap 'kill -s {s} \"${{pids[@]}}\" 2>/dev/null' {s}" for s in traps],
    ]
    for step in steps:
        lines += [f"    {quoting.sh_join(step)} &", "    pids+=($!)"]
    lines += [
        '    for p in "${pids[@]}"; do',
        '        while :; do wait "$p"; one=$?',
        '            if [ "$one" -gt 128 ] && kill -0 "$p" 2>/dev/null; then continue; fi; break; done',
        '        if [ "$one" -gt "$rc" ]; then rc=$one; fi',
        "    done",
        '    return "$rc"',
        "}",
        '_hetrun_steps 2>"$_hetrun_fifo" &',
        "_hetrun_pid=$!",
    ]
    return lines


# Slurm 22.05 srun can outlive its het step: every task has ended and the step
# has left squeue (sacct: COMPLETED/FAILED), yet srun never exits and the batch
# shell would wait until the time limit. Seen on this cluster: srun's step-wait
# thread blocks in mpi/pmix's pmixp_abort_agent_stop() joining an abort-agent
# thread that never leaves its poll loop, holding the launch lock, so srun also
# ignores SIGTERM. The watchdog ends such an srun (SIGKILL) after a grace
# period; the tasks' exit code then comes from accounting, so exit 85 still
# requeues. A step that ended before the first poll (tasks signalled at once)
# is never seen in squeue: accounting's start times tell it from an earlier
# attempt's steps, so such an srun is ended after the same grace, not after
# WATCHDOG_UNSEEN_S (seen once in CI: the test waited 60 s for the requeue).
# The spare-nodes monitor ends an srun still running this long after every rank's exit event
# and every node's heartbeat file removal (a rank stuck after its end; the batch log says so).
STUCK_AFTER_EXIT_S = 30
WATCHDOG_GRACE_S = 15
WATCHDOG_POLL_S = 3
WATCHDOG_UNSEEN_S = 60
WATCHDOG = [
    "",
    "_hetrun_job_steps() {",
    "    # $1: the job ids. The job's steps (id.N) squeue lists, one a line; fails as squeue",
    f"    # does. The warm servers' steps ({WARM_STEP_NAME}, spare nodes) are not the ranks' step:",
    "    # left out, or with $2 = warm, the only ones listed.",
    "    local out",
    "    out=$(squeue -h -s -j \"$1\" -o '%i %j' 2>/dev/null) || return 1",
    f"    printf '%s\\n' \"$out\" | awk -v warm=\"${{2:-}}\" '$1 ~ /[.][0-9]+$/ && ($2 == \"{WARM_STEP_NAME}\") == (warm == \"warm\") {{print $1}}'",
    "}",
    '_hetrun_stuck="$HETRUN_RUN_DIR/logs/.srun-outlived-step-${SLURM_JOB_ID}"',
    'rm -f "$_hetrun_stuck"',
    "_hetrun_step_rc() {",
    "    # Prints the highest task exit code over the step's het components (signal N: 128+N)",
    "    # once accounting has the step and none of it still runs; prints nothing before.",
    "    # $1 (optional): epoch second; steps that began before it are not counted.",
    "    # $2 (optional): step numbers, space-separated; only those steps are counted.",
    '    SLURM_TIME_FORMAT=%s sacct -n -P -j "$SLURM_JOB_ID" -o JobID,State,ExitCode,Start,JobName 2>/dev/null |',
    f'        awk -F"|" -v since="${{1:-0}}" -v steps="${{2:-}}" -v warm={WARM_STEP_NAME} \'',
    "        BEGIN { split(steps, s, \" \"); for (i in s) want[s[i]] = 1 }",
    "        match($1, /[.][0-9]+$/) && $5 != warm && $4 + 0 >= since + 0 && (steps == \"\" || substr($1, RSTART + 1) in want) {",
    "                           if ($2 ~ /RUNNING|PENDING|COMPLETING/) busy = 1",
    "                           split($3, e, \":\"); c = e[2] > 0 ? 128 + e[2] : e[1]",
    "                           if (c > max) max = c; n++ }",
    "        END { if (n && !busy) print max + 0 }\'",
    "}",
    "_hetrun_exits_rc() {",
    "    # Once every rank has an exit event since this srun started (each event's own time): their",
    "    # highest code; nothing before. Ranks, not events: a command component's rank writes two",
    "    # (its script's, through the run API, then its wrapper's). Set only where one srun runs the",
    "    # ranks (no restart inside the allocation).",
    '    [ -n "${_hetrun_exit_ranks:-}" ] && [ -n "${HETRUN_SRUN_START:-}" ] || return 0',
    "    grep -F '{\"ev\":\"exit\",' \"$HETRUN_RUN_DIR/events.jsonl\" 2>/dev/null \\",
    "        | sed -n 's/.*\"rank\":\\([0-9][0-9]*\\),.*\"code\":\\(-\\{0,1\\}[0-9][0-9]*\\),.*\"time\":\\([0-9][0-9.]*\\).*/\\1 \\2 \\3/p' \\",
    '        | awk -v n="$_hetrun_exit_ranks" -v since="${HETRUN_SRUN_START%[.,]*}" \\',
    "            '$3 >= since - 1 { if (!k || $2 > m) m = $2; if (!($1 in r)) { r[$1] = 1; k++ } }",
    "             END { if (k >= n) print m }'",
    "}",
    "_hetrun_watchdog() {",
    "    # $1: the job ids of the het components, comma-separated.",
    f"    local gone=0 seen=0 waited=0 exited=0 since='' steps rc mine='' grace={WATCHDOG_GRACE_S}",
    "    # The batch shell sends USR2 here when Slurm signals the job (preemption, time limit):",
    "    # Slurm kills it KillWait (or GraceTime) later, so a stuck srun gets one poll, not the",
    "    # grace, and the post-mortem still runs (else no attempt_end, and Slurm's full requeue hold).",
    f"    trap 'grace={WATCHDOG_POLL_S}' USR2",
    "    # Steps that began before this srun (an earlier attempt's) are not its own: accounting may",
    "    # still list them while this srun's step starts. Not after a restart inside the allocation:",
    "    # the probe steps that found the dead node began moments before this srun.",
    '    if [ -n "${HETRUN_SRUN_START:-}" ] && [ -z "${_hetrun_overlap:-}" ]; then',
    '        since=$(( ${HETRUN_SRUN_START%[.,]*} - 1 ))',
    "    fi",
    '    while kill -0 "$_hetrun_pid" 2>/dev/null; do',
    # The sleep's output goes nowhere: killed mid-sleep, the watchdog leaves the sleep
    # behind for up to a poll, and it must not hold sbatch's (or a caller's) pipes open.
    f"        sleep {WATCHDOG_POLL_S} </dev/null >/dev/null 2>&1",
    f"        waited=$((waited + {WATCHDOG_POLL_S}))",
    "        # Signalled (the kill is KillWait away) and every rank's own exit event written a poll",
    "        # ago: the step has ended whatever squeue and accounting say yet. Seen twice in one day:",
    "        # a preempted het job's srun waited out its 32 s while the requeued (pending) job hid the",
    "        # step from both, so its post-mortem never ran and Slurm's full requeue hold applied.",
    f'        if [ "$grace" -le {WATCHDOG_POLL_S} ] && rc=$(_hetrun_exits_rc) && [ -n "$rc" ]; then',
    "            exited=$((exited + 1))",
    '            [ "$exited" -ge 2 ] || continue',
    f'            echo "hetrun: srun still running {WATCHDOG_POLL_S}s after every rank\'s exit (exit $rc); ending it" >&2',
    '            echo "$rc" > "$_hetrun_stuck"',
    '            kill -s KILL "$_hetrun_pid" 2>/dev/null',
    "            return",
    "        fi",
    '        steps=$(_hetrun_job_steps "$1") || continue',
    "        # This srun's steps: those seen running while it ran (an earlier attempt's, killed",
    "        # with 137 before a restart inside the allocation, must not give it their code).",
    "        if printf '%s\\n' \"$steps\" | grep -q '[.][0-9][0-9]*$'; then",
    "            seen=1; gone=0",
    "            mine=$(printf '%s\\n' $mine $(printf '%s\\n' \"$steps\" | sed -n 's/.*[.]\\([0-9][0-9]*\\)$/\\1/p') \\",
    "                | sort -nu | tr '\\n' ' ')",
    "            continue",
    "        fi",
    "        # A step never seen running may still be starting, or may have ended within one poll:",
    f"        # for {WATCHDOG_UNSEEN_S} s only steps that began after this srun count (an earlier",
    "        # attempt's steps may still be all accounting has).",
    f'        if [ "$seen" -eq 0 ] && [ "$waited" -lt {WATCHDOG_UNSEEN_S} ]; then',
    '            [ -n "$since" ] || continue',
    '            rc=$(_hetrun_step_rc "$since")',
    "        else",
    '            rc=$(_hetrun_step_rc "" "$mine")',
    "        fi",
    '        if [ -z "$rc" ]; then gone=0; continue; fi',
    f"        gone=$((gone + {WATCHDOG_POLL_S}))",
    '        if [ "$gone" -ge "$grace" ]; then',
    '            echo "hetrun: srun still running ${gone}s after its job step ended (exit $rc); ending it" >&2',
    '            echo "$rc" > "$_hetrun_stuck"',
    '            kill -s KILL "$_hetrun_pid" 2>/dev/null',
    "            return",
    "        fi",
    "    done",
    "}",
]


# srun's stderr, line by line, into the attempt's log. The first death that
# is not a checkpointed exit (85, 143: every peer has flushed by then)
# SIGKILLs the step's tasks at once (srun runs with --kill-on-bad-exit=0: its
# own kill is a SIGTERM the survivors would take for a preemption, waiting out
# their grace deadline); the newest complete checkpoint stays the restore
# point. The reader marks the log where it did so: the post-mortem names only
# the deaths before the mark, not the peers it killed.
def srun_reader(*, kill_in_background: bool = False) -> list[str]:
    """The srun reader's lines; ``kill_in_background``: its scancel does not block the reader
    (spare nodes: see _batch_body)."""
    return [
        "",
        f"_hetrun_kill_mark={quoting.sh(KILL_MARK)}",
        "_hetrun_srun_reader() {",
        "    # $1: the job ids of the het components, comma-separated. Slurm's SIGTERM",
        "    # (preemption, cancel) reaches every process of the batch step: this one reads on.",
        "    trap '' TERM INT",
        "    local line ended=0 steps id",
        "    while IFS= read -r line; do",
        '        printf \'%s\\n\' "$line" >> "$_hetrun_srun_log"',
        '        case "$line" in',
        "            *': Exited with exit code 85'|*': Exited with exit code 143') ended=1 ;;",
        "            'srun: error: '*': task'*': '*)",
        '                if [ "$ended" -eq 1 ]; then continue; fi',
        "                ended=1",
        "                # The steps squeue lists, and step 0 of every component (this script's one srun):",
        "                # a step srun has begun to terminate may be gone from squeue already.",
        "                steps=\" $(_hetrun_job_steps \"$1\" | tr \'\\n\' \' \')\"",
        "                for id in ${1//,/ }; do",
        '                    case "$steps" in *" $id."*) ;; *) steps="$steps $id.0" ;; esac',
        "                done",
        '                printf \'%s\\n\' "$_hetrun_kill_mark" >> "$_hetrun_srun_log"',
        '                echo "hetrun: a task died ($line); SIGKILL to the step\'s other tasks:" $steps >&2',
        '                scancel -s KILL $steps 2>/dev/null' + (" &" if kill_in_background else "") + " ;;",
        "        esac",
        "    done",
        "}",
    ]


def _het_job_ids(n: int) -> str:
    """The shell words for the job ids of ``n`` het components (squeue -j takes a list)."""
    if n == 1:
        return '"$SLURM_JOB_ID"'
    return '"' + ",".join(f"${{SLURM_JOB_ID_HET_GROUP_{i}:-$SLURM_JOB_ID}}" for i in range(n)) + '"'


def _postmortem_lines(opts: SlurmOptions, hetrun_python: str) -> list[str]:
    """After srun: name dead ranks, write attempt_end, apply the budgets, requeue or end.

    ``hetrun.slurm_plugin.postmortem`` decides (the local supervisor applies the
    same rules in-process); if it cannot run, exit 85 still requeues.
    """
    b = opts.budgets
    limit = "none" if b.max_preemptions is None else str(b.max_preemptions)
    postmortem = quoting.sh_join([
        hetrun_python, "-m", "hetrun.slurm_plugin.postmortem", "--launcher", "srun",
        "--max-preemptions", limit, "--max-failures", str(b.max_failures), "--preemption-key", b.preemption_key,
    ])
    return [
        'cat "$_hetrun_srun_log" >&2 2>/dev/null',
        f'_hetrun_next=$({postmortem} --exit-code "$_hetrun_rc" --signal "$_hetrun_sig" \\',
        '    --restart "${SLURM_RESTART_COUNT:-0}" --log "$_hetrun_srun_log" "$HETRUN_RUN_DIR")',
        f'if [ -z "$_hetrun_next" ] && [ "$_hetrun_rc" -eq {REQUEUE_EXIT_CODE} ]; then _hetrun_next=requeue; fi',
        "# After SIGTERM (preemption) Slurm requeues the job itself.",
        'if [ "$_hetrun_next" = requeue ] && [ "$_hetrun_sig" != TERM ]; then',
        '    echo "hetrun: requeueing job $SLURM_JOB_ID (restart $(( ${SLURM_RESTART_COUNT:-0} + 1 ))'
        + ("" if b.max_preemptions is None else f" of {b.max_preemptions}") + ')" >&2',
        '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
        '    echo "hetrun: scontrol requeue $SLURM_JOB_ID failed" >&2',
        "fi",
        "# Every rank exited 0 (the post-mortem reads their exit events): a completed job, even",
        "# where srun itself was ended after them (its status then is 137).",
        'if [ "$_hetrun_next" = done ]; then exit 0; fi',
        'exit "$_hetrun_rc"',
        "",
    ]


def render_sbatch(plan: Plan, spec: JobSpec, run_dir: Path, *, python: str | None = None,
                  hetrun_python: str | None = None) -> str:
    """The sbatch script for ``plan`` (placed) under ``spec``, running in ``run_dir`` (absolute):
    ``build_request`` then ``write_sbatch``.

    ``python`` (the ranks' interpreter) defaults to ``sys.executable``;
    ``hetrun_python`` runs hetrun's own post-mortem in the batch shell and
    defaults to ``sys.executable`` (``python`` may be a test's stand-in).
    Golden tests pass fixed ones.
    """
    if not run_dir.is_absolute():
        raise ValueError(f"run_dir must be absolute, got {run_dir}")
    return write_sbatch(build_request(spec, plan), run_dir, python=python, hetrun_python=hetrun_python)


def write_sbatch(req: BatchRequest, run_dir: Path, *, python: str | None = None,
                 hetrun_python: str | None = None) -> str:
    """The script text for ``req`` (see ``render_sbatch``)."""
    if not run_dir.is_absolute():
        raise ValueError(f"run_dir must be absolute, got {run_dir}")
    name, comps, opts, env = req.name, list(req.components), req.options, list(req.env)
    py = python or sys.executable
    hetrun_py = hetrun_python or sys.executable
    if not py or not hetrun_py:
        raise ValueError("no Python interpreter path (sys.executable is empty)")
    sig = opts.signal
    traps = [sig] if sig == "TERM" else [sig, "TERM"]
    recovers = any(c.recovers for c in comps)
    lines = _header(name, comps, opts, run_dir) + _setup(run_dir, env, traps, req.restart_base, recovers)
    if recovers:
        return "\n".join(lines + _recovery_body(comps, run_dir, py, hetrun_py, opts, traps))
    # the ranks whose exit events end a signalled srun's wait (the watchdog's _hetrun_exits_rc)
    lines += [f"_hetrun_exit_ranks={sum(c.nodes * c.tasks_per_node for c in comps)}"]
    lines += _run_steps(launch_steps(comps, run_dir, py), traps, len(comps))
    lines += _postmortem_lines(opts, hetrun_py)
    return "\n".join(lines)


def _recovery_body(comps: Sequence[ComponentRequest], run_dir: Path, py: str, hetrun_py: str,
                   opts: SlurmOptions, traps: Sequence[str]) -> list[str]:
    """Spare nodes: the step and its post-mortem in a loop. Each step runs on the first
    ``nodes`` live nodes of each het group; a failed step the post-mortem would requeue
    (a failure within max_failures, not a preemption) restarts at once, inside the
    allocation, on the survivors plus a spare, the dead nodes excluded
    (``hetrun.slurm_plugin.node_recovery``); with no spare left a component with ``min_nodes``
    runs its ranks packed onto its surviving nodes (``--overcommit``: the same ranks on fewer
    nodes' cores); else the job requeues as before."""
    # One srun: the action components' (one MPI world), or a single command component's
    # (the spec refuses spares in a job of several steps: JobSpec's component checks).
    need = [str(c.nodes) for c in comps]
    # The fewest nodes each group may be packed onto (its nodes where it never packs).
    fewest = [str(c.min_nodes if c.min_nodes is not None else c.nodes) for c in comps]
    tool = [hetrun_py, "-m", "hetrun.slurm_plugin.node_recovery"]
    steps = launch_steps(comps, run_dir, py)
    if len(steps) != 1:
        raise ValueError("spare_nodes: in-allocation restart needs the job to be one srun step "
                         f"(this one has {len(steps)}: command components run alone)")
    step = quoting.sh_join(steps[0])
    # After a restart, --overlap: the failed step keeps its resources on the survivors until the
    # dead node's slurmstepd answers (never, until Slurm marks the node down): without it srun
    # waits ("Requested nodes are busy") for the whole SlurmdTimeout. Its tasks are all dead.
    overlap = "${_hetrun_overlap:+--overlap}"
    if comps[0].command is not None:
        # A command component's own srun (command_srun): its group alone, no MPI.
        c = comps[0]
        where = f'--nodes={c.nodes} --ntasks={c.nodes * c.tasks_per_node} --nodelist="${{_hetrun_nl[0]}}" {overlap}'
        step = step.replace("srun ", f"srun --no-kill {where} ", 1)
    else:
        # Each het group's part of the one srun: its node count (fewer than its nodes once packed),
        # task count (always its ranks) and live node list; packed, --overcommit and the ranks
        # per node it takes (the allocation's --ntasks-per-node no longer fits).
        parts = step.split(" : ") if len(comps) > 1 else [step]
        for g, c in enumerate(comps):
            where = (f'--nodes="${{_hetrun_nn[{g}]}}" --ntasks={c.nodes * c.tasks_per_node} '
                     f'--nodelist="${{_hetrun_nl[{g}]}}" ${{_hetrun_pack[{g}]}} {overlap}')
            # srun --no-kill: on a node failure srun would otherwise SIGTERM the survivors, which
            # they take for a preemption; hetrun's reader and heartbeat monitor end the step instead.
            parts[g] = parts[g].replace("srun ", f"srun --no-kill {where} ", 1) if g == 0 else f"{where} {parts[g]}"
        step = " : ".join(parts)
    run = _run_steps([["__STEP__"]], traps, len(comps))
    run = [line.replace(quoting.sh_join(["__STEP__"]), step) for line in run]
    # A SIGKILLed srun (a dead node) can leave a process holding the reader's FIFO: the
    # post-mortem needs the first death line only, so wait 2 s for the rest, not 10.
    run = [line.replace('[ "$_hetrun_i" -lt 50 ]', '[ "$_hetrun_i" -lt 10 ]') for line in run]
    # The heartbeat monitor runs beside the step, as the watchdog does.
    at = next(i for i, line in enumerate(run) if line.startswith("_hetrun_watchdog "))
    jobs = _het_job_ids(len(comps))
    run[at + 2:at + 2] = [f'rm -f {_LOGS}/{HEARTBEATS}/* "$_hetrun_silent" 2>/dev/null',
                          "IFS=' ' read -r -a _hetrun_step_nodes <<< \"${_hetrun_nl[*]//,/ }\"",
                          f'_hetrun_heartbeats {jobs} "${{_hetrun_step_nodes[@]}}" &', "_hetrun_beat=$!"]
    at = next(i for i, line in enumerate(run) if line.startswith('kill "$_hetrun_watch"'))
    run.insert(at + 1, 'kill "$_hetrun_beat" 2>/dev/null')
    pm = _postmortem_lines(opts, hetrun_py)
    decide, finish = pm[:4], pm[4:]
    warm_start, warm_end = _warm_lines(comps, run_dir, py)
    body = [
        "",
        "# Spare nodes (in-allocation restart, docs/PREEMPTION.md): nodes found dead in this job",
        "# are never used again; attempts restarted inside the allocation count on in the run.",
        f'_hetrun_dead_file={_LOGS}/"{DEAD_NODES_PREFIX}${{SLURM_JOB_ID}}"',
        f'_hetrun_inalloc={_LOGS}/{IN_ALLOCATION_RESTARTS}',
        f"_hetrun_node_timeout=${{{NODE_TIMEOUT_ENV}:-{NODE_TIMEOUT_S}}}",
        "case $_hetrun_node_timeout in ''|*[!0-9]*|0*)",
        f'    echo "hetrun: {NODE_TIMEOUT_ENV}=$_hetrun_node_timeout is not a whole number of seconds > 0;'
        f' using {NODE_TIMEOUT_S}" >&2',
        f"    _hetrun_node_timeout={NODE_TIMEOUT_S} ;;",
        "esac",
        f'_hetrun_silent={_LOGS}/"{SILENT_NODES_PREFIX}${{SLURM_JOB_ID}}"',
        "_hetrun_heartbeats() {",
        "    # $1: the job ids; then the step's nodes. Each node's lowest rank rewrites",
        f"    # {LOGS}/{HEARTBEATS}/<node> with a counter every ${HEARTBEAT_ENV} s while it runs",
        "    # (runtime/recovery.py) and removes it when it ends. A node whose counter has not",
        f"    # changed for longer than {NODE_TIMEOUT_ENV} s (this node's clock only: no clock skew;",
        "    # reading the file revalidates an NFS client's cache) is presumed dead and the step",
        "    # SIGKILLed (Slurm itself notices a dead node only after SlurmdTimeout). Once the",
        "    # step's tasks are killed, srun may still wait for a dead node's slurmstepd until Slurm",
        "    # marks the node down: it is ended too, at once after this monitor's own kill (a node",
        "    # is known dead), 0.5-1 s after the srun reader's (srun may still end by itself). Ages in",
        "    # microseconds from bash's EPOCHREALTIME: whole seconds added up to 1 s to the detection.",
        "    # Every node's file gone (each removed by its rank's orderly end) and every rank's exit",
        "    # event written, yet srun still runs STUCK_AFTER_EXIT_S later: a rank stuck after its end",
        "    # (seen once: a restarted step's srun waited to the time limit after every rank's exit",
        "    # event): srun is ended, and the post-mortem reads the ranks' exit events, not its code.",
        "    trap '' TERM INT",
        "    local jobs=$1 n v age now steps killed=0 since=0 limit=$(( _hetrun_node_timeout * 1000000 )); shift",
        "    local gone exits done_for=0",
        "    local -A seen=() changed=() quiet=()",
        "    local beat there others dt last=${EPOCHREALTIME//[!0-9]/}",
        '    while kill -0 "$_hetrun_pid" 2>/dev/null; do',
        "        sleep 0.5",
        "        gone=0",
        '        for n in "$@"; do',
        f'            if [ -n "${{seen[$n]-}}" ] && [ ! -e {_LOGS}/{HEARTBEATS}/"$n" ]; then gone=$((gone + 1)); fi',
        "        done",
        '        if [ "$killed" -eq 0 ] && [ "$gone" -eq "$#" ]; then',
        "            exits=$(grep -F '{\"ev\":\"exit\",' \"$HETRUN_RUN_DIR/events.jsonl\" 2>/dev/null \\",
        '                | grep -c -E "\\"restart_count\\":${SLURM_RESTART_COUNT:-0}[,}]")',
        '            if [ "${exits:-0}" -ge "$_hetrun_ntasks" ]; then done_for=$((done_for + 1)); else done_for=0; fi',
        f'            if [ "$done_for" -ge {2 * STUCK_AFTER_EXIT_S} ]; then',
        f'                echo "hetrun: $EPOCHREALTIME every rank ended {STUCK_AFTER_EXIT_S} s ago and srun still waits: ending it" >&2',
        '                kill -s KILL "$_hetrun_pid" 2>/dev/null',
        "                return",
        "            fi",
        "        fi",
        '        now=${EPOCHREALTIME//[!0-9]/} beat=0 there=0',
        # This poll's share of a silence: at most 1 s, so a monitor that was itself held up
        # (by the same stalled file system) does not count its own wait as the others' beats.
        '        dt=$(( now - last )); if [ "$dt" -gt 1000000 ]; then dt=1000000; fi',
        '        for n in "$@"; do',
        f'            if ! {{ read -r v < {_LOGS}/{HEARTBEATS}/"$n"; }} 2>/dev/null; then',
        # No whole line in a file that is there: no change (a beat killed in its first write
        # leaves it empty; the beat never truncates, runtime/heartbeat.py). Not there: not
        # started yet, or ended in order (counted as gone above).
        f'                [ -e {_LOGS}/{HEARTBEATS}/"$n" ] || continue',
        '                v=${seen[$n]-}',
        '            fi',
        '            there=$((there + 1))',
        '            if [ -z "${changed[$n]-}" ] || [ "${seen[$n]-}" != "$v" ]; then seen[$n]=$v; changed[$n]=$now; quiet[$n]=0; fi',
        '            if [ $(( now - ${changed[$n]} )) -le $(( limit / 2 )) ]; then beat=$((beat + 1)); fi',
        '        done',
        '        for n in "$@"; do',
        '            if [ "$killed" -eq 1 ]; then break; fi',
        f'            if [ -z "${{changed[$n]-}}" ] || [ ! -e {_LOGS}/{HEARTBEATS}/"$n" ]; then continue; fi',
        "            age=$(( now - ${changed[$n]} ))",
        # A node's silence counts only while another node beats: when every file stops at once
        # the shared file system stalled (seen for 6 s after the MoE LM's checkpoints: every rank
        # and every beat waited), not every node died. A node alone with a file: its own age.
        '            others=$(( beat - (age <= limit / 2) ))',
        '            if [ "$others" -gt 0 ]; then quiet[$n]=$(( ${quiet[$n]-0} + dt )); fi',
        '            if [ "${quiet[$n]}" -gt "$age" ]; then quiet[$n]=$age; fi  # never more than its own silence',
        '            if [ "$there" -gt 1 ] && [ "${quiet[$n]-0}" -le "$limit" ]; then continue; fi',
        '            if [ "$there" -le 1 ] && [ "$age" -le "$limit" ]; then continue; fi',
        '            echo "$n" >> "$_hetrun_silent"',
        '            printf \'%s\\n\' "$_hetrun_kill_mark" >> "$_hetrun_srun_log"',
        "            steps=$(_hetrun_job_steps \"$jobs\" | tr '\\n' ' ')",
        f'            echo "hetrun: $EPOCHREALTIME node $n silent for $((age / 1000000)).$((age / 100000 % 10))s ({NODE_TIMEOUT_ENV}=$_hetrun_node_timeout):" \\',
        '                "SIGKILL to the step:" $steps >&2',
        "            # In the background: the live nodes' tasks die at once, but scancel returns only",
        "            # when the dead node's slurmd fails to answer (MessageTimeout: 11 s measured),",
        "            # and srun, which waits for that answer too, is ended at once below.",
        "            scancel -s KILL $steps 2>/dev/null &",
        "            killed=1 since=3",
        "        done",
        "        last=$now",
        # The srun reader killed the step (a rank died): srun is given one more poll to end by
        # itself (it does within a few tenths of a second when every node lives); one whose
        # node died waits for that node's slurmstepd until Slurm marks it down. It had four
        # polls: 1.5-2 s of every node-death restart (benchmarks/node_death.md, session 33).
        '        if [ "$killed" -eq 0 ] && grep -qF "$_hetrun_kill_mark" "$_hetrun_srun_log" 2>/dev/null; then killed=1 since=2; fi',
        '        if [ "$killed" -eq 1 ]; then',
        "            since=$((since + 1))",
        '            if [ "$since" -ge 4 ]; then',
        '                echo "hetrun: $EPOCHREALTIME srun still waits after its step was killed (a dead node?): ending it" >&2',
        '                kill -s KILL "$_hetrun_pid" 2>/dev/null',
        "                return",
        "            fi",
        "        fi",
        "    done",
        "}",
        *warm_start,
        "_hetrun_overlap=''",
        f"_hetrun_ntasks={sum(c.nodes * c.tasks_per_node for c in comps)}  # the step's ranks (the monitor's exit count)",
        "while :; do",
        '    rm -f "$_hetrun_stuck"',
        f'    mapfile -t _hetrun_nl < <({quoting.sh_join([*tool, "nodes"])} "$HETRUN_RUN_DIR" \\',
        f'        --dead-file "$_hetrun_dead_file" --need {" ".join(need)} --fewest {" ".join(fewest)})',
        f'    if [ "${{#_hetrun_nl[@]}}" -ne {len(comps)} ]; then',
        '        echo "hetrun: not enough live nodes left in the allocation" >&2',
        # No node list (too few live nodes, or the tool failed: an scontrol timeout, an import
        # error): a failed attempt like any other, so the post-mortem writes its attempt_end
        # and applies max_failures; a permanent error must not requeue forever.
        "        _hetrun_rc=1",
        '        _hetrun_srun_log="$HETRUN_RUN_DIR/logs/srun-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}.err"',
        *["        " + line for line in decide],
        "        break",
        "    fi",
        "    # Each group's node count, and where it is below the group's nodes (packed after a node",
        "    # death, min_nodes) the srun options that put its ranks on the survivors' cores.",
        f"    _hetrun_need=({' '.join(need)}) _hetrun_ranks=({' '.join(str(c.nodes * c.tasks_per_node) for c in comps)})",
        "    _hetrun_nn=() _hetrun_pack=()",
        '    for _hetrun_g in "${!_hetrun_nl[@]}"; do',
        '        IFS=, read -r -a _hetrun_x <<< "${_hetrun_nl[$_hetrun_g]}"',
        "        _hetrun_nn[$_hetrun_g]=${#_hetrun_x[@]} _hetrun_pack[$_hetrun_g]=''",
        '        if [ "${#_hetrun_x[@]}" -lt "${_hetrun_need[$_hetrun_g]}" ]; then',
        "            _hetrun_pack[$_hetrun_g]=\"--overcommit --ntasks-per-node=$(( (_hetrun_ranks[$_hetrun_g] + ${#_hetrun_x[@]} - 1) / ${#_hetrun_x[@]} ))\"",
        "        fi",
        "    done",
        *["    " + line if line else line for line in run],
        '    echo "hetrun: $EPOCHREALTIME step ended (exit $_hetrun_rc)" >&2',
        *["    " + line for line in decide],
        '    echo "hetrun: $EPOCHREALTIME post-mortem: $_hetrun_next" >&2',
        '    if [ "$_hetrun_next" = requeue ] && [ -z "$_hetrun_sig" ] \\',
        f'        && [ "$_hetrun_rc" -ne {REQUEUE_EXIT_CODE} ] && [ "$_hetrun_rc" -ne 143 ]; then',
        '        mapfile -t _hetrun_quiet < <(cat "$_hetrun_silent" 2>/dev/null)',
        f'        _hetrun_again=$({quoting.sh_join([*tool, "failed"])} "$HETRUN_RUN_DIR" \\',
        '            --dead-file "$_hetrun_dead_file" --restart "${SLURM_RESTART_COUNT:-0}" \\',
        f'            --need {" ".join(need)} --fewest {" ".join(fewest)} --used "${{_hetrun_nl[@]}}" '
        '--silent "${_hetrun_quiet[@]}")',
        '        if [ "$_hetrun_again" = restart ]; then',
        '            echo "${SLURM_JOB_ID} ${SLURM_RESTART_COUNT:-0}" >> "$_hetrun_inalloc"',
        "            export SLURM_RESTART_COUNT=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))",
        '            echo "hetrun: restarting inside the allocation (attempt $SLURM_RESTART_COUNT)" >&2',
        "            _hetrun_overlap=1",
        "            continue",
        "        fi",
        "    fi",
        "    break",
        "done",
        *warm_end,
    ]
    return body + finish


# A command whose program is a Python interpreter by name (``python``, ``python3.11``): the rank
# wrapper checks that it is the job's own before forking it warm (runtime/warm_command.py).
_PYTHON_WORD = re.compile(r"python[0-9.]*")


def _warm_lines(comps: Sequence[ComponentRequest], run_dir: Path, py: str) -> tuple[list[str], list[str]]:
    """Warm servers (runtime/warm_start.py) for a job with spares: one per node of the
    allocation, spares included, started once the first ranks are up (a heartbeat file: their
    imports must not slow the first start), so that a rank restarted inside the allocation forks
    from one instead of importing torch again: an action rank, or a command component's Python
    program (runtime/warm_command.py). None where every component runs a program that is not
    ``python ...`` (nothing would fork). Ended before the script exits. ``HETRUN_WARM_START=0``
    in the job's env starts none."""
    if not any(c.command is None or _PYTHON_WORD.fullmatch(c.command[0].rsplit("/", 1)[-1]) for c in comps):
        return [], []
    logs = quoting.sbatch_path(run_dir / "logs", "log directory")
    sruns = []
    for g, c in enumerate(comps):
        n = c.nodes + c.spare_nodes
        words = ["srun", "--overlap", "--no-kill", "--mpi=none", f"--job-name={WARM_STEP_NAME}",
                 *([f"--het-group={g}"] if len(comps) > 1 else []),
                 f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1",
                 f"--output={logs}/{WARM_STEP_NAME}-%j-%t.out",
                 py, "-m", "hetrun.runtime.warm_start", str(run_dir)]
        sruns.append(f"    {quoting.sh_join(words)} &")
    start = [
        "",
        f'if [ "${{{WARM_SWITCH_ENV}:-1}}" != 0 ]; then',
        "    # Warm starts (runtime/warm_start.py): each node's server listens on this node-local",
        "    # socket; a rank restarted inside the allocation forks from it (torch imported).",
        f'    export {WARM_SOCKET_ENV}="/tmp/{WARM_STEP_NAME}-${{SLURM_JOB_ID}}.sock"',
        "    {",
        "    _hetrun_i=0",
        f'    while ! compgen -G {_LOGS}/"{HEARTBEATS}/*" >/dev/null && [ "$_hetrun_i" -lt 7200 ]; do',
        "        sleep 0.5; _hetrun_i=$((_hetrun_i + 1))",
        "    done",
        *sruns,
        "    wait",
        "    } </dev/null >/dev/null 2>&1 &",
        "    _hetrun_warm=$!",
        "fi",
    ]
    end = [
        "# The warm servers' steps end with the job's work (else Slurm waits on them at the end).",
        'if [ -n "${_hetrun_warm:-}" ]; then',
        '    kill "$_hetrun_warm" 2>/dev/null',
        f"    scancel $(_hetrun_job_steps {_het_job_ids(len(comps))} warm) 2>/dev/null",
        "fi",
    ]
    return start, end


def _header(name: str, comps: Sequence[ComponentRequest], opts: SlurmOptions, run_dir: Path) -> list[str]:
    """The #SBATCH lines: job-wide options, then one block per het component."""
    rd = quoting.sbatch_path(run_dir, "run directory")
    out: list[str] = [
        "#!/bin/bash",
        f"# hetrun: job {name!s}, {len(comps)} het component(s): "
        + ", ".join(f"{i}={c.name}" for i, c in enumerate(comps)),
        # Job-wide options first: Slurm reads them from the first component.
        "#SBATCH --requeue",
        f"#SBATCH --signal=B:{opts.signal}@{opts.grace_seconds}",
        f"#SBATCH --chdir={rd}",
        f"#SBATCH --output={rd}/logs/batch-%j.out",
        f"#SBATCH --error={rd}/logs/batch-%j.out",
        # A requeued job appends to its batch log instead of truncating the first attempt's.
        "#SBATCH --open-mode=append",
    ]
    out += [f"#SBATCH {line}" for line in opts.extra_job]
    for i, comp in enumerate(comps):
        if i:
            out.append("#SBATCH hetjob")
        out.append(f"# component {i}: {comp.name}")
        out += _component_block(comp, name, opts)
        if any(c.recovers for c in comps):
            # Per component (each is a job record of its own): a dead node of any component
            # leaves the allocation alive, and the spares (or the survivors, packed) take over.
            out.append("#SBATCH --no-kill")
    return out


def _setup(run_dir: Path, env: Sequence[tuple[str, str]], traps: Sequence[str], base: int,
           spares: bool = False) -> list[str]:
    """The bash prologue: the run's environment, signal forwarding, the watchdog and the srun reader."""
    q = quoting.sh
    body = [
        "",
        "# Everything below is bash; every user value is shell-quoted.",
        "# When the script started (bash 5 clock, no fork; empty before bash 5): the runtime's startup event",
        "# reports it, to break a restart's time down from Slurm's start to the first step.",
        "export HETRUN_BATCH_START=${EPOCHREALTIME:-}",
        "set -u",
        f"cd {q(run_dir)} || exit 1",
        f"mkdir -p {q(run_dir / 'logs')}",
        f"export HETRUN_RUN_DIR={q(run_dir)}",
        "export PYTHONUNBUFFERED=1",
        "# Slurm 22.05 mpi/pmix: with the default 'mixed' fences the data-less barrier that ends",
        "# MPI_Init uses the tree collective, which let a het-step rank leave MPI_Init while a peer",
        "# was still in its modex fence (the peer then segfaults on the first message). Ring fences",
        "# for every fence keep MPI_Init a real barrier.",
        "export SLURM_PMIX_FENCE=ring",
    ]
    body += [f"export {k}={q(v)}" for k, v in env]
    if base:
        body += ["# hetrun resume: this job continues the run, whose attempts count on from its old jobs'.",
                 f"export SLURM_RESTART_COUNT=$(( ${{SLURM_RESTART_COUNT:-0}} + {base} ))"]
    if spares:
        # Slurm's count after a requeue knows nothing of the restarts this job made inside
        # its allocation: count them on, so no attempt number is used twice (events, budgets,
        # srun-<job>-<n>.err). Only this job's lines: a resume's base already counts older jobs'.
        body += ["# Restarts this job made inside its allocation count on after a requeue.",
                 f'_hetrun_inalloc_n=$(grep -c "^${{SLURM_JOB_ID}} " {_LOGS}/{IN_ALLOCATION_RESTARTS}'
                 ' 2>/dev/null) || _hetrun_inalloc_n=0',
                 "export SLURM_RESTART_COUNT=$(( ${SLURM_RESTART_COUNT:-0} + _hetrun_inalloc_n ))"]
    body += [
        "",
        "_hetrun_pid=''",
        "_hetrun_sig=''",
        "_hetrun_forward() {",
        "    # srun passes the signal on to every task; the runtime checkpoints and exits 85",
        "    # (143 after SIGTERM). The post-mortem records which signal it was.",
        '    _hetrun_sig=$1',
        "    # Marked for a later attempt's post-mortem, in case Slurm kills this script before its own.",
        f'    printf \'%s\\n\' "$1" > "$HETRUN_RUN_DIR/logs/{SIGNAL_MARK}${{SLURM_RESTART_COUNT:-0}}" 2>/dev/null || true',
        '    if [ -n "$_hetrun_pid" ]; then kill -s "$1" "$_hetrun_pid" 2>/dev/null || true; fi',
        '    if [ -n "${_hetrun_watch:-}" ]; then kill -s USR2 "$_hetrun_watch" 2>/dev/null || true; fi',
        "}",
        # Trapped as soon as the handler exists: Slurm may send the warning "up to 60 seconds
        # earlier than specified" (sbatch --signal), so with a grace near the time limit it can
        # come as the job starts; untrapped, USR1 ended this script at once, with no requeue
        # (seen once in a suite run: 67 ms after the start).
        *[f"trap '_hetrun_forward {s}' {s}" for s in traps],
    ]
    # Spare nodes: the reader's scancel in the background. It returns only when a dead node's
    # slurmd fails to answer (MessageTimeout: 11 s measured); blocked there the reader held
    # the script 2 s after srun ended (its wait below). The first death line is logged before.
    body += WATCHDOG + srun_reader(kill_in_background=spares)
    return body


def _run_steps(steps: Sequence[list[str]], traps: Sequence[str], n_comps: int) -> list[str]:
    """Start the steps with the reader and the watchdog, wait for them through trapped signals."""
    jobs = _het_job_ids(n_comps)
    return [
        "",
        "export HETRUN_SRUN_START=${EPOCHREALTIME:-}",
        "# srun's own messages (which task died, how) for the post-mortem; copied to this log after.",
        '_hetrun_srun_log="$HETRUN_RUN_DIR/logs/srun-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}.err"',
        '_hetrun_fifo="${TMPDIR:-/tmp}/hetrun-srun-$$.err"',
        'rm -f "$_hetrun_fifo" && mkfifo "$_hetrun_fifo" || exit 1',
        f'_hetrun_srun_reader {jobs} <"$_hetrun_fifo" &',
        "_hetrun_reader=$!",
        # In the background so the shell can run its traps while srun runs.
        *_launch_lines(steps, traps),
        f"_hetrun_watchdog {jobs} &",
        "_hetrun_watch=$!",
        "_hetrun_rc=0",
        "while :; do",
        '    wait "$_hetrun_pid"',
        "    _hetrun_rc=$?",
        "    # A trapped signal makes wait return early (status > 128) while srun still runs.",
        '    if [ "$_hetrun_rc" -gt 128 ] && kill -0 "$_hetrun_pid" 2>/dev/null; then continue; fi',
        "    break",
        "done",
        'if [ "$_hetrun_rc" -gt 128 ]; then',
        "    # srun may have ended right after the interrupted wait: collect its real status.",
        '    wait "$_hetrun_pid" 2>/dev/null',
        "    _hetrun_late=$?",
        '    if [ "$_hetrun_late" -ne 127 ]; then _hetrun_rc=$_hetrun_late; fi',
        "fi",
        'kill "$_hetrun_watch" 2>/dev/null',
        'if [ -s "$_hetrun_stuck" ]; then _hetrun_rc=$(cat "$_hetrun_stuck"); fi',
        "# srun has closed its stderr: the reader has the whole log once it ends (at most 10 s:",
        "# a process srun left behind may still hold the FIFO open; 2 s once Slurm has signalled",
        "# the job, whose kill is then near).",
        "_hetrun_i=0",
        '_hetrun_imax=50; if [ -n "$_hetrun_sig" ]; then _hetrun_imax=10; fi',
        'while kill -0 "$_hetrun_reader" 2>/dev/null && [ "$_hetrun_i" -lt "$_hetrun_imax" ]; do',
        '    sleep 0.2; _hetrun_i=$((_hetrun_i + 1))',
        "done",
        'kill -s KILL "$_hetrun_reader" 2>/dev/null',
        'rm -f "$_hetrun_fifo"',
    ]
