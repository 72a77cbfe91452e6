"""Pool shapes of the local cluster (ClusterConfig gpu_types / cpu_nodes), rendered
without starting anything, and `hetrun pool` on a cluster that has run no job yet."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from hetrun.slurm_plugin import pool
from hetrun.slurm_plugin.cluster_conf import (
    ClusterConfig,
    node_groups,
    render_gres_conf,
    render_slurm_conf,
)

from hetrun.errors import SlurmError

DATA = Path(__file__).parent / "data" / "pool"


def _pool(tmp_path: Path, **kw: object) -> ClusterConfig:
    shape = {"nodes": 64, "cpus": 4, "gpus": 2, "mem_mb": 300, "gpu_types": ("a100", "v100"), "cpu_nodes": 16}
    return ClusterConfig(directory=tmp_path / "c", **{**shape, **kw})  # type: ignore[arg-type]


def test_gpu_types_split_the_gpu_nodes_into_partitions(tmp_path: Path) -> None:
    cfg = _pool(tmp_path)
    conf = render_slurm_conf(cfg)
    assert "NodeName=n[1-24] " in conf and "Port=[17001-17024] " in conf and "Gres=gpu:a100:2 " in conf
    assert "NodeName=n[25-48] " in conf and "Port=[17025-17048] " in conf and "Gres=gpu:v100:2 " in conf
    cpu_line = next(ln for ln in conf.splitlines() if ln.startswith("NodeName=n[49-64] "))
    assert "Port=[17049-17064] " in cpu_line and "Gres=" not in cpu_line
    for part, nodes in (("gpu-a100", "n[1-24]"), ("gpu-v100", "n[25-48]"), ("cpu", "n[49-64]"),
                        ("debug", "n[1-64]"), ("high", "n[1-64]")):
        assert f"PartitionName={part} Nodes={nodes} " in conf
    gres = render_gres_conf(cfg)
    assert f"NodeName=n[1-24] Name=gpu Type=a100 File={tmp_path}/c/fakegpu/gpu[0-1]\n" in gres
    assert f"NodeName=n[25-48] Name=gpu Type=v100 File={tmp_path}/c/fakegpu/gpu[0-1]\n" in gres
    assert "n[49-64]" not in gres


def test_uneven_split_and_cpu_nodes_without_types(tmp_path: Path) -> None:
    assert [(g.names, g.gres) for g in node_groups(_pool(tmp_path, nodes=5, cpu_nodes=0))] == [
        ("n[1-3]", "gpu:a100:2"), ("n[4-5]", "gpu:v100:2")]
    groups = node_groups(_pool(tmp_path, nodes=4, gpu_types=(), cpu_nodes=1))
    assert [(g.names, g.gres, g.partition) for g in groups] == [("n[1-3]", "gpu:2", "gpu"), ("n4", "", "cpu")]


def test_default_shape_is_one_group_without_extra_partitions(tmp_path: Path) -> None:
    conf = render_slurm_conf(ClusterConfig(directory=tmp_path / "c"))
    assert [ln.split()[0] for ln in conf.splitlines() if ln.startswith("PartitionName=")] == [
        "PartitionName=debug", "PartitionName=high"]


def test_shape_survives_cluster_json(tmp_path: Path) -> None:
    cfg = _pool(tmp_path)
    assert ClusterConfig.from_json(cfg.to_json()) == cfg
    old = json.loads(cfg.to_json())
    del old["gpu_types"], old["cpu_nodes"]  # a cluster.json written before pool shapes
    assert ClusterConfig.from_json(json.dumps(old)).gpu_types == ()


@pytest.mark.parametrize(("kw", "words"), [
    ({"gpu_types": ("a 100",)}, "gpu_types=['a 100']"),  # A100 is a valid type (check_gpu_type's one rule)
    ({"gpu_types": ("a100", "a100")}, "distinct"),
    ({"gpu_types": ("a1;rm",)}, "gpu_types"),
    ({"cpu_nodes": 64}, "cpu_nodes=64 is out of range"),
    ({"cpu_nodes": -1}, "cpu_nodes=-1"),
    ({"gpus": 0}, "need GPUs"),
    ({"nodes": 3, "cpu_nodes": 2}, "need GPUs on at least as many nodes"),
])
def test_bad_shapes_are_refused_with_the_value(tmp_path: Path, kw: dict[str, object], words: str) -> None:
    with pytest.raises(SlurmError, match="cluster config") as info:
        _pool(tmp_path, **kw)
    assert words in str(info.value) and info.value.hint


def test_pool_of_a_cluster_without_jobs_is_not_an_error() -> None:
    # sacct -P on a fresh cluster prints nothing (exit 0): no usage, not an error.
    answers = {"sinfo": (DATA / "sinfo.json").read_text(), "squeue": (DATA / "squeue.json").read_text(),
               "sacct": "", "sshare": (DATA / "sshare.txt").read_text()}

    def run(argv: Sequence[str]) -> str:
        return answers[argv[0]]

    snap = pool.collect(run, hours=1, now=0.0)
    assert snap.rows and all(a.cpu_seconds == 0 for a in snap.accounts)
    answers["squeue"] = json.dumps({"errors": [{"error_number": 1, "error": "boom"}]})
    with pytest.raises(SlurmError, match="boom"):
        pool.collect(run, hours=1, now=0.0)


def test_cluster_up_refuses_a_bad_shape_before_touching_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    from hetrun.cli.app import app
    from hetrun.slurm_plugin import cluster
    from typer.testing import CliRunner

    def must_not_run(*_a: object, **_k: object) -> None:
        raise AssertionError("cluster.up reached with a bad shape")

    monkeypatch.setattr(cluster, "up", must_not_run)
    for args, words in ((["--gpu-types", "a100,A100"], "gpu_types=['a100', 'A100']"),
                        (["--cpu-nodes", "99"], "cpu_nodes=99 is out of range")):
        result = CliRunner().invoke(app, ["cluster", "up", "--no-install", *args])
        # cli.app.main turns the SlurmError into "hetrun: error: ..." and exit 3
        assert isinstance(result.exception, SlurmError) and words in str(result.exception), result.output
