"""The sbatch long options a job spec may pass through ``slurm.extra``.

An allow-list, like submitit's: an unknown option is a typo far more often
than a new Slurm feature, and anything we pass lands in an ``#SBATCH`` line.
Options hetrun itself writes (nodes, tasks, outputs, signal, requeue...) are
refused with the spec key that controls them instead.
"""

from __future__ import annotations

import re

from hetrun.errors import closest

# option -> whether it takes a value (True), must not (False), or may (None).
SBATCH_OPTIONS: dict[str, bool | None] = {
    "acctg-freq": True,
    "batch": True,
    "bb": True,
    "bbf": True,
    "begin": True,
    "cluster-constraint": True,
    "clusters": True,
    "comment": True,
    "contiguous": False,
    "core-spec": True,
    "cores-per-socket": True,
    "cpu-freq": True,
    "cpus-per-gpu": True,
    "deadline": True,
    "delay-boot": True,
    "dependency": True,
    "distribution": True,
    "exclude": True,
    "exclusive": None,
    "export": True,
    "get-user-env": None,
    "gid": True,
    "gpu-bind": True,
    "gpu-freq": True,
    "gpus-per-socket": True,
    "gpus-per-task": True,
    "hint": True,
    "hold": False,
    "kill-on-invalid-dep": True,
    "licenses": True,
    "mail-type": True,
    "mail-user": True,
    "mcs-label": True,
    "mem-bind": True,
    "mem-per-cpu": True,
    "mem-per-gpu": True,
    "mincpus": True,
    "network": True,
    "nice": None,
    "no-kill": None,
    "no-requeue": False,
    "nodefile": True,
    "nodelist": True,
    "open-mode": True,
    "overcommit": False,
    "oversubscribe": False,
    "power": True,
    "prefer": True,
    "priority": True,
    "profile": True,
    "propagate": None,
    "reboot": False,
    "reservation": True,
    "sockets-per-node": True,
    "spread-job": False,
    "switches": True,
    "thread-spec": True,
    "threads-per-core": True,
    "time-min": True,
    "tmp": True,
    "uid": True,
    "use-min-nodes": False,
    "wckey": True,
}

# Options hetrun writes itself: the spec key to use instead.
MANAGED_OPTIONS: dict[str, str] = {
    "account": "slurm.account (or -A)",
    "array": "nothing: hetrun submits one heterogeneous job, not an array",
    "chdir": "nothing: hetrun runs from the run directory",
    "constraint": "slurm.constraint (or --constraint)",
    "cpus-per-task": "components.<name>.cpus_per_task",
    "error": "nothing: outputs go to <run_dir>/logs",
    "gpus": "components.<name>.gpus_per_node (or --gres)",
    "gpus-per-node": "components.<name>.gpus_per_node (or --gres)",
    "gres": "components.<name>.gpus_per_node (or --gres)",
    "het-group": "components (one het component each)",
    "job-name": "name",
    "mem": "components.<name>.mem",
    "nodes": "components.<name>.nodes (or -N)",
    "ntasks": "components.<name>.tasks_per_node",
    "ntasks-per-node": "components.<name>.tasks_per_node",
    "output": "nothing: outputs go to <run_dir>/logs",
    "parsable": "nothing: hetrun parses sbatch itself",
    "partition": "slurm.partition (or -p)",
    "qos": "slurm.qos (or -q)",
    "requeue": "preemption.max_restarts (hetrun always requeues)",
    "signal": "preemption.signal / preemption.grace_seconds",
    "time": "slurm.time (or -t)",
    "wait": "nothing: use hetrun submit --wait",
    "wrap": "nothing: hetrun writes the batch script",
}

# Options that exist but would undo what the rendered script relies on.
REFUSED_OPTIONS: dict[str, str] = {
    "export": "the script exports the job's env: itself; use the env: section",
    "open-mode": "hetrun appends to logs so requeued attempts keep earlier output",
    "no-requeue": "set preemption.max_restarts: 0 instead",
    "uid": "the job runs as you; submit as the other user instead",
    "gid": "the job runs with your group; use newgrp before submitting",
    "bbf": "a burst-buffer file is read at submit time; put its lines in the bb option",
}

_EXTRA_RE = re.compile(r"^--([a-z][a-z0-9-]*)(?:=(.*))?$", re.DOTALL)
# Values land in an #SBATCH line that sbatch parses itself; keep to characters
# that need no quoting there (mail addresses, lists, times, node lists,
# feature expressions). No spaces, quotes, '$', backticks, backslashes or '#'.
_VALUE_CHARS = "letters, digits and _ . , : = @ % / + & | ! ( ) [ ] * -"
_VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:=@%/+&|!()\[\]*-]{1,256}$")


def check_extra_option(item: object) -> str | None:
    """Why ``item`` is not an acceptable ``slurm.extra`` entry, or None when it is fine.

    The one rule for both the spec and the script renderer (slurm_plugin/quoting.py).
    """
    if not isinstance(item, str):
        return f"expected a string like '--exclusive', got {type(item).__name__} {item!r}"
    m = _EXTRA_RE.fullmatch(item)
    if not m:
        return (f"{item!r} is not a long sbatch option; expected --option or --option=value "
                "(e.g. --exclusive, --mail-type=END)")
    name, value = m.group(1), m.group(2)
    if name in MANAGED_OPTIONS:
        return f"--{name} is set by hetrun; use {MANAGED_OPTIONS[name]}"
    if name in REFUSED_OPTIONS:
        return f"--{name} is not allowed in slurm.extra: {REFUSED_OPTIONS[name]}"
    if name not in SBATCH_OPTIONS:
        near = closest(name, list(SBATCH_OPTIONS) + list(MANAGED_OPTIONS))
        guess = f" Did you mean --{near}?" if near else ""
        return (f"unknown sbatch option --{name}.{guess} Allowed: "
                + ", ".join("--" + o for o in sorted(SBATCH_OPTIONS)))
    takes = SBATCH_OPTIONS[name]
    if takes is True and value is None:
        return f"--{name} needs a value: --{name}=VALUE"
    if takes is False and value is not None:
        return f"--{name} takes no value; write just --{name}"
    if value is not None and not _VALUE_RE.fullmatch(value):
        return (f"value {value[:80]!r} of --{name} has characters sbatch would misread "
                f"(allowed: {_VALUE_CHARS})")
    return None
