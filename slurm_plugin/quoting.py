"""Validation and quoting of every user string that reaches a script or a path.

Two different parsers read what we render, and each needs its own rule:

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
from collections.abc import Iterable
from pathlib import Path

from hetrun.dag.errors import RunDirError, SpecError

# Slurm names (partition, account, qos, reservation...): what sinfo/sacctmgr accept.
_SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
# A partition may be a comma-separated list ("debug,normal").
_PARTITION_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}(,[A-Za-z0-9_.-]{1,128}){0,15}")
# Job names: letters, digits, `_ . -`, not starting with `-` or `.` (a leading
# `-` reads as an option, a leading `.` makes hidden/relative-looking paths).
_JOB_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_COMPONENT_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
# Slurm time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED.
_TIME_RE = re.compile(
    r"(\d{1,7}(:\d{1,2}){0,2}|\d{1,4}-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|unlimited|infinite|INFINITE)"
)
# Node features with Slurm's operators (& | , * [ ] ( ) !): harmless inside a
# #SBATCH comment, and no character there is special to sbatch's scanner.
_CONSTRAINT_RE = re.compile(r"[A-Za-z0-9_.&|,*\[\]()!:-]{1,256}")
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Values of options in `slurm.extra`: no whitespace, quotes, `$`, backticks,
# backslashes, `#` (starts a comment for sbatch) or `%` (a filename pattern).
_EXTRA_VALUE_RE = re.compile(r"[A-Za-z0-9_.,:=+@/&|*\[\]()!-]{1,256}")
# An absolute path that can go into a #SBATCH line verbatim: `%` would be a
# Slurm filename pattern, `#`, spaces and quotes confuse sbatch's scanner.
_SBATCH_PATH_RE = re.compile(r"/[A-Za-z0-9_./+,@:=~-]*")

# Which `slurm.extra` options exist and take values is the spec's table
# (hetrun.dag.sbatch_options); the renderer re-checks every entry because it is
# the last gate before the script. On top of the spec's refusals it refuses
# options that would undo what the script relies on.
_EXTRA_REFUSED = {
    "export": "the script exports the job's env: itself; use the env: section",
    "open-mode": "hetrun appends to logs so requeued attempts keep earlier output",
    "no-requeue": "set preemption.max_restarts: 0 instead",
    "uid": "the job runs as you; submit as the other user instead",
    "gid": "the job runs with your group; use newgrp before submitting",
    "bbf": "a burst-buffer file is read at submit time; put its lines in the bb option",
}
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


def _check_no_controls(value: str, key_path: str, *, allow_tab: bool = False) -> None:
    for ch in value:
        if ch == "\t" and allow_tab:
            continue
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            raise SpecError(
                f"control character {ch!r} (newline, NUL...) is not allowed here",
                key_path=key_path,
                value=value,
                hint="write the value on one line without control characters",
            )


def _require(pattern: re.Pattern[str], value: object, key_path: str, expected: str) -> str:
    if not isinstance(value, str):
        raise SpecError(
            f"expected a string, got {type(value).__name__} {value!r}",
            key_path=key_path, value=value, hint=f"give {expected}",
        )
    _check_no_controls(value, key_path)
    if not pattern.fullmatch(value):
        raise SpecError(
            f"{value!r} is not a valid value", key_path=key_path, value=value, hint=f"give {expected}"
        )
    return value


def job_name(value: object, key_path: str = "name") -> str:
    return _require(_JOB_NAME_RE, value, key_path,
                    "1-64 letters, digits, '_', '.', '-', not starting with '.' or '-'")


def component_name(value: object, key_path: str = "components") -> str:
    return _require(_COMPONENT_RE, value, key_path,
                    "a lowercase letter then up to 31 lowercase letters, digits or '_'")


def slurm_name(value: object, key_path: str) -> str:
    """Account, QOS, reservation: one Slurm object name."""
    return _require(_SLURM_NAME_RE, value, key_path, "a Slurm name: letters, digits, '_', '.', '-'")


def partition(value: object, key_path: str = "slurm.partition") -> str:
    return _require(_PARTITION_RE, value, key_path,
                    "a partition name, or several separated by commas (letters, digits, '_', '.', '-')")


def time_limit(value: object, key_path: str = "slurm.time") -> str:
    return _require(_TIME_RE, value, key_path,
                    "a Slurm time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED")


def constraint(value: object, key_path: str = "slurm.constraint") -> str:
    return _require(_CONSTRAINT_RE, value, key_path,
                    "node features joined by & | , with optional [ ] ( ) ! * (no spaces or quotes)")


def env_key(value: object, key_path: str) -> str:
    return _require(_ENV_KEY_RE, value, key_path,
                    "an environment variable name: a letter or '_' then letters, digits, '_'")


def env_value(value: object, key_path: str) -> str:
    """An environment value: any single-line text; it is shell-quoted when rendered."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SpecError(
            f"expected a string or number, got {type(value).__name__} {value!r}",
            key_path=key_path, value=value, hint='quote the value in YAML, e.g. "1"',
        )
    text = str(value)
    _check_no_controls(text, key_path, allow_tab=True)
    return text


def extra_option(value: object, key_path: str) -> tuple[str, str | None]:
    """One entry of ``slurm.extra`` -> (option name, value or None), validated."""
    from hetrun.dag.sbatch_options import check_extra_option

    if not isinstance(value, str):
        raise SpecError(f"expected a string like '--exclusive', got {value!r}",
                        key_path=key_path, value=value)
    _check_no_controls(value, key_path)
    name, sep, arg = value[2:].partition("=") if value.startswith("--") else ("", "", "")
    if name in _EXTRA_REFUSED:
        raise SpecError(f"--{name} is not allowed in slurm.extra", key_path=key_path,
                        value=value, hint=_EXTRA_REFUSED[name])
    problem = check_extra_option(value)
    if problem:
        raise SpecError(problem, key_path=key_path, value=value)
    # The spec's value check allows '%' (harmless outside file names); every
    # other character sbatch's scanner or a shell could misread is refused there.
    if sep and not _EXTRA_VALUE_RE.fullmatch(arg.replace("%", "")):
        raise SpecError(
            f"value {arg!r} of --{name} has characters sbatch cannot take safely",
            key_path=key_path, value=value,
            hint="no spaces, quotes, '$', backticks, backslashes or '#' in option values",
        )
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
    """A user string used as one path component: no separators, no `..`, no NUL."""
    if not part or part in (".", "..") or "/" in part or "\\" in part or "\x00" in part:
        raise SpecError(f"{part!r} cannot be used as a file or directory name",
                        key_path=key_path, value=part,
                        hint="use letters, digits, '_', '.', '-' and no '/' or '..'")
    _check_no_controls(part, key_path)
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
