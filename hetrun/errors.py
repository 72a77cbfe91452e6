"""hetrun's own exception types, importable from every layer.

They live here, beside the import-light ``hetrun`` facade, so that ``kernels``
and ``runtime`` can raise them without depending on the planning layer
(``hetrun.errors`` re-exports them for older imports). This module
imports only the standard library.

Library code raises these; only ``hetrun.cli`` turns them into a message and
an exit code. Every message names the bad value, where it came from (file,
key path, line/column when known) and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable


class HetrunError(Exception):
    """Base of every error hetrun reports to a user. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  fix: {self.hint}"


class SpecError(HetrunError):
    """The job YAML (or an override) is invalid. Exit code 2, like a usage error."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key_path: str | None = None,
        line: int | None = None,
        column: int | None = None,
        value: object = None,
        hint: str | None = None,
    ) -> None:
        self.file = file
        self.key_path = key_path
        self.line = line
        self.column = column
        self.value = value
        super().__init__(_where(file or "<job spec>", line, column, key_path) + message, hint=hint)


def _where(file: str | None, line: int | None, column: int | None, key_path: str | None) -> str:
    """``file:line:col: key.path: `` (the parts that are known) in front of a message."""
    where = file or ""
    if file and line is not None:
        where += f":{line}" + (f":{column}" if column is not None else "")
    prefix = f"{where}: " if where else ""
    return prefix + (f"{key_path}: " if key_path else "")


class GraphError(HetrunError):
    """The action graph is invalid (cycle, unsatisfiable resource profile...).

    ``key_path`` names the job YAML key that caused it (``actions.forward.after``);
    the planner adds the file, line and column of that key when it knows the file.
    """

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None, key_path: str | None = None,
                 file: str | None = None, line: int | None = None, column: int | None = None) -> None:
        self.key_path, self.file, self.line, self.column = key_path, file, line, column
        self.bare_message = message
        super().__init__(_where(file, line, column, key_path) + message, hint=hint)


class SlurmError(HetrunError):
    """A Slurm command failed or Slurm is unreachable."""

    exit_code = 3
    #: the command timed out, so it may still have been carried out (sbatch: the job queued)
    uncertain = False


class RunDirError(HetrunError):
    """A run directory is missing, incomplete or not a hetrun run."""

    exit_code = 4


class CheckpointError(HetrunError):
    """A checkpoint is missing, corrupt, or cannot be written."""

    exit_code = 5


class RuntimeFailure(HetrunError):
    """A rank of a running job failed; the message names the rank and action."""

    exit_code = 6


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The closest valid spelling of ``word`` among ``candidates``, if any is close."""
    import difflib  # only when an error is being worded: keeps `import hetrun.errors` ~1 ms

    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None
