"""The local backend's launcher must not inherit the MPI world of its caller.

A process that has initialised MPI itself (the in-process runtime, a notebook,
this test run) carries Open MPI/PMIx variables in its C-level environment; an
`mpirun` started with them exits 1 at once with an empty log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from setup_tools import MPIRUN

PROBE = textwrap.dedent(
    """
    import os, subprocess, sys
    from mpi4py import MPI
    MPI.COMM_WORLD.Get_rank()          # singleton init: PMIX_*, OMPI_MCA_ess=... in C environ
    from hetrun.slurm_plugin.backends.local import launcher_env
    inherited = dict(l.split("=", 1) for l in
                     subprocess.run(["env"], capture_output=True, text=True).stdout.splitlines() if "=" in l)
    cleaned = launcher_env(inherited)
    argv = ["mpirun", "--oversubscribe", "-np", "1", sys.executable, "-c", "pass"]
    raw = subprocess.run(argv, env=inherited, capture_output=True).returncode
    ok = subprocess.run(argv, env=cleaned, capture_output=True).returncode
    print("PMIX_LEFT=%d BTL=%s RAW=%d OK=%d" % (
        sum(k.startswith("PMIX_") for k in cleaned), cleaned.get("OMPI_MCA_btl"), raw, ok))
    """
)


@pytest.mark.mpi
@MPIRUN
def test_launcher_env_drops_the_callers_mpi_world_and_keeps_user_settings() -> None:
    env = dict(os.environ, OMPI_MCA_btl="self,tcp", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl_tcp_if_include="lo",
               OMPI_MCA_oob_tcp_if_include="lo")
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=env, timeout=120)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PMIX_LEFT=")]
    assert line, proc.stdout + proc.stderr
    fields = dict(f.split("=", 1) for f in line[0].split())
    assert fields["PMIX_LEFT"] == "0"
    assert fields["BTL"] == "self,tcp"           # the user's own settings survive
    assert fields["RAW"] != "0", "mpirun with the inherited MPI variables should fail here"
    assert fields["OK"] == "0", proc.stdout + proc.stderr
