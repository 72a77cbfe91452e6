"""The ideal-scheduler reference of the pool trace replay (benchmarks/pool_ideal.py), on
traces small enough to schedule by hand."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "pool_ideal.py"


@pytest.fixture(scope="module")
def ideal():
    spec = importlib.util.spec_from_file_location("pool_ideal_under_test", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@dataclass
class J:
    at: float
    tier: str
    nodes: int
    seconds: int
    gpu_types: tuple[str, ...] = ("a100",)
    script_partition: str = "gpu-a100"


def test_a_small_job_passes_a_blocked_large_one_at_once(ideal):
    # 2 nodes. t=0 a 1-node 10 s job starts; t=1 a critical 2-node job cannot start;
    # t=2 a 1-node 4 s job starts beside the first (nothing held for the large one), ends 6;
    # the large one starts at 10, ends 15. Pending 1..10 with 1, 2, 1 nodes busy: 13 / (9 x 2).
    trace = [J(0, "normal", 1, 10), J(1, "critical", 2, 5), J(2, "normal", 1, 4)]
    out = ideal.ideal_share(trace, ideal.kinds_accepted, node_kinds={"a100": 2})
    assert out == {"alloc_share_while_pending": round(13 / 18, 3), "pending_seconds": 9.0, "makespan_s": 15.0}


def test_tier_order_against_fifo(ideal):
    # 2 nodes, both busy until 10. Waiting: a normal 2-node job (arrived first) and a
    # critical 1-node one. By tier the critical one starts at 10 (1 node busy, the normal
    # job pends until 13); FIFO starts the normal one at 10 and the critical one at 20.
    trace = [J(0, "normal", 2, 10), J(1, "normal", 2, 10), J(2, "critical", 1, 3)]
    by_tier = ideal.ideal_share(trace, ideal.kinds_accepted, node_kinds={"a100": 2})
    fifo = ideal.ideal_share(trace, ideal.kinds_accepted, by_tier=False, node_kinds={"a100": 2})
    assert by_tier == {"alloc_share_while_pending": round((2 * 9 + 1 * 3) / (12 * 2), 3),
                       "pending_seconds": 12.0, "makespan_s": 23.0}
    assert fifo == {"alloc_share_while_pending": 1.0, "pending_seconds": 19.0, "makespan_s": 23.0}


def test_kinds_a_job_may_use(ideal):
    # The a100 node is busy; an "either type" job takes the idle v100 node under the policy
    # (accepted types) but waits for a100 when its script names a100 (default side).
    trace = [J(0, "normal", 1, 10), J(1, "normal", 1, 5, gpu_types=("a100", "v100"))]
    kinds = {"a100": 1, "v100": 1}
    assert ideal.ideal_share(trace, ideal.kinds_accepted, node_kinds=kinds)["pending_seconds"] == 0.0
    by_script = ideal.ideal_share(trace, ideal.kinds_by_script, node_kinds=kinds)
    assert by_script == {"alloc_share_while_pending": 0.5, "pending_seconds": 9.0, "makespan_s": 15.0}
    cpu_job = J(0, "normal", 1, 1, gpu_types=(), script_partition="cpu")
    assert ideal.kinds_accepted(cpu_job) == ["cpu"] and ideal.kinds_by_script(cpu_job) == ["cpu"]
