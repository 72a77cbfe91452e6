"""`hetrun pool`: parsers over real Slurm 22.05 JSON (tests/data/pool/, captured on the
local cluster with one running GPU job and one pending 4-node job), and a live
snapshot of the local cluster."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from hetrun.slurm_plugin import pool

from hetrun.errors import SlurmError

DATA = Path(__file__).parent / "data" / "pool"


def load(name: str):
    return json.loads((DATA / name).read_text())


def test_rows_per_partition_and_gres_from_real_sinfo() -> None:
    rows = pool.rows_from_sinfo(load("sinfo.json"))
    assert [(r.partition, r.gres) for r in rows] == [("debug", "gpu"), ("high", "gpu")]
    debug = rows[0]
    # n1 ran a 1-CPU, 100 MB, 1-GPU job; the other three nodes were idle.
    assert debug.nodes == {"mixed": 1, "idle": 3}
    assert (debug.cpus_alloc, debug.cpus_total) == (1, 8)
    assert (debug.gpus_alloc, debug.gpus_total) == (1, 8)
    assert (debug.mem_alloc_mb, debug.mem_total_mb) == (100, 16000)


def test_drained_nodes_and_gpu_types_split_rows() -> None:
    data = copy.deepcopy(load("sinfo.json"))
    nodes = data["nodes"]
    nodes[2]["state_flags"] = ["DRAIN"]
    nodes[2]["reason"] = "bad DIMM"
    nodes[2]["reason_changed_at"] = 1796138000
    nodes[3]["gres"], nodes[3]["gres_used"] = "gpu:a100:2(S:0)", "gpu:a100:1(IDX:0)"
    rows = {(r.partition, r.gres): r for r in pool.rows_from_sinfo(data)}
    assert rows[("debug", "gpu")].nodes == {"mixed": 1, "idle": 1, "drained": 1}
    assert rows[("debug", "gpu:a100")].gpus_alloc == 1
    bad = pool.troubled_nodes(data, {"n1": 2})
    assert [(t.node, t.state, t.reason, t.failed_jobs) for t in bad] == [
        ("n1", "mixed", "", 2), ("n3", "drained", "bad DIMM", 0)]


def test_pending_demand_from_real_squeue() -> None:
    pending, running = pool.pending_from_squeue(load("squeue.json"))
    assert running == 1
    assert len(pending) == 1 and pending[0].partition == "debug" and pending[0].jobs == 1
    assert pending[0].tres == {"cpu": 8, "mem": 12000, "node": 4}


def test_allocated_share_counts_only_the_window() -> None:
    # sacct -a -X -D -P -n --format=POOL_SACCT_FORMAT of the same two jobs as sinfo.json/squeue.json
    # (job 1: 1 CPU + 1 GPU for 3 s; job 2 cancelled while pending: no start, no TRES).
    text = (DATA / "sacct.txt").read_text()
    job = text.splitlines()[0].split("|")
    start, end = (datetime.fromisoformat(job[i]).timestamp() for i in (2, 3))
    usage, _ = pool.usage_from_sacct(text, now=end + 100, hours=1)
    assert usage == {"root": [3.0, 3.0]}
    # A window that starts one second after the job did sees two seconds of it.
    usage, _ = pool.usage_from_sacct(text, now=start + 1 + 3600, hours=1)
    assert usage["root"] == [2.0, 2.0]
    # Still running (End Unknown): counted up to now; a typed GPU is counted once (gres/gpu).
    running = "|".join([*job[:3], "Unknown", "n1", "vision", "cpu=4,gres/gpu=2,gres/gpu:a100=2,mem=1G"])
    assert pool.usage_from_sacct(running, now=start + 10, hours=1)[0] == {"vision": [40.0, 20.0]}
    # Every attempt of a requeued job (-D), a het component (J+1) and NODE_FAIL per node; steps left out.
    failed = "\n".join(["7+1|" + "|".join([*job[1:4], "n[1-2]", "", "cpu=2"]).replace("CANCELLED by 0", "NODE_FAIL"),
                        "7+1|NODE_FAIL|" + "|".join([*job[2:4], "n2", "", "cpu=2"]),
                        "7+1.batch|NODE_FAIL|" + "|".join([*job[2:4], "n3", "", "cpu=2"])])
    usage, node_fail = pool.usage_from_sacct(failed, now=end, hours=1)
    assert node_fail == {"n1": 1, "n2": 2} and usage == {"-": [12.0, 0.0]}


def test_a_time_sacct_printed_in_another_format_is_a_clear_error() -> None:
    with pytest.raises(SlurmError, match=r"'Today 15:17', not ISO 8601") as info:
        pool.usage_from_sacct("1|COMPLETED|Today 15:17|Unknown|n1|root|cpu=1", now=0.0, hours=1)
    assert "SLURM_TIME_FORMAT=standard" in (info.value.hint or "")


def test_sshare_accounts_and_shares() -> None:
    shares = pool.shares_from_sshare((DATA / "sshare.txt").read_text())
    assert set(shares) == {"root"}
    text = ("Account|User|RawShares|NormShares|RawUsage|EffectvUsage|FairShare\n"
            "root||||10|0.0|\n  vision||40|0.8|6|0.6|0.25\n  vision|alice|1|1.0|6|0.6|0.2\n")
    accts = pool.accounts_from(pool.shares_from_sshare(text), {"vision": [30.0, 10.0], "nlp": [10.0, 0.0]})
    by = {a.account: a for a in accts}
    assert by["vision"].raw_shares == 40 and by["vision"].fairshare == 0.25
    assert by["vision"].cpu_share == 0.75 and by["vision"].gpu_share == 1.0
    assert by["nlp"].fairshare is None and by["nlp"].cpu_share == 0.25


@pytest.mark.parametrize(("text", "nodes"), [
    ("n[1-3,5]", ["n1", "n2", "n3", "n5"]), ("a01,b[08-10]", ["a01", "b08", "b09", "b10"]), ("", [])])
def test_hostlists(text: str, nodes: list[str]) -> None:
    assert pool.expand_hostlist(text) == nodes


def test_gres_strings() -> None:
    # Slurm's spelling kept: its GRES type match is case-sensitive (tests/test_gpu_type_case.py)
    assert pool.parse_gres("gpu:A100:2(S:0-1),shard:8") == {"gpu:A100": 2, "shard": 8}
    assert pool.parse_gres("(null)") == {}


def test_live_pool_makes_one_call_each(slurm_cluster) -> None:
    calls: list[list[str]] = []
    from hetrun.slurm_plugin.backends.slurm_cli import run_slurm

    def run(argv):
        calls.append(list(argv))
        return run_slurm(argv).stdout

    snap = pool.collect(run, hours=1)
    assert [c[0] for c in calls] == ["sinfo", "squeue", "sacct", "sshare"]
    nodes = sum(r.node_total for r in snap.rows if r.partition == "debug")
    assert nodes == slurm_cluster.config.nodes
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "pool", "--json", "--hours", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {r["partition"] for r in data["rows"]} >= {"debug", "high"}


def test_collector_reads_sinfo_and_squeue_each_time_and_the_history_once_per_window() -> None:
    """pool.Collector (a submitter placing job after job): sinfo + squeue fresh for every
    snapshot, sacct + sshare (the history, slurmdbd's part) again only after ``history_s``;
    the snapshot is the one ``collect`` builds from the same answers."""
    answers = {"sinfo": (DATA / "sinfo.json").read_text(), "squeue": (DATA / "squeue.json").read_text(),
               "sacct": (DATA / "sacct.txt").read_text(), "sshare": (DATA / "sshare.txt").read_text()}
    calls: list[str] = []

    def run(argv):
        calls.append(argv[0])
        return answers[argv[0]]

    snaps = pool.Collector(run, hours=1, history_s=30)
    first = snaps.snapshot(now=1000.0)
    again = snaps.snapshot(now=1029.0)
    assert calls == ["sinfo", "squeue", "sacct", "sshare", "sinfo", "squeue"]
    assert again.to_json() | {"taken_at": 0} == first.to_json() | {"taken_at": 0}
    snaps.snapshot(now=1030.0)  # the window is over: the history again
    assert calls[6:] == ["sinfo", "squeue", "sacct", "sshare"]
    calls.clear()
    assert pool.collect(run, hours=1, now=1000.0).to_json() == first.to_json()
    assert calls == ["sinfo", "squeue", "sacct", "sshare"]
    (running,) = first.running_use  # squeue.json's running job, with where and since when
    assert running.nodes == ("n1",) and running.start == 1796138228.0
