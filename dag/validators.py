"""Checks for the strings a job spec carries into Slurm scripts and paths.

Each check returns the normalized value or raises ``ValueError`` with a
message that says what was expected; the spec models turn that into a
``SpecError`` with file, line and key path.
"""

from __future__ import annotations

import math
import re
from typing import Any

JOB_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
COMPONENT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
WORKLOAD_RE = re.compile(rf"^{_IDENT}(?:\.{_IDENT})*:{_IDENT}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
PARTITION_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}(?:,[A-Za-z0-9_.-]{1,64}){0,15}$")
CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.,&|()\[\]*:-]{1,256}$")
CODEC_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
MEM_RE = re.compile(r"^([0-9]{1,12})([KMGTkmgt]?)[Bb]?$")
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "URG", "XCPU")

_TIME_FORMATS = (
    re.compile(r"^(?P<m>\d{1,7})$"),
    re.compile(r"^(?P<m>\d{1,7}):(?P<s>\d{1,2})$"),
    re.compile(r"^(?P<h>\d{1,6}):(?P<m>\d{1,2}):(?P<s>\d{1,2})$"),
    re.compile(r"^(?P<d>\d{1,5})-(?P<h>\d{1,2})$"),
    re.compile(r"^(?P<d>\d{1,5})-(?P<h>\d{1,2}):(?P<m>\d{1,2})$"),
    re.compile(r"^(?P<d>\d{1,5})-(?P<h>\d{1,2}):(?P<m>\d{1,2}):(?P<s>\d{1,2})$"),
)
_UNLIMITED = ("UNLIMITED", "INFINITE")
TIME_FORMATS_HELP = ('Slurm time: "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS" '
                     'or "UNLIMITED"')


def time_seconds(value: str) -> int | None:
    """Seconds of a Slurm time string; None for UNLIMITED. ValueError if malformed."""
    if value.upper() in _UNLIMITED:
        return None
    for fmt in _TIME_FORMATS:
        m = fmt.match(value)
        if m:
            parts = {k: int(v) for k, v in m.groupdict().items() if v is not None}
            total = (parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600
                     + parts.get("m", 0) * 60 + parts.get("s", 0))
            if total <= 0:
                raise ValueError(f"time limit {value!r} is zero; expected a positive {TIME_FORMATS_HELP}")
            return total
    raise ValueError(f"{value!r} is not a {TIME_FORMATS_HELP}")


def check_time(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # sbatch reads a bare number as minutes
    if not isinstance(value, str):
        raise ValueError(f"expected a {TIME_FORMATS_HELP}, got {type(value).__name__}")
    time_seconds(value)
    return value


def mem_to_mb(value: str) -> int:
    """Megabytes of a Slurm memory size (K/M/G/T suffix, default M), rounded up."""
    m = MEM_RE.match(value)
    if not m:
        raise ValueError(f"{value!r} is not a memory size; expected a number with K, M, G or T (e.g. 2G, 512M)")
    number, unit = int(m.group(1)), (m.group(2) or "M").upper()
    scale_kb = {"K": 1, "M": 1024, "G": 1024**2, "T": 1024**3}[unit]
    mb = math.ceil(number * scale_kb / 1024)
    if mb < 1:
        raise ValueError(f"memory {value!r} is zero; expected at least 1M")
    if mb > 1024**3 * 64:  # 64 PiB per node is a typo, not a machine
        raise ValueError(f"memory {value!r} is larger than any node")
    return mb


def check_mem(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = f"{value}M"  # sbatch's default unit
    if not isinstance(value, str):
        raise ValueError(f"expected a memory size like 2G or 512M, got {type(value).__name__}")
    mem_to_mb(value)
    return value


def check_pattern(value: str, pattern: re.Pattern[str], what: str) -> str:
    if not pattern.match(value):
        raise ValueError(f"{value!r} is not a valid {what}")
    return value


def check_plain_string(value: str, what: str, max_len: int = 4096) -> str:
    """Strings that will be shell-quoted later may hold anything but NUL and line breaks."""
    bad = next((c for c in value if c in "\x00\n\r"), None)
    if bad is not None:
        raise ValueError(f"{what} {value[:60]!r} contains {bad!r}; NUL and line breaks are not allowed")
    if len(value) > max_len:
        raise ValueError(f"{what} is longer than {max_len} characters")
    return value


def check_json_value(value: Any, path: str = "", depth: int = 0) -> None:
    """workload_args must survive a JSON round trip unchanged (plan.json carries them)."""
    if depth > 32:
        raise ValueError(f"{path or 'value'} is nested deeper than 32 levels")
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path or 'value'} is {value}; JSON has no NaN or infinity")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_json_value(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{path or 'value'} has key {k!r}; keys must be strings")
            check_json_value(v, f"{path}.{k}" if path else k, depth + 1)
        return
    raise ValueError(f"{path or 'value'} is a {type(value).__name__}; only JSON values "
                     "(string, number, bool, null, list, mapping) can be passed to the workload")
