"""Resource samples per rank, at a low fixed rate, into events.jsonl (``"ev": "sample"``).

A daemon thread wakes every ``HETRUN_SAMPLE_S`` seconds (default 5; 0 turns
it off) and writes one line: this rank's CPU % (psutil, since the previous
sample) and resident memory, and, where NVML answers, its GPU's SM
utilization, memory used and power (nvidia-ml-py's ``pynvml``). Without
psutil or NVML the fields are absent and ``hetrun report`` says so. The
sampler never fails a run: an error stops sampling with one warning line.
"""

from __future__ import annotations

import os
import threading
from typing import Any

DEFAULT_PERIOD_S = 5.0


def period_s() -> float:
    try:
        return max(0.0, float(os.environ.get("HETRUN_SAMPLE_S", DEFAULT_PERIOD_S)))
    except ValueError:
        return DEFAULT_PERIOD_S


def open_nvml(local_gpu: int | None, nvml: Any = None) -> tuple[Any, Any] | None:
    """(pynvml module, device handle) for this rank's GPU, or None (no driver / no GPU)."""
    if local_gpu is None:
        return None
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
        return nvml, nvml.nvmlDeviceGetHandleByIndex(local_gpu)
    except Exception:
        return None


def gpu_fields(gpu: tuple[Any, Any] | None) -> dict[str, Any]:
    if gpu is None:
        return {}
    nvml, handle = gpu
    util = nvml.nvmlDeviceGetUtilizationRates(handle)
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    return {"gpu_util": float(util.gpu), "gpu_mem": int(mem.used),
            "gpu_power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}


class Sampler:
    """``start()`` once the rank's EventLog exists; ``stop()`` before it closes."""

    def __init__(self, log: Any, *, period: float | None = None, local_gpu: int | None = None,
                 nvml: Any = None) -> None:
        self.log = log
        self.period = period_s() if period is None else period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu = open_nvml(local_gpu, nvml)
        try:
            import psutil

            self._proc: Any = psutil.Process()
            self._proc.cpu_percent(None)  # the first call only starts the interval
        except ImportError:
            self._proc = None

    def sample(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if self._proc is not None:
            fields["cpu_pct"] = self._proc.cpu_percent(None)
            fields["rss"] = int(self._proc.memory_info().rss)
        fields.update(gpu_fields(self._gpu))
        return fields

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.log.emit("sample", **self.sample())
            except Exception as exc:
                self.log.emit("warning", message=f"resource sampler stopped: {type(exc).__name__}: {exc}")
                return

    def start(self) -> Sampler:
        if self.period > 0 and (self._proc is not None or self._gpu is not None):
            self._thread = threading.Thread(target=self._loop, name="hetrun-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)


def start_for(log: Any, world: Any) -> Sampler:
    """The sampler of one rank (runtime/entry.py): its GPU is its index among the node's ranks."""
    gpus = int(getattr(getattr(world, "component", None), "gpus_per_node", 0) or 0)
    local = int(getattr(world, "node_rank", 0) or 0) % gpus if gpus else None
    return Sampler(log, local_gpu=local).start()
