"""hetrun's exception types, re-exported from :mod:`hetrun.errors`.

The hierarchy is defined once in ``hetrun/errors.py`` so that every layer can
import it without depending on ``dag``; ``from hetrun.dag.errors import ...``
keeps working for code written before the move.
"""

from __future__ import annotations

from hetrun.errors import (
    CheckpointError,
    GraphError,
    HetrunError,
    RunDirError,
    RuntimeFailure,
    SlurmError,
    SpecError,
    closest,
)

__all__ = [
    "CheckpointError",
    "GraphError",
    "HetrunError",
    "RunDirError",
    "RuntimeFailure",
    "SlurmError",
    "SpecError",
    "closest",
]
