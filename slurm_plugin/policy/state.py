"""The Slurm objects a policy manages, as comparable values, and how to read them live.

``QosState`` / ``AssocState`` are what both sides of a diff look like: the
desired state rendered from the policy (``desired.py``) and the live state
read from ``sacctmgr show ... --parsable2`` / ``scontrol show config``
(Slurm 22.05 output, checked live). Values are normalised (TRES as dicts with
memory in MB, times in seconds, lists as sorted tuples) so that "the same
setting written differently" never shows up as a change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hetrun.dag import validators as v
from hetrun.slurm_plugin.policy.model import size_mb

from hetrun.errors import SlurmError

Runner = Callable[[Sequence[str]], str]

QOS_FORMAT = "Name,Priority,Preempt,PreemptMode,MaxWall,GrpTRES,MaxTRESPU,Flags,GraceTime"
# Associations have no MaxTRESPerUser (a QOS limit): a per-user cap inside an
# account is the GrpTRES of that user's own association.
ASSOC_FORMAT = "Account,User,Partition,Fairshare,GrpTRES,MaxWall,QOS,DefaultQOS,ParentName"


@dataclass(frozen=True)
class QosState:
    name: str
    priority: int = 0
    preempt: tuple[str, ...] = ()
    preempt_mode: str = "cluster"
    max_wall: int | None = None
    grp_tres: dict[str, int] = field(default_factory=dict)
    max_tres_per_user: dict[str, int] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    grace_time: int = 0  # seconds between preemption's SIGTERM and SIGKILL (0: KillWait only)


@dataclass(frozen=True)
class AssocState:
    """An association: an account's own (``user == ""``) or a user's under an account."""

    account: str
    user: str = ""
    fairshare: int = 1
    grp_tres: dict[str, int] = field(default_factory=dict)
    max_wall: int | None = None
    qos: tuple[str, ...] = ()
    default_qos: str = ""
    parent: str = ""


@dataclass
class LiveState:
    qos: dict[str, QosState]
    assocs: dict[tuple[str, str], AssocState]  # (account, user)
    config: dict[str, str]  # scontrol show config, keys as printed
    partitions: dict[str, dict[str, str]]  # scontrol show partition -o, per partition
    cluster: str | None = None  # ClusterName: associations are per cluster, QOS are not


def parse_tres(text: str) -> dict[str, int]:
    """``cpu=8,mem=256G,gres/gpu=4`` -> ``{"cpu": 8, "mem": 262144, "gres/gpu": 4}``."""
    out: dict[str, int] = {}
    for item in filter(None, text.strip().split(",")):
        key, _, value = item.partition("=")
        try:
            out[key] = size_mb(value) if key == "mem" else int(value)
        except ValueError as exc:
            raise SlurmError(f"cannot read TRES {item!r} from sacctmgr: {exc}") from None
    return out


def format_tres(tres: dict[str, int]) -> str:
    return ",".join(f"{k}={n}" for k, n in sorted(tres.items()))


def parse_wall(text: str) -> int | None:
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    try:
        return v.time_seconds(text)
    except ValueError as exc:
        raise SlurmError(f"cannot read time {text!r} from sacctmgr: {exc}") from None


def format_wall(seconds: int | None) -> str:
    if seconds is None:
        return "-1"
    days, rest = divmod(seconds, 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hms}" if days else hms


def parse_grace(text: str) -> int:
    """QOS GraceTime in seconds; sacctmgr prints none as ``00:00:00`` (a zero time limit elsewhere)."""
    text = text.strip()
    return 0 if text.strip("0:-") == "" else parse_wall(text) or 0


def _names(text: str) -> tuple[str, ...]:
    return tuple(sorted(n for n in text.strip().split(",") if n))


def parse_qos(text: str) -> dict[str, QosState]:
    out: dict[str, QosState] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) not in (8, 9):  # 8: read before GraceTime was in QOS_FORMAT
            continue
        name, prio, preempt, mode, wall, grp, maxpu, flags = parts[:8]
        grace = parse_grace(parts[8]) if len(parts) == 9 else 0
        out[name] = QosState(name, int(prio or 0), _names(preempt), (mode or "cluster").lower(),
                             parse_wall(wall), parse_tres(grp), parse_tres(maxpu), _names(flags), grace)
    return out


def parse_assocs(text: str) -> dict[tuple[str, str], AssocState]:
    out: dict[tuple[str, str], AssocState] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 9:
            continue
        account, user, partition, share, grp, wall, qos, defqos, parent = parts
        if partition:
            continue  # per-partition associations are not managed by the policy
        share_n = int(share) if share.lstrip("-").isdigit() else 1
        out[(account, user)] = AssocState(account, user, share_n, parse_tres(grp), parse_wall(wall),
                                          _names(qos), defqos, parent)
    return out


def parse_config(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_partitions(text: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "PartitionName" in fields:
            out[fields["PartitionName"]] = fields
    return out


def read_live(run: Runner) -> LiveState:
    """The live cluster's QOS, its associations and config; ``run(argv) -> stdout``."""
    config = parse_config(run(["scontrol", "show", "config"]))
    cluster = config.get("ClusterName") or None
    # One slurmdbd may serve several clusters: only this cluster's associations.
    where = ["where", f"cluster={cluster}"] if cluster else []
    qos = parse_qos(run(["sacctmgr", "-n", "-P", "show", "qos", f"format={QOS_FORMAT}"]))
    assocs = parse_assocs(run(["sacctmgr", "-n", "-P", "show", "assoc", *where, f"format={ASSOC_FORMAT}"]))
    partitions = parse_partitions(run(["scontrol", "show", "partition", "-o"]))
    return LiveState(qos, assocs, config, partitions, cluster)
