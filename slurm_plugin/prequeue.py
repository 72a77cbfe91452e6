"""Mistakes refused before anything reaches the queue: the same checks at ``hetrun plan``,
``hetrun submit --dry-run`` and ``hetrun submit``.

- every partition the job names (``slurm.partition``, ``-p``, a component's ``partitions:``)
  exists on the cluster, the valid ones listed when not (only when a controller answered
  sinfo: without one nothing can be said, and the caller says so);
- every command component's program, and the script an interpreter is handed
  (``python3 train.py``, ``bash run.sh``), exists where its ranks will look for it (relative
  paths from the job YAML's directory, as ``runtime/command_rank`` resolves them), and is not
  under a directory each Slurm node has its own copy of (``/tmp``) when it goes to Slurm.

Library code: raises ``SpecError`` naming file, key path, the bad value and the fix.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hetrun.errors import SpecError
from hetrun.rundir import node_local_root

from .inventory import SlurmNode

if TYPE_CHECKING:
    from hetrun.dag.spec import JobSpec

# Interpreters whose first positional argument is a script file the ranks open.
_INTERPRETER = re.compile(r"^(python(\d+(\.\d+)?)?|bash|sh|dash|zsh|ksh|perl|ruby|Rscript)$")
# Options of those interpreters that take the program from elsewhere: no script path to check.
_NO_SCRIPT_OPTS = {"-m", "-c"}
# Interpreter options that take a value (python -W ignore train.py, -X importtime is one word).
_OPTS_WITH_VALUE = {"-W", "-X", "-o", "-O"}

def cluster_partitions(nodes: Sequence[SlurmNode]) -> list[str]:
    """Every partition sinfo listed, the default first."""
    default = [n.default_partition for n in nodes if n.default_partition]
    names = dict.fromkeys(default + [p for n in nodes for p in n.partitions])
    return list(names)


def _named_partitions(spec: JobSpec) -> list[tuple[str, str]]:
    """(key path, partition) for every partition the job names."""
    out: list[tuple[str, str]] = []
    if spec.slurm.partition:
        out += [("slurm.partition", p) for p in spec.slurm.partition.split(",") if p]
    for cname, comp in spec.components.items():
        out += [(f"components.{cname}.partitions", p) for p in comp.partitions]
    return out


def check_partitions(spec: JobSpec, nodes: Sequence[SlurmNode] | None, *, file: str | None = None) -> None:
    """Refuse a partition the cluster does not have, listing the ones it has. ``nodes`` is
    sinfo's answer; None (no controller answered) checks nothing."""
    if not nodes:
        return
    known = cluster_partitions(nodes)
    for key, part in _named_partitions(spec):
        if part not in known:
            from hetrun.errors import closest

            near = closest(part, known)
            mean = f"did you mean {near}? " if near else ""
            if key == "slurm.partition":
                fixed = ",".join(near or known[0] if p == part else p for p in spec.slurm.partition.split(","))
                hint = f"{mean}use partitions sinfo lists: -p {fixed} (or --set slurm.partition={fixed})"
            else:
                hint = f"{mean}list only partitions sinfo shows in {key}"
            raise SpecError(f"partition {part!r} does not exist on this cluster (sinfo lists "
                            f"{', '.join(known)})", file=file, key_path=key, value=part, hint=hint)


def script_word(argv: Sequence[str]) -> int | None:
    """The index of the script an interpreter command runs (``python3 -u train.py`` -> 2), or
    None (not an interpreter, ``python -m pkg``, ``bash -c '...'``, no positional word)."""
    if not argv or not _INTERPRETER.match(os.path.basename(argv[0])):
        return None
    i = 1
    while i < len(argv):
        word = argv[i]
        if word in _NO_SCRIPT_OPTS or word == "-":
            return None
        if word == "--":
            return i + 1 if i + 1 < len(argv) else None
        if not word.startswith("-"):
            return i
        i += 2 if word in _OPTS_WITH_VALUE else 1
    return None


def _where(word: str, job_dir: Path | None) -> Path | None:
    """Where the ranks will look for ``word``; None when that is not known yet (a relative path
    with no job directory runs from the run directory, which does not exist before submit)."""
    p = Path(word).expanduser()
    if p.is_absolute():
        return p
    return None if job_dir is None else job_dir / p


def _existing(what: str, word: str, path: Path | None, key: str, file: str | None) -> list[tuple[str, str, Path]]:
    """``[(what, word, path)]`` when ``path`` is a file; [] when where it lies is not known yet."""
    if path is None:
        return []
    if not path.is_file():
        raise SpecError(f"{what} {word!r} does not exist (looked for {path})", file=file, key_path=key,
                        value=word, hint=f"give the {what}'s path (absolute, or relative to the job YAML's "
                                         "directory, where the ranks start)")
    return [(what, word, path)]


def check_commands(spec: JobSpec, job_dir: Path | None, *, to_slurm: bool, search_path: bool = True,
                   file: str | None = None) -> None:
    """Refuse a command component whose program or script is missing, or (``to_slurm``) lies
    under a node-private directory. ``search_path``: look a bare program name up on this
    PATH (the one a job submitted from here inherits; ``plan`` without a cluster skips it). ``job_dir``: where the ranks run (the job YAML's
    directory); None: relative paths are not checked (they resolve in the run directory)."""
    base = Path(job_dir).resolve() if job_dir is not None else None
    for cname, comp in spec.components.items():
        argv = comp.command
        if not argv:
            continue
        key = f"components.{cname}.command"
        program = argv[0]
        if "/" not in program:  # a name: the ranks search the PATH the job inherits from here
            paths: list[tuple[str, str, Path]] = []
            if search_path and shutil.which(program) is None:
                raise SpecError(f"program {program!r} is not on PATH", file=file, key_path=key, value=program,
                                hint="give its full path, or install it on every node (the ranks search "
                                     "the same PATH)")
        else:
            paths = _existing("program", program, _where(program, base), key, file)
            if paths and not os.access(paths[0][2], os.X_OK):
                raise SpecError(f"program {program!r} ({paths[0][2]}) is not executable", file=file,
                                key_path=key, value=program,
                                hint=f"chmod +x {paths[0][2]}, or run it through an interpreter "
                                     f"(command: [python3, {program}])")
        idx = script_word(argv)
        if idx is not None:
            paths += _existing("script", argv[idx], _where(argv[idx], base), key, file)
        if not to_slurm:
            continue
        for what, word, path in paths:
            root = node_local_root(path)
            if root is not None:
                raise SpecError(f"{what} {word!r} is {path.resolve()}, under {root}, which is private to "
                                "each Slurm node: the ranks would not find it", file=file, key_path=key,
                                value=word, hint="move it to a shared directory (e.g. under /var/tmp or "
                                                 "your home), or use --backend local")
