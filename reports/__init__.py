"""hetrun.reports: everything that reads a finished or running job back.

``hetrun report``, ``hetrun status``, ``hetrun tune`` and ``hetrun resume``'s
resize read run directories (events, plan.json, checkpoints) and Slurm's
accounting through this package; the per-rank runtime (hetrun.runtime) only
writes them. Nothing here imports torch or mpi4py, so the CLI stays fast.
"""
