"""The ``sample`` lines (runtime/sampler.py) per component and node, for ``hetrun report``."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

_MEAN = ("cpu_pct", "gpu_util", "gpu_power_w")
_MAX = ("rss", "gpu_mem")


class SampleStats:
    def __init__(self) -> None:
        self._sum: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._n: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._max: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
        self.samples = 0

    def feed(self, e: dict[str, Any]) -> None:
        key = (str(e.get("component", "?")), str(e.get("node", "?")))
        self.samples += 1
        for k in _MEAN:
            v = e.get(k)
            if isinstance(v, int | float):
                self._sum[key][k] += float(v)
                self._n[key][k] += 1
        for k in _MAX:
            v = e.get(k)
            if isinstance(v, int | float):
                self._max[key][k] = max(self._max[key].get(k, 0.0), float(v))

    def to_dict(self) -> dict[str, Any]:
        """{"samples", "rows": [{component, node, samples, cpu_pct, rss_max, gpu_util, gpu_mem_max,
        gpu_power_w}], "note"}: means over the run, maxima of memory; None where never sampled."""
        rows = []
        for key in sorted(set(self._sum) | set(self._max)):
            n, s, m = self._n[key], self._sum[key], self._max[key]
            rows.append({"component": key[0], "node": key[1], "samples": max(n.values(), default=0),
                         **{k: (s[k] / n[k] if n.get(k) else None) for k in _MEAN},
                         **{f"{k}_max": m.get(k) for k in _MAX}})
        gpu = any(r["gpu_util"] is not None for r in rows)
        note = None if rows and gpu else (
            "no resource samples (the runtime samples every HETRUN_SAMPLE_S=5 s; older runs have none)"
            if not rows else "no GPU metrics: NVML (nvidia-ml-py) found no GPU on these nodes")
        return {"samples": self.samples, "rows": rows, "note": note}
