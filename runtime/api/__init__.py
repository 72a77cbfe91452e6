"""The public run API: hetrun's checkpoints, agreed stop, exact resume and
events for a user's own training script (``import hetrun; run = hetrun.attach()``).

- ``env``: rank/world discovery (torchrun, mpirun, srun, standalone);
- ``rundir``: where checkpoints and events go;
- ``collectives`` / ``stop``: the ranks' agreement over torch.distributed or MPI;
- ``run``: ``attach()`` and ``Run`` (restore, save, checkpoint_due,
  should_stop, log, exit_for_requeue, close);
- ``lightning``: a Lightning ``CheckpointIO`` backed by the store.

Importing this package imports no torch; ``attach`` does.
"""

from __future__ import annotations

from typing import Any


def attach(*args: Any, **kwargs: Any) -> Any:
    from hetrun.runtime.api.run import attach as _attach

    return _attach(*args, **kwargs)
