"""The rules the planner and the runtime share: enforced lags and rank routing.

``hetrun plan --unroll`` (dag/unroll.py) draws the schedule with these
functions and the runtime (runtime/executor.py, runtime/inprocess.py) runs it
with the same ones, so the plan shows what runs. Pure Python: no torch, no
numpy, no Slurm.
"""

from __future__ import annotations


def enforced_lag(lag: int, same_component: bool, mode: str, pipeline_window: int) -> int:
    """The lag the runtime enforces for a dependency written with ``lag``.

    The planner encodes a tolerance window w as lag 1 + w on the weight dep.
    Across components the pipeline window caps it, and the coarse mode (or
    pipeline_window 0) is the synchronous loop: lag 1. Within a component the
    written lag holds (its iterations never overlap).
    """
    if lag <= 0 or same_component:
        return lag
    if mode == "coarse" or pipeline_window <= 0:
        return 1
    return min(lag, 1 + pipeline_window)


def feeding_ranks(n_src: int, n_dst: int, dst_index: int) -> list[int]:
    """Which producer ranks (indices in their component) feed consumer rank ``dst_index``.

    Consumer d takes the producers p with p % n_dst == d; when producers are
    fewer, consumer d takes producer d % n_src.
    """
    mine = list(range(dst_index, n_src, n_dst)) if dst_index < n_dst else []
    return mine or [dst_index % n_src]


def fed_ranks(n_src: int, n_dst: int, src_index: int) -> list[int]:
    """The inverse of ``feeding_ranks``: the consumer ranks producer ``src_index`` feeds."""
    if n_src >= n_dst:
        return [src_index % n_dst]
    return list(range(src_index, n_dst, n_src))
