"""The object-store tier in real Slurm runs: credentials never land in the run
directory, and a resubmitted run whose shared checkpoint directory is empty
(another cluster, a purged scratch) restores from the bucket alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_helpers import run_dir_of
from hetrun.runtime.ckpt import CheckpointStore, Tier, local_s3
from hetrun.runtime.ckpt.object_store import ObjectStore
from hetrun.runtime.ckpt.object_tier import BucketTier

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
BUCKET = "hetrun-slurm"


def _job(prefix: str, endpoint: str, iterations: int) -> dict[str, Any]:
    return {
        "name": "s3ckpt", "workload": "hetrun.examples.moe_lm:MoELMWorkload",
        "workload_args": {"d_model": 32, "n_layers": 1, "num_experts": 4, "num_groups": 2, "top_k": 2,
                          "seq_len": 32, "batch_size": 8, "lr": 0.003, "corpus_bytes": 300000},
        "components": {"learner": {"nodes": 1, "tasks_per_node": 1, "mem": "1G",
                                   "actions": ["forward", "backward", "optimize", "checkpoint"]}},
        "training": {"kind": "supervised", "iterations": iterations, "micro_batches": 1, "pipeline_window": 1,
                     "seed": 0},
        "slurm": {"partition": "debug", "time": "00:10:00"},
        "checkpoint": {"interval": 2, "keep": 2,
                       "object_store": {"url": f"s3://{BUCKET}/{prefix}", "endpoint": endpoint}},
        "env": {"OMP_NUM_THREADS": "1"},
        "comms": {"forward_codec": "none", "backward_codec": "none"},
    }


def _submit(job_dir: Path, doc: dict[str, Any], env: dict[str, str]) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "job.yaml").write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, "-m", "hetrun.cli", "submit", str(job_dir / "job.yaml"),
                           "--runs-dir", str(job_dir / "runs"), "--wait", "--wait-timeout", "400"],
                          capture_output=True, text=True, env=env, timeout=500, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir_of(proc)


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def two_runs(slurm_cluster: Any, weed_s3: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run 1 (4 iterations, checkpoints to file tier + bucket), then run 2 of the same job
    file with 6 iterations in a NEW run directory: its checkpoint directory is empty."""
    local_s3.make_bucket(weed_s3, BUCKET)
    root = Path(os.environ.get("HETRUN_TEST_SHARED_TMP", "/var/tmp/hetrun-tests")) / f"s3slurm-{uuid.uuid4().hex[:8]}"
    prefix = uuid.uuid4().hex[:10]
    env = {**os.environ, **weed_s3.env()}
    env.pop("AWS_ENDPOINT_URL")  # the job file names the endpoint
    first = _submit(root / "a", _job(prefix, weed_s3.endpoint, 4), env)
    second = _submit(root / "b", _job(prefix, weed_s3.endpoint, 6), env)
    return {"first": first, "second": second, "prefix": prefix, "srv": weed_s3, "root": root}


def test_no_credential_in_any_file_of_the_run(two_runs: dict[str, Any]) -> None:
    srv = two_runs["srv"]
    secrets = [srv.secret_key.encode(), srv.access_key.encode()]
    checked = 0
    for run in (two_runs["first"], two_runs["second"]):
        for path in run.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                checked += 1
                for s in secrets:
                    assert s not in data, f"{s!r} found in {path}"
        plan = json.loads((run / "plan.json").read_text())
        assert plan["checkpoint"]["object_store"]["url"] == f"s3://{BUCKET}/{two_runs['prefix']}"
    assert checked > 5


def test_steps_reach_the_bucket_in_the_background(two_runs: dict[str, Any]) -> None:
    ups = [e for e in _events(two_runs["first"]) if e["ev"] == "ckpt_upload"]
    assert [e["step"] for e in ups] == [2, 4], ups
    assert all(e["ok"] and e["committed"] for e in ups)
    assert ups[1]["uploaded_objects"] < ups[1]["objects"] or ups[1]["uploaded_objects"] <= ups[0]["uploaded_objects"]
    assert not [e for e in _events(two_runs["first"]) if e["ev"] == "ckpt_tier_failure"]


def test_resubmitted_run_restores_from_the_bucket_alone_bit_identical(two_runs: dict[str, Any]) -> None:
    second = two_runs["second"]
    restores = [e for e in _events(second) if e["ev"] == "restore"]
    assert restores and restores[0]["step"] == 4 and restores[0]["restored_state"], restores
    srv = two_runs["srv"]
    bucket = ObjectStore(f"s3://{BUCKET}/{two_runs['prefix']}/learner", env=srv.env())
    assert bucket.manifest_steps() == [4, 6]  # keep: 2
    disk = CheckpointStore([Tier(two_runs["first"] / "ckpt" / "learner")])
    a, _, _ = disk.load_rank(4, 0, full_hash=True)
    assert 4 not in CheckpointStore([Tier(second / "ckpt" / "learner")]).steps()
    b, _, _ = CheckpointStore([BucketTier(bucket)]).load_rank(4, 0, full_hash=True)

    def flat(x: Any) -> list[torch.Tensor]:
        if isinstance(x, torch.Tensor):
            return [x]
        if isinstance(x, dict):
            return [t for k in sorted(x, key=str) for t in flat(x[k])]
        if isinstance(x, list | tuple):
            return [t for v in x for t in flat(v)]
        return []

    ta, tb = flat(a), flat(b)
    assert ta and len(ta) == len(tb)
    assert all(x.dtype == y.dtype and torch.equal(x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8))
               for x, y in zip(ta, tb, strict=True))
