"""The one owner of every rule for strings a job spec carries into Slurm scripts and paths.

Each ``check_*`` returns the normalized value or raises ``ValueError`` with a
message that says what was expected. Two callers use the same functions, so a
value is either accepted by both or refused by the first:

* the spec models (``hetrun.dag.spec``) turn the ``ValueError`` into a
  ``SpecError`` with file, line, column and key path;
* the script renderer (``hetrun.slurm_plugin.quoting``) re-checks every value
  it writes, as the last gate before the script, with the key path only.

``#SBATCH`` lines are read by sbatch's own scanner, not by a shell: quoting
does not protect there, so values are held to a strict character set here.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Job names: not starting with '-' (reads as an option) or '.' (a hidden,
# relative-looking run directory name).
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
JOB_NAME_HELP = "1-64 letters, digits, '_', '.', '-', not starting with '.' or '-'"
COMPONENT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
COMPONENT_NAME_HELP = "a lowercase letter then up to 31 lowercase letters, digits or '_'"
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
WORKLOAD_RE = re.compile(rf"^{_IDENT}(?:\.{_IDENT})*:{_IDENT}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Slurm object names (account, QOS): what sacctmgr accepts and sbatch reads verbatim.
SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
PARTITION_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}(?:,[A-Za-z0-9_.-]{1,64}){0,15}$")
# Node features with Slurm's operators (& | , * [ ] ( ) ! :): harmless inside an
# #SBATCH comment, and none is special to sbatch's scanner.
CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.,&|()\[\]*:!-]{1,256}$")
MEM_RE = re.compile(r"^([0-9]{1,12})([KMGTkmgt]?)[Bb]?$")
# Signals the runtime installs a handler for (runtime/preempt.py) and sbatch's
# --signal takes by name.
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "URG", "XCPU")
# The codec names of comms: (kernels/codecs/registry.py implements exactly these;
# tests/test_validators.py keeps the two equal). Kept here so `hetrun plan`
# checks them without importing torch.
CODEC_NAMES = ("none", "onebit", "onebit_ef", "onebit_stochastic", "int8", "int4", "fp8")

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


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected {what} as a string, got {type(value).__name__} {value!r}")
    return value


def check_pattern(value: Any, pattern: re.Pattern[str], what: str) -> str:
    if not pattern.fullmatch(_text(value, what)):  # fullmatch: `$` alone lets a final "\n" through
        raise ValueError(f"{value[:80]!r} is not a valid {what}")
    return value


def check_job_name(value: Any) -> str:
    return check_pattern(value, JOB_NAME_RE, f"job name ({JOB_NAME_HELP})")


def check_component_name(value: Any) -> str:
    return check_pattern(value, COMPONENT_NAME_RE, f"component name ({COMPONENT_NAME_HELP})")


def check_workload_ref(value: Any) -> str:
    return check_pattern(value, WORKLOAD_RE, "workload reference; expected module.path:Class")


def check_slurm_name(value: Any) -> str:
    return check_pattern(value, SLURM_NAME_RE, "Slurm name (letters, digits, _ . -, at most 64)")


def check_partition(value: Any) -> str:
    return check_pattern(value, PARTITION_RE,
                         "partition name (letters, digits, _ . -; a comma-separated list allowed)")


def check_one_partition(value: Any) -> str:
    """One partition name (a ``partitions:`` entry of ``placement: auto``; no list)."""
    return check_pattern(value, SLURM_NAME_RE, "partition name (letters, digits, _ . -, at most 64)")


GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")


def check_gpu_type(value: Any) -> str:
    """A GRES type as gres.conf's Type= names it (``a100``); goes into ``--gres=gpu:TYPE:N``."""
    return check_pattern(value, GPU_TYPE_RE, "GPU type (letters, digits, _ . -, at most 32), e.g. a100")


def check_node_count(value: Any) -> int:
    """A node count a ``placement: auto`` component may be spread over (a ``node_counts:`` entry)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise ValueError(f"expected a node count from 1 to 100000, got {value!r}")
    return value


def check_constraint(value: Any) -> str:
    return check_pattern(value, CONSTRAINT_RE,
                         "constraint (node features joined by & | , with [ ] ( ) ! * : and no spaces)")


# Names whose value is a credential: a job file's ``env:`` is written into the
# batch script, plan.json and job.yaml, so a key there would sit in plain text
# (docs/OBJECT_STORE.md promises none ever does). Exported in the submitting
# shell instead, they reach the ranks through Slurm's environment propagation.
SECRET_ENV_NAMES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def check_env_name(value: Any) -> str:
    check_pattern(value, ENV_NAME_RE, "environment variable name (a letter or '_' then letters, digits, '_')")
    if value.upper() in SECRET_ENV_NAMES:
        raise ValueError(f"{value} holds a credential and would be written in plain text to the batch script, "
                         f"plan.json and job.yaml; remove it from the job file and export {value} in the "
                         "shell you submit from (Slurm passes it to the ranks)")
    return value


def check_env_value(value: Any) -> str:
    """An environment value: one line of text (tabs allowed); it is shell-quoted when rendered."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError(f"value is {type(value).__name__} {value!r}; environment values are strings "
                         "(quote it in YAML)")
    return check_plain_string(value, "value")


def check_signal(value: Any) -> str:
    """``usr1``, ``SIGUSR1`` -> ``USR1``."""
    name = _text(value, "a signal name").upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise ValueError(f"signal {value!r} is not one of {', '.join(SIGNALS)}")
    return name


def check_codec(value: Any) -> str:
    from hetrun.errors import closest

    if _text(value, "a codec name") not in CODEC_NAMES:
        near = closest(value, CODEC_NAMES)
        guess = f"did you mean {near!r}? " if near else ""
        raise ValueError(f"unknown codec {value!r}; {guess}valid codecs: {', '.join(CODEC_NAMES)}")
    return value


def time_seconds(value: str) -> int | None:
    """Seconds of a Slurm time string; None for UNLIMITED. ValueError if malformed."""
    if value.upper() in _UNLIMITED:
        return None
    for fmt in _TIME_FORMATS:
        m = fmt.fullmatch(value)
        if m:
            parts = {k: int(v) for k, v in m.groupdict().items() if v is not None}
            total = (parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600
                     + parts.get("m", 0) * 60 + parts.get("s", 0))
            if total <= 0:
                raise ValueError(f"time limit {value!r} is zero; expected a positive {TIME_FORMATS_HELP}")
            return total
    raise ValueError(f"{value[:80]!r} is not a {TIME_FORMATS_HELP}")


# What Slurm prints for a duration (squeue %L, sacct Elapsed): [D-]HH:MM:SS, MM:SS or SS.
# Not the input format above, where a bare "59" is minutes.
_DURATION_RE = re.compile(r"(?:(\d+)-)?(?:(?:(\d+):)?(\d+):)?(\d+)")


def duration_seconds(text: str) -> int | None:
    """Seconds of a duration Slurm printed; None for UNLIMITED, NOT_SET, INVALID, "" and
    anything else that is not one. The one parser of squeue's and sacct's durations."""
    m = _DURATION_RE.fullmatch(text.strip())
    if m is None:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def check_time(value: Any) -> str:
    """A Slurm time limit; ``Unlimited``/``infinite`` are written the one way sbatch documents."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # sbatch reads a bare number as minutes
    if not isinstance(value, str):
        raise ValueError(f"expected a {TIME_FORMATS_HELP}, got {type(value).__name__}")
    if time_seconds(value) is None:
        return "UNLIMITED"
    return value


def mem_to_mb(value: str) -> int:
    """Megabytes of a Slurm memory size (K/M/G/T suffix, default M), rounded up."""
    m = MEM_RE.fullmatch(value)
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


def check_plain_string(value: str, what: str, max_len: int = 4096) -> str:
    """Text that is shell-quoted later: anything but control characters (a tab is fine).

    NUL and line breaks would end a script line; ESC and the other C0 controls
    would reach a terminal through logs and `hetrun plan`.
    """
    bad = next((c for c in value if (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F), None)
    if bad is not None:
        raise ValueError(f"{what} {value[:60]!r} contains the control character {bad!r}; "
                         "line breaks, NUL, ESC and other control characters are not allowed")
    if len(value) > max_len:
        raise ValueError(f"{what} is longer than {max_len} characters")
    return value


MAX_COMMAND_WORDS = 4096


def check_command(value: Any) -> list[str]:
    """A command component's argv: a list of strings, or one string split as a POSIX shell would
    (``shlex``: quotes group words, no variables, globs or pipes: nothing is run by a shell).

    Every word is shell-quoted when rendered; control characters (tabs and line
    breaks included) are refused because they would reach logs and terminals.
    """
    import shlex

    if isinstance(value, str):
        try:
            words = shlex.split(value, comments=False, posix=True)
        except ValueError as exc:  # unbalanced quotes, a trailing backslash
            raise ValueError(f"command {value[:80]!r} cannot be split into words: {exc}") from None
    elif isinstance(value, list):
        words = value
    else:
        raise ValueError(f"expected the command as a list of strings or one string, "
                         f"got {type(value).__name__} {value!r}")
    if not words:
        raise ValueError("the command is empty; give the program and its arguments, e.g. [python3, train.py]")
    if len(words) > MAX_COMMAND_WORDS:
        raise ValueError(f"the command has {len(words)} words; at most {MAX_COMMAND_WORDS}")
    for i, word in enumerate(words):
        if not isinstance(word, str):
            raise ValueError(f"command word {i} is {type(word).__name__} {word!r}; every word must be a "
                             "string (quote numbers in YAML)")
        bad = next((c for c in word if ord(c) < 0x20 or ord(c) == 0x7F), None)
        if bad is not None:
            raise ValueError(f"command word {i} {word[:60]!r} contains the control character {bad!r}; "
                             "tabs, line breaks, NUL, ESC and other control characters are not allowed")
        if len(word) > 4096:
            raise ValueError(f"command word {i} is longer than 4096 characters")
    if not words[0]:
        raise ValueError("the command's program (word 0) is empty")
    return list(words)


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
