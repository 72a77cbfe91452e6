"""``python -m hetrun.runtime <run_dir>``: the per-rank entry point.

Started by srun on every rank of every het component (or by the local
backend's mpirun). Exit codes: 0 done; 85 checkpointed on a time-limit signal
(the batch script requeues); anything else is a failure whose message is in
``events.jsonl`` and on stderr.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
import traceback

# The interpreter is up and the hetrun package imported: the first stage of a
# rank's startup that the runtime itself can see (see entry.startup_times).
INTERP_READY = time.time()

# First thing a rank does: a crash in C (MPI/PMIx init, torch) then prints the
# Python stack of every thread to the rank's log. Installed before MPI_Init,
# Open MPI leaves this SIGSEGV/SIGBUS/SIGABRT handler in place (opal_signal).
faulthandler.enable(all_threads=True)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_REQUEUE = 85


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        sys.stderr.write("usage: python -m hetrun.runtime <run_dir>\n")
        return 2
    # A rank restarted inside the allocation forks from its node's warm server (torch
    # already imported); with none, or no answer, it starts here as ever.
    from .warm_start import run_warm

    warm = run_warm(argv)
    if warm is not None:
        return warm
    from .entry import run_rank

    try:
        return run_rank(argv[0], interp_ready=INTERP_READY)
    except SystemExit:
        raise
    except BaseException:  # last resort: entry.run_rank already reports errors
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(EXIT_FAILURE)


if __name__ == "__main__":
    sys.exit(main())
