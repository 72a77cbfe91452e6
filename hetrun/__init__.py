"""hetrun: Slurm heterogeneous jobs, an MPI runtime and incremental checkpoints.

The public API for a user's own training script::

    import hetrun
    run = hetrun.attach()
    start = run.restore({"model": model, "optim": optimizer})
    for step in range(start, total):
        ...
        run.log(step, loss=loss.item())
        if run.should_stop(step):
            run.save(step, {"model": model, "optim": optimizer}, wait=True)
            run.exit_for_requeue()
        if run.checkpoint_due(step):
            run.save(step, {"model": model, "optim": optimizer})

The layers live in subpackages (``hetrun.cli``, ``hetrun.dag``,
``hetrun.runtime``, ...). This module stays import-light: every
``import hetrun.<layer>`` runs it, so names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetrun.runtime.api.run import Run, attach

__all__ = ["Run", "attach"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hetrun.runtime.api import run

        return getattr(run, name)
    raise AttributeError(f"module 'hetrun' has no attribute {name!r}")
