"""The runtime's resource sampler (psutil for real; NVML through a fake: no GPU here) and the
report's resource section built from its lines."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from hetrun.reports.reader import EventStream
from hetrun.reports.run_report import build_report
from hetrun.runtime.events import EventLog
from hetrun.runtime.sampler import Sampler, open_nvml


class FakeNvml:
    """Stands in for pynvml on a machine without an NVIDIA driver; answers like one GPU at 75%."""

    def __init__(self) -> None:
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"

    def nvmlDeviceGetUtilizationRates(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=75, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(used=3 << 30, total=16 << 30)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 210_000  # milliwatts


def test_real_nvml_without_a_gpu_means_no_gpu_fields() -> None:
    assert open_nvml(0) is None  # pynvml is installed; no driver on this machine
    assert open_nvml(None) is None


def test_sampler_writes_sample_lines_and_the_report_aggregates_them(tmp_path: Path) -> None:
    with EventLog(tmp_path, rank=0, component="learner", node="n1") as log:
        log.emit("start", restart_count=0)
        s = Sampler(log, period=0.05, local_gpu=0, nvml=FakeNvml()).start()
        sum(i * i for i in range(2_000_000))  # some CPU for psutil to see
        time.sleep(0.3)
        s.stop()
    samples = list(EventStream(tmp_path, kinds=("sample",)))
    assert len(samples) >= 3
    assert all(e["gpu_util"] == 75.0 and e["gpu_power_w"] == 210.0 and e["rss"] > 0 for e in samples)
    res = build_report(tmp_path).resources
    (row,) = res["rows"]
    assert (row["component"], row["node"], row["gpu_util"], row["gpu_mem_max"]) == ("learner", "n1", 75.0, 3 << 30)
    assert row["cpu_pct"] is not None and res["note"] is None


def test_without_nvml_the_report_says_so(tmp_path: Path) -> None:
    with EventLog(tmp_path, rank=0, component="rollout", node="n2") as log:
        s = Sampler(log, period=0.05).start()  # psutil only
        time.sleep(0.2)
        s.stop()
    res = build_report(tmp_path).resources
    assert res["rows"][0]["gpu_util"] is None and "no GPU metrics" in res["note"]


def test_period_zero_turns_it_off(tmp_path: Path) -> None:
    with EventLog(tmp_path, rank=0) as log:
        s = Sampler(log, period=0).start()
        time.sleep(0.1)
        s.stop()
    assert list(EventStream(tmp_path, kinds=("sample",))) == []
