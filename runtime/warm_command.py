"""A command component's Python program, restarted inside the allocation, forked from the node's
warm server (runtime/warm_start.py) instead of a fresh interpreter importing torch again.

Why: after a node death every rank of the step starts anew, and a DDP script's start is an
interpreter, ``import torch`` (~1 s on a core here) and, at ``DistributedDataParallel(...)`` or the
first optimizer, ``import torch._dynamo`` (~1.3 s): 2.5 of the ~3 s between the batch script's
decision and the restored step of examples/ddp_train_hetrun.py, where torchrun elastic restarts
its worker in about the same (benchmarks/node_death.md, session 33).

Which programs: ``python SCRIPT ARGS...`` and ``python -m MODULE ARGS...`` where ``python`` is the
interpreter the rank wrapper itself runs (the one the warm server runs: the job's). Anything else
(another interpreter, ``python -u ...`` or other options, a shell script, a binary) starts as it
always has. The wrapper (runtime/command_rank.py) runs ``python -m hetrun.runtime.warm_command
PROGRAM ARGS...`` instead of the program when the job's warm servers are up
(``$HETRUN_WARM_SOCKET``); this requester asks the node's server to fork the program, passes it
its descriptors, environment and working directory, relays the signals it gets and ends as the
program ends (``run_warm``). No server, or no fork: it ``exec``s the program itself, in its own
process, as a cold start would.

In the fork (``run_program``): ``sys.argv`` as the interpreter would set it, ``sys.path[0]`` the
script's directory (the working directory for ``-m``), ``runpy`` runs it as ``__main__``; its exit
code, an uncaught exception's traceback and exit code 1, and its exit handlers are as in its own
interpreter. What differs: the modules the server imported (torch, torch.distributed,
torch._dynamo) are imported already, and the process lives in the warm step (accounting;
``HETRUN_WARM_START=0`` turns warm starts off).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from . import warm_start

PYTHON_FLAG = "--python"  # the warm server's target: what follows is a Python program's argv


def python_program(argv: Sequence[str], program: str) -> bool:
    """Whether ``argv`` (``program``: its argv[0] resolved) is ``python SCRIPT ...`` or
    ``python -m MODULE ...`` run by this interpreter."""
    try:
        same = os.path.realpath(program) == os.path.realpath(sys.executable)
    except OSError:
        return False
    if not same or len(argv) < 2:
        return False
    if argv[1] == "-m":
        return len(argv) >= 3 and bool(argv[2]) and not argv[2].startswith("-")
    return not argv[1].startswith("-")


def wrapped(argv: Sequence[str], program: str, env: Mapping[str, str]) -> list[str]:
    """The argv the rank wrapper runs: this requester in front of a Python program when the job's
    warm servers are on, else the program as it is."""
    if warm_start.enabled(env) and python_program(argv, program):
        return [sys.executable, "-m", "hetrun.runtime.warm_command", program, *argv[1:]]
    return [program, *argv[1:]]


def run_program(argv: list[str]) -> int:
    """In the warm server's fork: run ``argv`` (``SCRIPT ARGS...`` or ``-m MODULE ARGS...``) as
    ``python`` would run it. Returns 0 when it returns; SystemExit and exceptions go to the
    server's child handler (warm_start.WarmServer._child), which ends the process with them."""
    import runpy

    # sys.path[0] is the server's own first entry (its working directory: it runs as `python -m`);
    # the program's interpreter would have put the script's directory there, or for -m its own
    # working directory, in its place.
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file in argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        script = os.path.abspath(argv[0])
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        sys.stderr.write("usage: python -m hetrun.runtime.warm_command PYTHON SCRIPT|-m MODULE [ARGS...]\n")
        return 2
    code = warm_start.run_warm([PYTHON_FLAG, *argv[1:]])
    if code is None:  # no server, or it did not fork: the program in this process, cold
        os.execv(argv[0], argv)
    return code


if __name__ == "__main__":
    sys.exit(main())
