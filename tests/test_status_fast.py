"""`hetrun status` with many runs (issue 24): its plain forms skip Typer's start-up (whose
parameter coercion imports pydantic) and print what the Typer path prints; with 100 runs in
the directory it makes one squeue call (and one sacct for the runs that left the queue);
a run whose job has ended is answered from its status cache afterwards (no Slurm call), and
read afresh once a file it came from changes; the event reader's fast scan keeps exactly
the lines the line-by-line reader kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hetrun.cli.status_show import fast_args

from hetrun.rundir import STATUS_CACHE

# The benchmark's runs and ended jobs: one home for their shape.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from status_scale import ended_het_job, finished_het_jobs, make_runs, shim

PROBE = """
import sys
from hetrun.cli.entry import main
try:
    main({argv!r})
except SystemExit:
    pass
print("PYDANTIC=" + str("pydantic" in sys.modules) + " TYPER=" + str("typer" in sys.modules))
"""


def test_fast_args_take_the_plain_forms_only() -> None:
    assert fast_args(["r1", "--runs-dir", "/x", "-n", "0", "--json"]) == {
        "runs": ["r1"], "runs_dir": Path("/x"), "last": 0, "as_json": True}
    assert fast_args(["--runs-dir=/x", "--last=3"]) == {"runs": [], "runs_dir": Path("/x"), "last": 3,
                                                        "as_json": False}
    for typer_parses in (["--watch"], ["--help"], ["-n", "x"], ["--interval", "1"], ["--runs-dir"], ["-w"]):
        assert fast_args(typer_parses) is None, typer_parses


def test_status_of_100_runs_one_squeue_no_pydantic_same_as_typer(slurm_cluster, shared_tmp: Path) -> None:
    runs, bin_dir, log = shared_tmp / "runs", shared_tmp / "bin", shared_tmp / "calls.log"
    bin_dir.mkdir()
    make_runs(runs, 100)
    shim(bin_dir, log)
    env = {**os.environ, "HETRUN_RUNS": str(runs), "PATH": f"{bin_dir}:{os.environ['PATH']}", "COLUMNS": "200"}

    def run(argv: list[str]) -> str:
        log.write_text("")
        proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True,
                              env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    fast = run(["status", "--json"])
    assert sorted(log.read_text().split()) == ["sacct", "squeue"]  # one each, for 20 runs
    assert "PYDANTIC=False TYPER=False" in fast  # the console script's fast path: neither imported
    typer_path = run(["status", "--json", "--interval", "2"])  # --interval: only Typer parses it
    assert "PYDANTIC=True TYPER=True" in typer_path
    doc = json.loads(fast.rsplit("PYDANTIC", 1)[0])
    assert doc == json.loads(typer_path.rsplit("PYDANTIC", 1)[0]) and len(doc) == 20
    assert doc[0]["counts"]["preemptions"] == 1 and doc[0]["work_lost"] == 9
    table = run(["status", "--last", "0"])
    assert table.count("bench-") == 100 and sorted(log.read_text().split()) == ["sacct", "squeue"]
    assert not list(runs.glob(f"*/{STATUS_CACHE}"))  # jobs neither squeue nor sacct knows: nothing final


def test_an_ended_run_is_answered_from_its_cache_until_a_file_it_came_from_changes(
        slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    # Het jobs of this cluster that ended and left squeue (earlier Slurm tests leave plenty;
    # on a fresh cluster one is submitted and waited for: 2-3 minutes).
    ended = finished_het_jobs(limit=3) or [ended_het_job(shared_tmp)]
    runs, bin_dir, log = shared_tmp / "runs", shared_tmp / "bin", shared_tmp / "calls.log"
    bin_dir.mkdir()
    make_runs(runs, 3, ended)
    shim(bin_dir, log)
    env = {**os.environ, "HETRUN_RUNS": str(runs), "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def status(*args: str) -> tuple[str, list[str]]:
        log.write_text("")
        proc = subprocess.run([sys.executable, "-m", "hetrun.cli", "status", *args], capture_output=True,
                              text=True, env=env, timeout=120)
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
        return proc.stdout, sorted(log.read_text().split())

    first, calls = status()
    assert calls == ["sacct", "squeue"] and len(list(runs.glob(f"*/{STATUS_CACHE}"))) == 3
    assert "UNKNOWN" not in first and first.count("bench-") == 3, first
    assert status() == (first, [])  # the same table, no Slurm command
    first_json, calls = status("--json")
    assert calls == [] and [r["counts"]["preemptions"] for r in json.loads(first_json)] == [1, 1, 1]

    # A line appended to one run's events: that run is read again (sacct), the others not.
    changed = sorted(runs.iterdir())[1]
    with (changed / "events.jsonl").open("a") as fh:
        fh.write(json.dumps({"ev": "attempt_end", "restart_count": 1, "outcome": "preempted", "requeued": True,
                             "exit_code": 0, "reason": "bench", "time": 2000}) + "\n")
    again, calls = status("--json")
    assert calls == ["sacct", "squeue"]
    assert [r["counts"]["preemptions"] for r in json.loads(again)] == [1, 2, 1]
    table, calls = status()  # the table writes the new record; then no call again
    assert calls == ["sacct", "squeue"] and status() == (table, [])
    assert table != first and table.count("│ 2       │") == 1, table

    # run.json rewritten with a job neither squeue nor sacct knows (as a resubmit rewrites it):
    # never the old job's cached state; a cache that does not parse is read afresh.
    record = json.loads((changed / "run.json").read_text())
    (changed / "run.json").write_text(json.dumps({**record, "job_id": "987654"}))
    (sorted(runs.iterdir())[0] / STATUS_CACHE).write_text("{not json")
    table, calls = status()
    assert calls == ["sacct", "squeue"] and "gone from squeue and sacct" in table, table
    assert status()[1] == ["sacct", "squeue"]  # the unknown job is never cached
    assert json.loads((sorted(runs.iterdir())[0] / STATUS_CACHE).read_text())["version"] == 1


def test_status_reads_sacct_text_as_the_json_reader_reads_the_same_jobs(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    # status asks `sacct -X -D -P` (~0.1 s; --json ~0.45 s): each ended het job of this cluster
    # (the newest 100, and every one that was requeued) read both ways must agree with the
    # report's --json reader (reports/sacct.py): state, job id, nodes, elapsed, attempts.
    from hetrun.reports.sacct import accounting_rows
    from hetrun.slurm_plugin.backends.sbatch import SbatchBackend

    acct = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-S", "2000-01-01", "--format=JobID,State"],
                          capture_output=True, text=True, check=True).stdout
    requeued = {line.split("+")[0] for line in acct.splitlines() if "+" in line and "|REQUEUED" in line}
    every = finished_het_jobs(limit=10**6) or [ended_het_job(shared_tmp)]
    ids = sorted(set(every[:100]) | (requeued & set(every)), key=int)
    text = SbatchBackend()._sacct(ids)
    doc = json.loads(subprocess.run(["sacct", "--json", "-D", "-j", ",".join(ids)], capture_output=True, text=True,
                                    check=True).stdout)
    for leader in ids:
        rows = accounting_rows(doc, leader, ["c0", "c1"])
        newest = {r["component"]: r for r in rows}  # rows are in attempt order: the last one counts
        mine = {f"c{r['het_offset']}": r for r in text if r["het_job_id"] == leader}
        assert sorted(mine) == sorted(newest) == ["c0", "c1"], (leader, rows, mine)
        for comp, row in newest.items():
            got = mine[comp]
            assert (got["state"], got["job_id"], got["nodes"], got["elapsed_s"], got["restarts"]) == (
                row["state"], row["job_id"], row["nodes"], row["elapsed_s"], row["attempt"]), (leader, row, got)
            # 22.05's --json says return code 0 for a FAILED job whose ExitCode is 9:0; the text is right.
            json_code = int(row["exit_code"].split(":")[0])
            assert got["exit_code"] == json_code or (json_code == 0 and got["state"] != "COMPLETED"), (row, got)
    assert any(r["restarts"] for r in text) == bool(requeued & set(ids))


def test_the_sacct_text_parse_keeps_one_record_per_component_and_attempt() -> None:
    from hetrun.slurm_plugin.backends.sbatch import _latest_attempts, _parse_sacct_parsable

    raw = "\n".join([
        "9+1|10|REQUEUED|4|n2|0:0|2026-01-01T00:00:01|a|b",  # listed first, submitted first
        "9+0|9|PREEMPTED|4|n1|0:15|2026-01-01T00:00:01|a|b",
        "9+0|9|CANCELLED by 0|0|None assigned|0:0|2026-01-01T00:00:09|a|b",
        "9+0.batch|9.batch|CANCELLED|0|n1|0:15|2026-01-01T00:00:09|batch",
        "9+1.0|10.0|CANCELLED|0|n2|0:15|2026-01-01T00:00:09|python",
        "9+1|10|NODE_FAIL|61|n3|1:0|2026-01-01T00:00:09|a|b",
        "12|12|COMPLETED|7|n4|0:0|2026-01-01T00:00:03|plain",
        "13|13|||||",  # torn line (fewer fields): skipped
    ])
    recs = _parse_sacct_parsable(raw)
    assert [r["job_id"] for r in recs] == ["10", "9", "12", "9", "10"]  # steps out; in submit order
    assert recs[0]["name"] == "a|b" and recs[2]["het_offset"] == 0 and recs[2]["het_job_id"] == "12"
    out = {(r["het_job_id"], r["het_offset"]): r for r in _latest_attempts(recs)}
    assert {k: (r["state"], r["restarts"], r["elapsed_s"], r["exit_code"], r["nodes"]) for k, r in out.items()} == {
        ("9", 0): ("CANCELLED", 1, 0, 0, "None assigned"), ("9", 1): ("NODE_FAIL", 1, 61, 1, "n3"),
        ("12", 0): ("COMPLETED", 0, 7, 0, "n4")}


@pytest.mark.parametrize("torn", [False, True])
def test_the_kinds_scan_keeps_what_the_line_reader_kept(tmp_path: Path, torn: bool) -> None:
    from hetrun.reports.reader import EventStream

    lines = [{"ev": "start", "rank": 0}, {"ev": "action", "type": "start", "iteration": 1},
             {"ev": "restore", "rank": 0, "message": 'said "ev":"start" once'}, {"ev": "exit", "code": 0}]
    text = json.dumps(lines[0]) + "\n" + "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in lines[1:])
    (tmp_path / "events.jsonl").write_text(text + ('{"ev":"start","ra' if torn else ""))
    kept = EventStream(tmp_path, kinds=("start", "restore"))
    assert [e["ev"] for e in kept] == ["start", "restore"]
    everything = EventStream(tmp_path)
    assert len(list(everything)) == 4
    assert (kept.lines, kept.skipped) == (everything.lines, everything.skipped) == (5 if torn else 4, int(torn))



def test_the_table_is_drawn_as_before_and_cut_only_to_a_terminal() -> None:
    from hetrun.cli.status_show import _table_text

    header, rows = ["RUN", "STATE", "REASON"], [["r1", "FAILED", "rank 3 raised ValueError: bad"], ["", "DONE", ""]]
    lines = _table_text(header, rows, None).splitlines()
    assert lines == ["RUN ┃ STATE  ┃ REASON",
                     "━━━━╇━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━",
                     "r1  │ FAILED │ rank 3 raised ValueError: bad",
                     "    │ DONE   │"]
    cut = _table_text(header, rows, 30).splitlines()
    assert cut[2] == "r1  │ FAILED │ rank 3 raised …" and all(len(x) <= 30 for x in cut)


def test_only_sacct_s_end_states_for_every_component_are_final() -> None:
    from hetrun.cli.status_cache import is_final
    from hetrun.slurm_plugin.backends.base import ACTIVE_STATES, ComponentStatus

    names = ["learner", "rollout"]
    done = [ComponentStatus("learner", "COMPLETED"), ComponentStatus("rollout", "CANCELLED")]
    assert is_final(done, names, "sacct", ACTIVE_STATES)
    assert not is_final(done, names, "squeue", ACTIVE_STATES)  # the controller holds it: requeue can revive it
    assert not is_final(done[:1], names, "sacct", ACTIVE_STATES)  # a component sacct did not list (yet)
    for not_ended in ("RUNNING", "REQUEUED", "PENDING", "UNKNOWN", "ERROR"):
        assert not is_final([done[0], ComponentStatus("rollout", not_ended)], names, "sacct", ACTIVE_STATES)


def test_the_key_changes_with_any_source_file_even_a_same_size_same_mtime_rename(tmp_path: Path) -> None:
    from hetrun.cli.status_cache import fingerprint, read, write

    (tmp_path / "run.json").write_text('{"job_id": "11"}')
    key = fingerprint(str(tmp_path))
    write(str(tmp_path), key, [{"name": "a", "state": "COMPLETED"}], {"restarts": 0})
    assert read(str(tmp_path), key) is not None and read(str(tmp_path), fingerprint(str(tmp_path))) is not None
    st = (tmp_path / "run.json").stat()
    (tmp_path / "new.json").write_text('{"job_id": "12"}')  # as run.json is rewritten: temp file, rename
    os.utime(tmp_path / "new.json", ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp_path / "new.json", tmp_path / "run.json")
    assert read(str(tmp_path), fingerprint(str(tmp_path))) is None
    (tmp_path / "events.jsonl").write_text("{}\n")  # a file that was absent appears
    assert fingerprint(str(tmp_path)) != key


def test_a_cached_summary_of_another_shape_is_not_used() -> None:
    from hetrun.cli.status_show import _summary_ok

    good = {"placements": {}, "restarts": 1, "preemptions": 1, "failures": 0, "work_lost": 9,
            "failure": ["learner", "rank 0 raised ValueError"], "node_failures": []}
    assert _summary_ok(good) and _summary_ok({**good, "failure": None})
    for bad in ({**good, "failure": "text"}, {**good, "restarts": "1"}, {k: v for k, v in good.items() if k != "failures"},
                {**good, "extra": 1}):
        assert not _summary_ok(bad), bad
