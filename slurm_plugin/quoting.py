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

from hetrun.dag.errors import RunDirError, SpecError, closest

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

# sbatch options a user may add through `slurm.extra`. Options hetrun sets
# itself (nodes, tasks, output, signal, requeue, job name...) and options that
# change what runs (--wrap, --chdir, --export) are deliberately absent.
# Job-wide options go into the first het component only; per-component ones
# are repeated in every component (Slurm reads them per component).
EXTRA_JOB_WIDE = frozenset(
    {
        "mail-type", "mail-user", "comment", "dependency", "begin", "deadline",
        "wckey", "nice", "priority", "kill-on-invalid-dep", "profile",
        "acctg-freq", "open-mode", "delay-boot", "no-kill", "reservation",
        "licenses", "uid", "gid",
    }
)
EXTRA_PER_COMPONENT = frozenset(
    {
        "exclusive", "exclude", "nodelist", "hint", "tmp", "gres-flags",
        "threads-per-core", "cores-per-socket", "sockets-per-node",
        "oversubscribe", "switches", "mem-bind", "gpu-bind", "gpus-per-task",
        "gpu-freq", "cpu-freq", "core-spec", "thread-spec", "network",
        "prefer", "spread-job", "use-min-nodes", "contiguous", "distribution",
    }
)
_EXTRA_FLAG_ONLY = frozenset({"exclusive", "kill-on-invalid-dep", "contiguous", "spread-job",
                              "use-min-nodes", "no-kill", "oversubscribe"})
# uid/gid change who the job runs as: never from a job file.
_EXTRA_FORBIDDEN_NOTE = {
    "uid": "the job runs as you; submit as the other user instead",
    "gid": "the job runs with your group; use newgrp before submitting",
}


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
    if not isinstance(value, str):
        raise SpecError(f"expected a string like '--exclusive', got {value!r}",
                        key_path=key_path, value=value)
    _check_no_controls(value, key_path)
    if not value.startswith("--"):
        raise SpecError(
            f"{value!r} is not a long sbatch option",
            key_path=key_path, value=value,
            hint="write long options with their value, e.g. '--mail-type=END' (short forms are not accepted)",
        )
    name, sep, arg = value[2:].partition("=")
    allowed = EXTRA_JOB_WIDE | EXTRA_PER_COMPONENT
    if name in _EXTRA_FORBIDDEN_NOTE:
        raise SpecError(f"--{name} is not allowed in slurm.extra", key_path=key_path,
                        value=value, hint=_EXTRA_FORBIDDEN_NOTE[name])
    if name not in allowed:
        near = closest(name, allowed)
        hint = f"did you mean --{near}? " if near else ""
        hint += "hetrun sets nodes, tasks, cpus, gpus, mem, output, signal, requeue and job name itself; "
        hint += "allowed here: " + ", ".join(sorted("--" + o for o in allowed - _EXTRA_FORBIDDEN_NOTE.keys()))
        raise SpecError(f"unknown or reserved sbatch option --{name}", key_path=key_path,
                        value=value, hint=hint)
    if not sep:
        return name, None
    if name in _EXTRA_FLAG_ONLY and name != "exclusive":
        raise SpecError(f"--{name} takes no value", key_path=key_path, value=value,
                        hint=f"write '--{name}'")
    if not _EXTRA_VALUE_RE.fullmatch(arg):
        raise SpecError(
            f"value {arg!r} of --{name} has characters sbatch cannot take safely",
            key_path=key_path, value=value,
            hint="no spaces, quotes, '$', backticks, backslashes, '#' or '%' in option values",
        )
    return name, arg


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
