"""Scaffolding shared by the tests that start real Open MPI ranks on one of their own files.

Such a test file is both: pytest runs ``run_ranks(np, __file__, ...)``, and each
rank runs the same file as a script (the rank body), which opens its
all-to-all communicator with ``open_alltoall_comm``. Imported as ``mpi_helpers``
(pytest puts tests/ on sys.path; a rank run as ``python tests/x.py`` has it as
its script directory).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from hetrun.runtime.mpi_launch import init_loopback_gloo, loopback_mpi_env, mpirun_argv
from setup_tools import MPIRUN

needs_mpirun = MPIRUN

_TAIL = 4000  # enough of a failed rank's output to see its traceback


def run_ranks(np_: int, script: str, *args: str, timeout: float,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python script args...`` on ``np_`` loopback ranks; fails the test unless mpirun exits 0.

    ``env`` adds variables on top of the loopback Open MPI settings.
    """
    cmd = mpirun_argv(np_, [sys.executable, script, *args])
    proc = subprocess.run(cmd, env=loopback_mpi_env(**(env or {})), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-_TAIL:] + proc.stderr[-_TAIL:]
    return proc


def json_records(text: str) -> list[Any]:
    """Every JSON object the ranks printed, in order. mpirun forwards each rank's output in
    chunks as they arrive, so one rank's line and its newline can land on either side of
    another rank's (seen: two records on one line in a CI run): decode objects, not lines."""
    decoder = json.JSONDecoder()
    out, i = [], text.find("{")
    while i >= 0:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:  # a brace in some other output: skip it
            i = text.find("{", i + 1)
            continue
        out.append(obj)
        i = text.find("{", end)
    return out


def open_alltoall_comm(backend: str, world: Any) -> Any:
    """Rank side: the all-to-all communicator over mpi4py (``"mpi"``) or a fresh gloo group (``"torch"``)."""
    from hetrun.runtime.comms.alltoall import AllToAllComm

    if backend == "mpi":
        return AllToAllComm.from_mpi(world)
    init_loopback_gloo(world)
    return AllToAllComm.from_torch(None)
