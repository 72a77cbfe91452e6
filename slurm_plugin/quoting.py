"""The last gate before a script or a path: re-checks and quotes every user string.

The rules themselves live in one place, ``hetrun.dag.validators`` (and
``hetrun.dag.sbatch_options`` for ``slurm.extra``), shared with the spec: a
value the spec accepts renders, and a value this module refuses was already
refused by the spec with its file:line:column. Here a refusal names the key
path only (the renderer also takes plans built in code).

Two different parsers read what we render:

* ``#SBATCH`` lines are read by sbatch's own option scanner, not by a shell.
  Quoting does not protect there (and a newline would end the comment and turn
  the rest into a shell command), so values are checked against a strict
  character set per field and rejected otherwise.
* Everything after the ``#SBATCH`` block is bash: values go through
  ``shlex.quote`` so ``$(...)``, backticks, quotes and ``;`` stay inert.

Paths derived from user strings are resolved and must stay inside their root.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from hetrun.dag import validators as v
from hetrun.dag.sbatch_options import check_extra_option

from hetrun.errors import RunDirError, SpecError

# An absolute path that can go into a #SBATCH line verbatim: `%` would be a
# Slurm filename pattern, `#`, spaces and quotes confuse sbatch's scanner.
_SBATCH_PATH_RE = re.compile(r"/[A-Za-z0-9_./+,@:=~-]*")

# Job-wide options go into the first het component only; the others are
# repeated in every component, since Slurm reads them per component.
EXTRA_JOB_WIDE = frozenset(
    {
        "mail-type", "mail-user", "comment", "dependency", "begin", "deadline",
        "wckey", "nice", "priority", "kill-on-invalid-dep", "profile",
        "acctg-freq", "delay-boot", "no-kill", "reservation", "licenses",
        "hold", "clusters", "cluster-constraint", "bb", "mcs-label", "power",
        "propagate", "get-user-env", "time-min", "batch", "reboot",
    }
)


_T = TypeVar("_T")

# A gate: (value, key path) -> the value, checked; SpecError naming the key path otherwise.
Gate: TypeAlias = Callable[[object, str], str]


def _checked(check: Callable[[Any], _T], value: object, key_path: str) -> _T:
    """``check(value)`` with its ValueError turned into a SpecError naming ``key_path``."""
    try:
        return check(value)
    except ValueError as exc:
        raise SpecError(str(exc), key_path=key_path, value=value) from None


def job_name(value: object, key_path: str = "name") -> str:
    return _checked(v.check_job_name, value, key_path)


def component_name(value: object, key_path: str = "components") -> str:
    return _checked(v.check_component_name, value, key_path)


def slurm_name(value: object, key_path: str) -> str:
    """Account, QOS: one Slurm object name."""
    return _checked(v.check_slurm_name, value, key_path)


def partition(value: object, key_path: str = "slurm.partition") -> str:
    return _checked(v.check_partition, value, key_path)


def one_partition(value: object, key_path: str) -> str:
    """One partition name, no list (an entry of a ``placement: ranked`` record)."""
    return _checked(v.check_one_partition, value, key_path)


def gpu_type(value: object, key_path: str) -> str:
    return _checked(v.check_gpu_type, value, key_path)


def time_limit(value: object, key_path: str = "slurm.time") -> str:
    return _checked(v.check_time, value, key_path)


def constraint(value: object, key_path: str = "slurm.constraint") -> str:
    return _checked(v.check_constraint, value, key_path)


def signal_name(value: object, key_path: str = "preemption.signal") -> str:
    return _checked(v.check_signal, value, key_path)


def env_key(value: object, key_path: str) -> str:
    return _checked(v.check_env_name, value, key_path)


def env_value(value: object, key_path: str) -> str:
    """An environment value: any single-line text; it is shell-quoted when rendered."""
    return _checked(v.check_env_value, value, key_path)


def command(value: object, key_path: str) -> list[str]:
    """A command component's argv (every word is shell-quoted when rendered)."""
    return _checked(v.check_command, value, key_path)


def extra_option(value: object, key_path: str) -> tuple[str, str | None]:
    """One entry of ``slurm.extra`` -> (option name, value or None), validated."""
    problem = check_extra_option(value)
    if problem:
        raise SpecError(problem, key_path=key_path, value=value)
    assert isinstance(value, str)  # check_extra_option refuses everything else
    name, sep, arg = value[2:].partition("=")
    return name, (arg if sep else None)


def sbatch_path(path: Path, what: str) -> str:
    """An absolute path that is written verbatim into a ``#SBATCH`` line."""
    text = str(path)
    if not _SBATCH_PATH_RE.fullmatch(text):
        raise RunDirError(
            f"{what} {text!r} has characters that cannot go into an #SBATCH line",
            hint="use a runs directory (--runs-dir or $HETRUN_RUNS) whose absolute path has only "
            "letters, digits and . _ / + , @ : = ~ - (no spaces, '%', '#' or quotes)",
        )
    return text


def sh(value: object) -> str:
    """Shell-quote one word for the bash part of a script."""
    return shlex.quote(str(value))


def sh_join(words: Iterable[object]) -> str:
    return " ".join(sh(w) for w in words)


def check_relative_part(part: str, key_path: str) -> str:
    """A user string used as one path component: no separators, no `..`, no control characters."""
    if not part or part in (".", "..") or "/" in part or "\\" in part:
        raise SpecError(f"{part!r} cannot be used as a file or directory name",
                        key_path=key_path, value=part,
                        hint="use letters, digits, '_', '.', '-' and no '/' or '..'")
    _checked(lambda p: v.check_plain_string(p, "name", max_len=255), part, key_path)
    return part


def inside(root: Path, path: Path, what: str) -> Path:
    """``path`` resolved; raises RunDirError unless it lies inside ``root`` (also resolved)."""
    root_r = root.resolve()
    candidate = path if path.is_absolute() else root_r / path
    resolved = candidate.resolve()
    if resolved != root_r and root_r not in resolved.parents:
        raise RunDirError(
            f"{what} {str(path)!r} resolves to {str(resolved)!r}, outside {str(root_r)!r}",
            hint=f"keep {what} inside {root_r} (no '..' and no symlinks leading out)",
        )
    return resolved


def safe_join(root: Path, relative: str, what: str) -> Path:
    """``root / relative`` for a user-given relative path, refused if it is absolute,
    contains NUL/newlines or `..`, or resolves outside ``root``."""
    if "\x00" in relative or "\n" in relative or "\r" in relative:
        raise RunDirError(f"{what} {relative!r} contains NUL or a newline",
                          hint="give a plain relative path")
    rel = Path(relative)
    if rel.is_absolute():
        raise RunDirError(f"{what} {relative!r} is absolute", hint=f"give a path relative to {root}")
    if ".." in rel.parts:
        raise RunDirError(f"{what} {relative!r} contains '..'", hint=f"give a path inside {root}")
    return inside(root, rel, what)
