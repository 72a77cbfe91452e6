"""GPU (GRES) type names and case: a job names types ignoring case (``gpu_types: [a100]``), while the
``--gres`` hetrun renders keeps the cluster's own spelling, because Slurm's type match is
case-sensitive: on Slurm 22.05 ``--gres=gpu:a100:1`` is refused ("Requested node configuration is
not available") where gres.conf says ``Type=A100``, and ``gpu:A100:1`` is accepted. The live test
shows it on a throw-away cluster whose types are A100 and v100."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import load_spec
from hetrun.slurm_plugin import placement
from hetrun.slurm_plugin.placement_fit import choose, record, with_runner_env
from hetrun.slurm_plugin.render import render_sbatch
from test_placement import TYPES, snapshot

JOB = """\
name: case
components:
  trainer:
    nodes: 1
    gpus_per_node: 1
    mem: 100M
    placement: auto
    gpu_types: [a100]
    command: [sleep, "1"]
slurm: {time: "00:05:00"}
"""


def test_a_type_named_in_another_case_is_matched_and_rendered_as_the_cluster_spells_it() -> None:
    snap = snapshot({**TYPES, "n1": "A100", "n2": "A100"}, busy=set())
    assert {r.gres for r in snap.rows} >= {"gpu:A100", "gpu:v100"}
    cands = placement.score(placement.Need(1, 1, 1, gpu_types=("a100",)), snap)
    assert cands and {c.gres for c in cands} == {"gpu:A100"}


@pytest.fixture(scope="module")
def cluster(slurm_cluster) -> Iterator[object]:  # type: ignore[no-untyped-def]
    from second_cluster import SecondCluster

    c = SecondCluster(nodes=2, gpu_types=("A100", "v100"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.mark.slurm
@pytest.mark.slow
def test_placement_on_an_upper_case_type_is_one_slurm_accepts(cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "job.yaml").write_text(JOB)
    spec = load_spec(tmp_path / "job.yaml")
    run, test_only = with_runner_env(cluster.env)
    report = choose(spec, run=run, test_only=test_only)
    best = report.components["trainer"].best
    # Slurm gave the A100 candidate a start time: it accepted --gres=gpu:A100:1 in sbatch --test-only
    assert best is not None and best.gres == "gpu:A100" and best.start_in_s is not None, best
    refused = cluster.run("sbatch", "--test-only", "-p", best.partition, "--gres=gpu:a100:1", "-t", "1",
                          "--wrap", "true", check=False)
    assert refused.returncode != 0 and "not available" in refused.stderr, refused.stderr  # why the case is kept
    assert "#SBATCH --gres=gpu:A100:1" in render_sbatch(record(build_plan(spec), report), spec, tmp_path / "run")
