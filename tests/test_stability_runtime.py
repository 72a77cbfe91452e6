"""A rank that crashes in C still leaves a Python traceback in its log (faulthandler)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_a_segfaulting_rank_prints_its_python_stack(tmp_path: Path) -> None:
    # plan.json as a FIFO: the rank blocks reading it, at a known place, until we crash it.
    os.mkfifo(tmp_path / "plan.json")
    proc = subprocess.Popen([sys.executable, "-m", "hetrun.runtime", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writer = -1
    try:
        deadline = time.monotonic() + 60
        # A non-blocking open for writing succeeds once the rank has the FIFO open for
        # reading: it then sits in load_plan's read, which we keep waiting.
        while writer < 0 and time.monotonic() < deadline:
            try:
                writer = os.open(tmp_path / "plan.json", os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.1)
        assert writer >= 0, "the runtime never opened plan.json"
        time.sleep(0.5)
        proc.send_signal(signal.SIGSEGV)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        if writer >= 0:
            os.close(writer)
    assert proc.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in err, err
    assert "load_plan" in err and "run_rank" in err, err
