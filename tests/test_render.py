"""Rendered sbatch scripts: golden files for every example, and the script's shape.

Regenerate the golden files after an intended change with
``HETRUN_UPDATE_GOLDEN=1 pytest tests/test_render.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import JobSpec, PreemptionSpec, load_spec, spec_from_dict
from hetrun.slurm_plugin.render import render_sbatch

from hetrun.errors import RunDirError, SpecError

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
GOLDEN = Path(__file__).resolve().parent / "golden"
# Fixed so the output does not depend on the machine or the clock.
RUN_DIR = Path("/var/tmp/hetrun-golden/RUN")
PYTHON = "/usr/bin/python3"


def _render(path: Path) -> str:
    spec = load_spec(path)
    return render_sbatch(build_plan(spec), spec, RUN_DIR, python=PYTHON, hetrun_python=PYTHON)


def test_every_example_has_a_golden_file() -> None:
    assert EXAMPLES, "no examples/*.yaml found"
    if os.environ.get("HETRUN_UPDATE_GOLDEN"):
        pytest.skip("regenerating golden files")
    missing = [p.name for p in EXAMPLES if not (GOLDEN / f"{p.stem}.sbatch").exists()]
    assert not missing, f"no golden script for {missing}; run with HETRUN_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_golden_script(example: Path) -> None:
    script = _render(example)
    golden = GOLDEN / f"{example.stem}.sbatch"
    if os.environ.get("HETRUN_UPDATE_GOLDEN"):
        golden.write_text(script)
    assert golden.exists(), f"{golden} missing; run with HETRUN_UPDATE_GOLDEN=1"
    assert script == golden.read_text(), f"rendered script differs from {golden}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_rendering_is_deterministic_and_valid_bash(example: Path) -> None:
    a, b = _render(example), _render(example)
    assert a == b
    subprocess.run(["bash", "-n"], input=a, text=True, check=True)


def _spec(**changes: object) -> JobSpec:
    data: dict = {
        "name": "demo",
        "workload": "hetrun.examples.ppo:PPOWorkload",
        "components": {
            "learner": {"nodes": 1, "tasks_per_node": 2, "cpus_per_task": 2, "gpus_per_node": 2,
                        "mem": "4G", "actions": ["forward", "backward", "optimize", "sync"]},
            "rollout": {"nodes": 2, "tasks_per_node": 1, "mem": "1G", "actions": ["rollout"]},
        },
        "training": {"kind": "rl", "iterations": 2},
        "slurm": {"partition": "debug", "account": "proj1", "qos": "normal", "time": "01:00:00",
                  "constraint": "intel&ib", "extra": ["--exclusive", "--mail-type=END"]},
        "preemption": {"signal": "USR1", "grace_seconds": 90, "max_restarts": 2},
        "env": {"B": "2", "A": "1"},
    }
    data.update(changes)
    return spec_from_dict(data)


def _script(spec: JobSpec) -> str:
    return render_sbatch(build_plan(spec), spec, RUN_DIR, python=PYTHON, hetrun_python=PYTHON)


def _blocks(script: str) -> list[list[str]]:
    """The #SBATCH lines of each het component."""
    blocks: list[list[str]] = [[]]
    for line in script.splitlines():
        if line == "#SBATCH hetjob":
            blocks.append([])
        elif line.startswith("#SBATCH "):
            blocks[-1].append(line.removeprefix("#SBATCH "))
    return blocks


def test_one_block_per_component_with_its_resources() -> None:
    blocks = _blocks(_script(_spec()))
    assert len(blocks) == 2
    first, second = blocks
    for opt in ("--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=2", "--gres=gpu:2", "--mem=4096M",
                "--partition=debug", "--account=proj1", "--qos=normal", "--time=01:00:00",
                "--constraint=intel&ib", "--exclusive", "--job-name=demo"):
        assert opt in first, opt
    for opt in ("--nodes=2", "--ntasks-per-node=1", "--mem=1024M", "--partition=debug", "--exclusive"):
        assert opt in second, opt
    assert not any(o.startswith("--gres") for o in second)
    # Job-wide options once, in the first component.
    for opt in ("--requeue", "--signal=B:USR1@90", "--mail-type=END", "--open-mode=append",
                f"--output={RUN_DIR}/logs/batch-%j.out", f"--chdir={RUN_DIR}"):
        assert opt in first and opt not in second, opt


def test_srun_runs_the_runtime_on_every_het_group_and_requeues_on_85() -> None:
    script = _script(_spec())
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert srun.startswith("srun --mpi=pmix ")
    assert srun.endswith(" &")
    assert "--het-group=0 " in srun and "--het-group=1 " in srun and " : " in srun
    assert srun.count(f"{PYTHON} -m hetrun.runtime {RUN_DIR}") == 2
    assert f"--output={RUN_DIR}/logs/learner-%j-%t.out" in srun
    assert f"--output={RUN_DIR}/logs/rollout-%j-%t.out" in srun
    assert "trap '_hetrun_forward USR1' USR1" in script
    assert "trap '_hetrun_forward TERM' TERM" in script
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script
    # A dead rank ends the step; the post-mortem gets the budgets (old max_restarts = max_preemptions).
    # srun's own kill-on-bad-exit would SIGTERM the survivors (a preemption to them); the reader SIGKILLs.
    assert "--kill-on-bad-exit=0" in srun
    assert "--max-preemptions 2 --max-failures 0 --preemption-key max_restarts" in script


def test_budgets_reach_the_post_mortem_and_default_to_unlimited_preemptions() -> None:
    script = _script(_spec(preemption={"signal": "USR1", "grace_seconds": 90, "max_failures": 2}))
    assert "--max-preemptions none --max-failures 2 --preemption-key max_preemptions" in script
    with pytest.raises(SpecError, match="max_restarts"):
        _spec(preemption={"max_restarts": 1, "max_preemptions": 1})
    # env sorted, quoted
    assert script.index("export A=1") < script.index("export B=2")


def test_single_component_has_no_hetjob_and_no_het_group() -> None:
    comps = {"learner": {"nodes": 1, "tasks_per_node": 1, "mem": "1G",
                         "actions": ["forward", "backward", "optimize"]}}
    spec = _spec(components=comps, training={"kind": "supervised", "iterations": 2},
                 workload="hetrun.examples.moe_lm:MoEWorkload")
    script = _script(spec)
    assert "#SBATCH hetjob" not in script
    assert "--het-group" not in script


def test_no_gpu_no_partition_lines_when_unset() -> None:
    script = _script(_spec(slurm={}))
    assert "--partition" not in script and "--account" not in script and "--time=" not in script


def test_run_dir_with_characters_sbatch_cannot_take_is_refused() -> None:
    spec = _spec()
    plan = build_plan(spec)
    for bad in ("/var/tmp/with space/r", "/var/tmp/pct%j/r", "/var/tmp/hash#/r", "/var/tmp/q'uote/r"):
        with pytest.raises(RunDirError, match="#SBATCH"):
            render_sbatch(plan, spec, Path(bad), python=PYTHON)


def test_python_path_is_shell_quoted() -> None:
    spec = _spec()
    script = render_sbatch(build_plan(spec), spec, RUN_DIR, python="/opt/my env/bin/python")
    assert "'/opt/my env/bin/python' -m hetrun.runtime" in script


def test_unknown_signal_rejected_by_renderer_too() -> None:
    """A spec built in code without validation (model_construct) still meets the request's gate."""
    spec = _spec()
    bypass = spec.model_copy(update={"preemption": PreemptionSpec.model_construct(signal="KILL")})
    with pytest.raises(SpecError, match=r"preemption\.signal"):
        render_sbatch(build_plan(spec), bypass, RUN_DIR, python=PYTHON)


DYING_SRUN = """#!/bin/bash
# stand-in srun: one task dies; the step's other tasks run on until something ends the step
echo "srun: error: n3: task 1: Killed" >&2
trap 'echo "srun: Job step aborted: Waiting up to 32 seconds for job step to finish." >&2
      echo "srun: error: n1: task 0: Killed" >&2; exit 137' TERM
for _ in $(seq 300); do sleep 0.1; done
exit 0
"""
STEP_SQUEUE = """#!/bin/bash
[ "$1" = "-h" ] && [ "$2" = "-s" ] && printf "$FAKE_STEPS"
"""
STEP_SCANCEL = """#!/bin/bash
# stand-in scancel: records its words, then ends the stand-in srun (the step's tasks)
printf '%s\\0' "$@" > "$HETRUN_RUN_DIR/fake-scancel.argv"
pkill -TERM -P "$PPID" -f fake-dying-srun 2>/dev/null || kill -TERM "$(cat "$HETRUN_RUN_DIR/srun.pid")"
"""


@pytest.mark.parametrize("listed", ["4242.0\\n4243.0\\n", "4243.0\\n", ""], ids=["both", "one", "none"])
def test_first_task_death_kills_the_step_and_is_logged_for_the_post_mortem(tmp_path: Path, listed: str) -> None:
    """The shell plumbing around srun, run by bash with stand-ins for srun/squeue/scancel:
    srun's stderr reaches logs/srun-<job>-<restart>.err through the reader, the first
    death SIGKILLs the listed steps, and the post-mortem writes one attempt_end."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun_body = DYING_SRUN.replace("# stand-in srun", 'echo $$ > "$HETRUN_RUN_DIR/srun.pid"\n# stand-in srun')
    for name, body in (("srun", srun_body), ("squeue", STEP_SQUEUE), ("scancel", STEP_SCANCEL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    spec = _spec()
    script = render_sbatch(build_plan(spec), spec, run_dir, python=PYTHON)  # type: ignore[arg-type]
    (run_dir / "hetjob.sbatch").write_text(script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "0",
           "SLURM_JOB_ID_HET_GROUP_0": "4242", "SLURM_JOB_ID_HET_GROUP_1": "4243", "TMPDIR": str(tmp_path),
           "FAKE_STEPS": listed}
    proc = subprocess.run(["bash", str(run_dir / "hetjob.sbatch")], cwd=run_dir, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 137, proc.stderr
    # The steps squeue lists, else step 0 of each component (one srun per attempt).
    words = (run_dir / "fake-scancel.argv").read_text().split("\0")[:-1]
    assert words[:2] == ["-s", "KILL"] and sorted(words[2:]) == ["4242.0", "4243.0"], words
    log = (run_dir / "logs" / "srun-4242-0.err").read_text()
    assert log.splitlines()[0] == "srun: error: n3: task 1: Killed", log
    assert "SIGKILL to the step's other tasks" in proc.stderr
    lines = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    # No plan.json here: the node and signal are named, the rank cannot be told.
    assert [(e["ev"], e.get("node"), e.get("signal"), e.get("detected_by")) for e in lines[:1]] == [
        ("rank_failure", "n3", "SIGKILL", "srun")], lines
    assert [(e["ev"], e["outcome"], e["requeued"]) for e in lines[1:]] == [("attempt_end", "failed", False)], lines
    assert not list(tmp_path.glob("hetrun-srun-*")), "the FIFO is left behind"


def test_spares_no_node_list_runs_the_post_mortem_and_in_allocation_restarts_count_on(tmp_path: Path) -> None:
    """The spare-nodes script, run by bash: a job requeued after one restart inside its
    allocation starts at attempt 1 (Slurm says 0), so no attempt number is used twice; and
    when the node tool prints no node list (here: no plan.json), the attempt still ends
    through the post-mortem (attempt_end, max_failures applied), not a bare requeue."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text('#!/bin/bash\nprintf \'%s\\n\' "$@" > "$HETRUN_RUN_DIR/fake-scontrol.argv"\n')
    scontrol.chmod(0o755)
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    # One restart inside job 4242's allocation, one of an older job (counted by a resume's base).
    (run_dir / "logs" / "in-allocation-restarts").write_text("4000 0\n4242 0\n")
    comps = _spec().model_dump()["components"]  # type: ignore[attr-defined]
    comps["rollout"]["spare_nodes"] = 1
    spec = _spec(components=comps, preemption={"max_failures": 2})
    script = render_sbatch(build_plan(spec), spec, run_dir, python=PYTHON, hetrun_python=sys.executable)  # type: ignore[arg-type]
    (run_dir / "hetjob.sbatch").write_text(script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "0",
           "SLURM_JOB_ID_HET_GROUP_0": "4242", "SLURM_JOB_ID_HET_GROUP_1": "4243", "TMPDIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(run_dir / "hetjob.sbatch")], cwd=run_dir, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert "not enough live nodes" in proc.stderr, proc.stderr
    ends = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    ends = [e for e in ends if e["ev"] == "attempt_end"]
    assert [(e["restart_count"], e["outcome"], e["requeued"]) for e in ends] == [(1, "failed", True)], proc.stderr
    assert (run_dir / "fake-scontrol.argv").read_text().split() == ["requeue", "4242"]
    assert proc.returncode == 0, proc.stderr


def test_only_a_spare_nodes_script_sends_the_readers_kill_to_the_background() -> None:
    """With spares, the srun reader's scancel must not block it on a dead node's slurmd."""
    comps = _spec().model_dump()["components"]  # type: ignore[attr-defined]
    plain = [ln.strip() for ln in _script(_spec(components=comps)).splitlines() if "scancel -s KILL $steps" in ln]
    comps["rollout"]["spare_nodes"] = 1
    spares = [ln.strip() for ln in _script(_spec(components=comps, preemption={"max_failures": 1})).splitlines()
              if "scancel -s KILL $steps" in ln]
    assert "scancel -s KILL $steps 2>/dev/null ;;" in plain and not any("& ;;" in ln for ln in plain)
    assert "scancel -s KILL $steps 2>/dev/null & ;;" in spares


def _run_monitor(tmp_path: Path, scenario: list[str]) -> subprocess.CompletedProcess[str]:
    """The spare-nodes heartbeat monitor of a rendered batch script, run by bash at a 1 s timeout
    against ``scenario`` (lines that write logs/alive/<node> files and call it); squeue lists the
    ranks' step, the warm servers' (runtime/warm_start.py: never killed) and the batch step, and
    scancel records its arguments in scancel.argv."""
    comps = _spec().model_dump()["components"]  # type: ignore[attr-defined]
    comps["rollout"]["spare_nodes"] = 1
    lines = _script(_spec(components=comps, preemption={"max_failures": 1})).splitlines()
    monitor = _function(lines, "_hetrun_job_steps") + _function(lines, "_hetrun_heartbeats")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/bash\nprintf '4242.0 python\\n4242.1 hetrun-warm\\n4242.batch batch\\n'\n")
    (bin_dir / "scancel").write_text('#!/bin/bash\necho "$@" >> "$HETRUN_RUN_DIR/scancel.argv"\n')
    for name in ("squeue", "scancel"):
        (bin_dir / name).chmod(0o755)
    (tmp_path / "logs" / "alive").mkdir(parents=True)
    driver = "\n".join([
        "set -u", "_hetrun_node_timeout=1", '_hetrun_silent="$HETRUN_RUN_DIR/silent"',
        "_hetrun_kill_mark=KILLED", '_hetrun_srun_log="$HETRUN_RUN_DIR/srun.err"',
        "sleep 60 & _hetrun_pid=$!", *monitor, *scenario,
    ])
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HETRUN_RUN_DIR": str(tmp_path)}
    return subprocess.run(["bash", "-c", driver], env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("dead", ["stuck", "empty", "stall"])
def test_heartbeat_monitor_judges_by_change_not_by_mtime_age(tmp_path: Path, dead: str) -> None:
    """The spare-nodes monitor, run by bash: a node whose heartbeat file changes is alive
    however old its mtime looks (NFS attribute caching, clock skew); one whose file stops
    changing for longer than HETRUN_NODE_TIMEOUT is named silent and its step killed, and so
    is one whose file is there but holds no line (a beat killed in its first write: the
    monitor skipped such a file for ever, and saw a death 122.8 s late, session 29). With
    every file still (``stall``: a shared file system that stalled, 6 s after the MoE LM's
    checkpoints, session 29) nobody is named; once the others beat again, the one still
    silent is, counted from then."""
    proc = _run_monitor(tmp_path, [
        'cd "$HETRUN_RUN_DIR/logs/alive" && ' + {"stuck": 'echo 1 > stuck && touch -d "1 hour ago" stuck',
                                                 "empty": ": > empty", "stall": "echo 1 > stall && echo 1 > live"}[dead],
        # live: a new counter every 0.2 s, its mtime always an hour old (a skewed clock); with a
        # stall, still for 3 s first (three times the timeout) like every other file
        f'(i=1; {"sleep 3; " if dead == "stall" else ""}'
        'while :; do i=$((i + 1)); echo "$i" > live; touch -d "1 hour ago" live; sleep 0.2; done) &',
        "_writer=$!",
        '(sleep 2.5; echo "$EPOCHREALTIME" > "$HETRUN_RUN_DIR/stall_over") &' if dead == "stall" else ":",
        f"_hetrun_heartbeats 4242 live {dead}",
        'kill "$_writer"',
    ])
    assert (tmp_path / "silent").read_text().split() == [dead], proc.stderr
    assert (tmp_path / "scancel.argv").read_text().split() == ["-s", "KILL", "4242.0"], proc.stderr
    assert f"node {dead} silent" in proc.stderr and "HETRUN_NODE_TIMEOUT=1" in proc.stderr, proc.stderr
    if dead == "stall":  # named only after the other node beat again (3 s), not while both were still
        named = float(proc.stderr.split("hetrun: ")[1].split()[0])
        assert named > float((tmp_path / "stall_over").read_text()), proc.stderr


def test_heartbeat_monitor_held_up_itself_names_no_live_node(tmp_path: Path) -> None:
    """A monitor that was itself held up (a stalled file system holds its reads too: session 29)
    must not count its own wait as silence: two nodes beat throughout, the monitor is stopped for
    2.5 s at a 1 s timeout and resumed; nobody is named (it had named a node that had just beaten)."""
    proc = _run_monitor(tmp_path, [
        'cd "$HETRUN_RUN_DIR/logs/alive"',
        "(i=0; while :; do i=$((i + 1)); echo $i > a; echo $i > b; sleep 0.1; done) & _writer=$!",
        "_hetrun_heartbeats 4242 a b & _mon=$!",
        "sleep 1.2; kill -STOP $_mon; sleep 2.5; kill -CONT $_mon; sleep 2",
        'kill "$_hetrun_pid" "$_writer"; wait "$_mon"',
    ])
    assert not (tmp_path / "silent").exists(), proc.stderr
    assert "silent for" not in proc.stderr, proc.stderr


def _function(lines: list[str], name: str) -> list[str]:
    """The lines of the batch script's bash function ``name``."""
    start = lines.index(f"{name}() {{")
    return lines[start:lines.index("}", start) + 1]


def _monitor_after_exits(tmp_path: Path, exits: int) -> subprocess.CompletedProcess[str]:
    """The spare-nodes monitor, run by bash against an srun that outlives every rank (a sleep
    standing in for it): both nodes' heartbeat files beat, then are removed (orderly ends),
    and ``exits`` of the step's 2 ranks wrote their exit event. The grace cut from 30 s to
    2 s (4 rounds of 0.5 s) in the monitor's text."""
    from hetrun.slurm_plugin.render import STUCK_AFTER_EXIT_S

    comps = _spec().model_dump()["components"]  # type: ignore[attr-defined]
    comps["rollout"]["spare_nodes"] = 1
    lines = _script(_spec(components=comps, preemption={"max_failures": 1})).splitlines()
    start = lines.index("_hetrun_heartbeats() {")
    monitor = [ln.replace(f'"$done_for" -ge {2 * STUCK_AFTER_EXIT_S}', '"$done_for" -ge 4')
               for ln in lines[start:lines.index("}", start) + 1]]
    assert monitor != lines[start:lines.index("}", start) + 1]
    alive = tmp_path / "logs" / "alive"
    alive.mkdir(parents=True)
    (tmp_path / "events.jsonl").write_text("".join(
        f'{{"ev":"exit","rank":{r},"code":0,"restart_count":0,"time":1}}\n' for r in range(exits))
        + '{"ev":"exit","rank":1,"code":0,"restart_count":3,"time":1}\n')  # another attempt's
    driver = "\n".join([
        "set -u", "_hetrun_node_timeout=5", '_hetrun_silent="$HETRUN_RUN_DIR/silent"', "_hetrun_ntasks=2",
        "_hetrun_kill_mark=KILLED", '_hetrun_srun_log="$HETRUN_RUN_DIR/srun.err"',
        "sleep 8 & _hetrun_pid=$!", *monitor,
        'cd "$HETRUN_RUN_DIR/logs/alive"',
        "(for i in 1 2 3 4; do echo $i > a; echo $i > b; sleep 0.3; done; rm -f a b) &",
        "_hetrun_heartbeats 4242 a b",
        'wait "$_hetrun_pid"; echo "srun-rc=$?"',
    ])
    env = {"PATH": "/usr/bin:/bin", "HETRUN_RUN_DIR": str(tmp_path)}
    return subprocess.run(["bash", "-c", driver], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_the_monitor_ends_an_srun_that_outlives_every_ranks_end(tmp_path: Path) -> None:
    """Every node's heartbeat removed and every rank's exit event written: an srun still there
    after the grace is ended (seen once: a restarted step's srun waited to the time limit).
    One exit event short, the monitor leaves srun alone (it ends by itself here)."""
    t0 = time.monotonic()
    ended = _monitor_after_exits(tmp_path / "all", exits=2)
    assert "every rank ended 30 s ago and srun still waits: ending it" in ended.stderr, ended.stderr
    assert ended.stdout.split() == ["srun-rc=137"] and time.monotonic() - t0 < 7, (ended.stdout, ended.stderr)
    short = _monitor_after_exits(tmp_path / "short", exits=1)
    assert "srun still waits" not in short.stderr, short.stderr
    assert short.stdout.split() == ["srun-rc=0"], short.stdout  # the sleep ended by itself, 8 s


def _watchdog_start(tmp_path: Path, signalled: bool, step: str = "4242.0",
                    sacct: str = "4242.0|COMPLETED|143:0|1", before: Sequence[str] = ()) -> subprocess.Popen[str]:
    """The srun watchdog, run by bash against an srun that outlives its step (a sleep: Slurm
    22.05's pmix hang cannot be made on demand) with squeue showing no step and accounting
    showing it ended once squeue has shown it. The process: its stderr has the message."""
    lines = _script(_spec()).splitlines()
    watchdog = _function(lines, "_hetrun_watchdog")
    step_rc = (_function(lines, "_hetrun_step_rc") + _function(lines, "_hetrun_job_steps")
               + _function(lines, "_hetrun_exits_rc"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    # The step runs at the first poll, then is gone; the warm servers' step (spare nodes:
    # runtime/warm_start.py) runs on and is never this srun's.
    (bin_dir / "squeue").write_text('#!/bin/bash\nwarm="4242.9 hetrun-warm"\n'
                                    '[ -e "$HETRUN_RUN_DIR/polled" ] && { echo "$warm"; exit 0; }\n'
                                    f'touch "$HETRUN_RUN_DIR/polled"; printf \'{step} python\\n%s\\n\' "$warm"\n')
    (bin_dir / "sacct").write_text(f"#!/bin/bash\nprintf '{sacct}\\n'\n" if sacct else "#!/bin/bash\n")
    for name in ("squeue", "sacct"):
        (bin_dir / name).chmod(0o755)
    driver = "\n".join([
        '_hetrun_stuck="$HETRUN_RUN_DIR/stuck"', *before, *step_rc, *watchdog,
        "sleep 120 & _hetrun_pid=$!",
        "_hetrun_watchdog 4242 & _hetrun_watch=$!",
        *(["sleep 0.5", 'kill -s USR2 "$_hetrun_watch"'] if signalled else []),
        'wait "$_hetrun_watch"',
    ])
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HETRUN_RUN_DIR": str(tmp_path)}
    # its own session: a test can end the driver with the srun stand-in and the watchdog
    return subprocess.Popen(["bash", "-c", driver], env=env, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_the_srun_watchdog_gives_a_signalled_job_one_poll_not_the_grace(tmp_path: Path) -> None:
    """Slurm kills a preempted job KillWait after its SIGTERM: an srun stuck after its step then
    gets one poll, so the post-mortem runs before the kill (seen once: 30 s, then SIGKILL, no
    attempt_end and Slurm's full requeue hold). Unsignalled it keeps the grace."""
    from hetrun.slurm_plugin.render import WATCHDOG_GRACE_S, WATCHDOG_POLL_S

    runs = {grace: (tmp_path / str(grace), _watchdog_start(tmp_path / str(grace), signalled=grace == WATCHDOG_POLL_S))
            for grace in (WATCHDOG_GRACE_S, WATCHDOG_POLL_S)}  # side by side: the unsignalled one takes ~20 s
    for grace, (where, proc) in runs.items():
        _, err = proc.communicate(timeout=90)
        assert f"srun still running {grace}s after its job step ended (exit 143)" in err, (grace, err)
        assert (where / "stuck").read_text().strip() == "143", err  # the post-mortem's exit code


def test_a_signalled_srun_watchdog_reads_the_ranks_exits_where_accounting_has_no_step(tmp_path: Path) -> None:
    """Neither squeue nor accounting shows the step's end (seen twice: a preempted PPO het job's
    batch shell waited for its srun until KillWait, the requeued job hiding the step, so no
    post-mortem and Slurm's full requeue hold): once every rank of this srun has written its
    exit event a poll ago, a signalled watchdog ends srun with their highest code. Fewer exit
    events (or an earlier srun's) end nothing, and ranks are counted, not events: a command
    component's rank writes two, its script's and then its wrapper's."""
    from hetrun.slurm_plugin.render import WATCHDOG_POLL_S

    now = time.time()
    events = [{"ev": "exit", "rank": 0, "code": 143, "reason": "SIGTERM", "time": now},
              {"ev": "exit", "rank": 1, "code": 143, "reason": "SIGTERM", "time": now + 0.1},  # its script's
              {"ev": "exit", "rank": 1, "code": 143, "command": True, "time": now + 1.1},  # its wrapper's
              {"ev": "exit", "rank": 1, "code": 137, "restart_count": 0, "time": now - 600}]  # an earlier srun's
    runs = {}
    for name, exits in (("all", 2), ("one", 1)):
        where = tmp_path / name
        where.mkdir()
        (where / "events.jsonl").write_text(  # compact, as the runtime writes its events
            "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events[2 - exits:]))
        before = ["_hetrun_exit_ranks=2", f"HETRUN_SRUN_START={now - 1:.6f}"]
        runs[name] = _watchdog_start(where, signalled=True, sacct="", before=before)
    _, err = runs["all"].communicate(timeout=60)
    assert f"srun still running {WATCHDOG_POLL_S}s after every rank's exit (exit 143)" in err, err
    assert (tmp_path / "all" / "stuck").read_text().strip() == "143", err
    time.sleep(2 * WATCHDOG_POLL_S)
    assert runs["one"].poll() is None and not (tmp_path / "one" / "stuck").exists()  # still waiting
    os.killpg(runs["one"].pid, signal.SIGKILL)  # the driver, its srun stand-in and its watchdog
    runs["one"].communicate(timeout=10)


def test_the_srun_watchdog_takes_its_own_steps_code_not_an_earlier_attempts(tmp_path: Path) -> None:
    """After restarts inside the allocation accounting also lists the earlier attempts' steps,
    killed (137): an srun stuck after its own step completed must end with that step's code, 0
    (seen: a run that finished its work ended FAILED). Its step: the newest squeue showed."""
    from hetrun.slurm_plugin.render import WATCHDOG_POLL_S

    sacct = "\\n".join(["4242+0.0|FAILED|0:9|1", "4242+1.0|CANCELLED|0:9|1", "4242+0.3|FAILED|0:9|2",
                        "4242+0.6|COMPLETED|0:0|3", "4242+0.7|COMPLETED|0:0|3", "4242+1.7|COMPLETED|0:0|3",
                        "4242+0.9|RUNNING|0:0|3|hetrun-warm"])  # the warm servers' step runs on
    proc = _watchdog_start(tmp_path, signalled=True, step="4242.7", sacct=sacct)
    _, err = proc.communicate(timeout=90)
    assert f"srun still running {WATCHDOG_POLL_S}s after its job step ended (exit 0)" in err, err
    assert (tmp_path / "stuck").read_text().strip() == "0", err


def test_each_het_part_names_its_component_so_spares_before_it_do_not_shift_the_ranks() -> None:
    """Slurm's het variables give each group's *allocated* tasks: with a spare node in the first
    group (learner 2 tasks on 1 node + 1 spare node), SLURM_NTASKS_HET_GROUP_0 is 4 (seen on Slurm
    22.05; no per-group step count is set), and rank 2, the rollout's first, counted itself into
    the learner. Each part of the one srun now names its component."""
    import shlex

    from hetrun.runtime.plan_view import plan_from_dict
    from hetrun.runtime.world import detect_component

    comps = _spec().model_dump()["components"]  # type: ignore[attr-defined]
    comps["learner"]["spare_nodes"] = 1
    spec = _spec(components=comps, preemption={"max_failures": 1})
    line = next(ln for ln in _script(spec).splitlines() if ln.lstrip().startswith("srun ") and " hetrun.runtime " in ln)
    parts = line.split(" : ")
    assert [shlex.split(p).count("HETRUN_COMPONENT=" + n) for p, n in zip(parts, ["learner", "rollout"], strict=True)] \
        == [1, 1], line
    view = plan_from_dict(json.loads(build_plan(spec).to_json()))
    slurm = {"SLURM_HET_SIZE": "2", "SLURM_NTASKS_HET_GROUP_0": "4", "SLURM_NTASKS_HET_GROUP_1": "2",
             "SLURM_PROCID": "2"}
    assert detect_component(slurm, view, 2, 4)[0].name == "learner"  # the miscount, without the name
    assert detect_component({**slurm, "HETRUN_COMPONENT": "rollout"}, view, 2, 4)[0].name == "rollout"
