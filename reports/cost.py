"""What a run cost: allocated node/core/GPU hours times a price table.

Hours come from Slurm's accounting when it has the job (elapsed x AllocTRES
per component and attempt: what the allocation really held, requeues
included), else from the run's events (rank lifetimes: a lower bound that
misses start-up and teardown). The price table is a small YAML the user
keeps (``--prices FILE``, else ``$HETRUN_PRICES``, else
``~/.config/hetrun/prices.yaml``, else :data:`DEFAULT_PRICES`)::

    currency: USD
    node_hour: 0.0          # per allocated node and hour
    core_hour: 0.05         # per allocated CPU and hour
    gpu_hour: 2.50          # per GPU and hour; or per GRES type: {default: 2.5, a100: 3.0}
    mem_gb_hour: 0.0        # per allocated GiB of memory and hour (cloud prices charge it apart)
    partitions:             # any of the three above, per partition
      high: {core_hour: 0.10, gpu_hour: {default: 5.0}}

Waste: the share of the cost spent on work redone after restarts (lost
seconds over the attempts' wall) plus, of the rest, the share the ranks sat
idle inside the allocation (1 - busy time / rank lifetime).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hetrun.errors import SpecError, closest

DEFAULT_PRICES: dict[str, Any] = {"currency": "USD", "node_hour": 0.0, "core_hour": 0.05, "gpu_hour": 2.50,
                                  "mem_gb_hour": 0.0, "partitions": {}}
_RATES = ("node_hour", "core_hour", "gpu_hour", "mem_gb_hour")
PRICES_ENV = "HETRUN_PRICES"


def prices_path(cli_value: str | os.PathLike[str] | None = None) -> Path | None:
    """The price table to read: --prices, $HETRUN_PRICES, ~/.config/hetrun/prices.yaml; None: defaults."""
    if cli_value:
        return Path(cli_value).expanduser()
    if os.environ.get(PRICES_ENV):
        return Path(os.environ[PRICES_ENV]).expanduser()
    home = Path("~/.config/hetrun/prices.yaml").expanduser()
    return home if home.is_file() else None


def load_prices(path: Path | None) -> dict[str, Any]:
    """The price table, validated (unknown keys and non-numbers named with their key path)."""
    if path is None:
        return DEFAULT_PRICES
    import yaml

    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise SpecError(f"cannot read the price table: {exc.strerror}", file=str(path),
                        hint=f"give an existing YAML file with --prices or ${PRICES_ENV}") from exc
    except yaml.YAMLError as exc:
        raise SpecError(f"not YAML: {exc}", file=str(path)) from exc
    if not isinstance(doc, dict):
        raise SpecError("the price table must be a mapping", file=str(path), value=doc,
                        hint="see `hetrun report --help` for the format")
    _check_rates(doc, str(path), "", extra=("currency", "partitions"))
    parts = doc.get("partitions") or {}
    if not isinstance(parts, dict):
        raise SpecError("must map partition names to rates", file=str(path), key_path="partitions", value=parts)
    for name, rates in parts.items():
        if not isinstance(rates, dict):
            raise SpecError("must be a mapping of rates", file=str(path), key_path=f"partitions.{name}",
                            value=rates, hint=f"e.g. {{core_hour: 0.1}}; rate keys: {', '.join(_RATES)}")
        _check_rates(rates, str(path), f"partitions.{name}.", extra=())
    return {**DEFAULT_PRICES, **doc, "partitions": parts}


def _check_rates(doc: Mapping[str, Any], file: str, prefix: str, extra: tuple[str, ...]) -> None:
    valid = (*_RATES, *extra)
    for key, value in doc.items():
        if key not in valid:
            near = closest(str(key), list(valid))
            raise SpecError(f"unknown key {key!r}", file=file, key_path=f"{prefix}{key}", value=value,
                            hint=(f"did you mean {near!r}? " if near else "") + f"valid keys: {', '.join(valid)}")
        if key not in _RATES:
            continue
        values = value.items() if isinstance(value, dict) and key == "gpu_hour" else [("", value)]
        for sub, v in values:
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                path = f"{prefix}{key}" + (f".{sub}" if sub else "")
                raise SpecError(f"must be a number >= 0, got {v!r}", file=file, key_path=path, value=v,
                                hint="a price per hour, e.g. 0.05")


def _rate(prices: Mapping[str, Any], partition: str | None, key: str, gres_type: str | None = None) -> float:
    over = (prices.get("partitions") or {}).get(partition or "", {})
    value = over.get(key, prices.get(key, DEFAULT_PRICES[key]))
    if isinstance(value, dict):
        return float(value.get(gres_type or "default", value.get("default", 0.0)))
    return float(value)


def _hours_from_accounting(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        h = (r.get("elapsed_s") or 0) / 3600
        tres = r.get("tres") or {}
        gpus = {k.split("/", 1)[1]: v for k, v in tres.items() if k.startswith("gres/gpu")}
        # "gres/gpu" counts all GPUs; "gres/gpu:a100" (where configured) says which type
        typed = {k.split(":", 1)[1]: v for k, v in gpus.items() if ":" in k}
        out.append({"component": r["component"], "partition": r.get("partition"),
                    "node_h": h * tres.get("node", 0), "core_h": h * tres.get("cpu", 0),
                    "mem_gb_h": h * tres.get("mem", 0) / 1024,
                    "gpu_h": {t: h * n for t, n in (typed or {"default": gpus.get("gpu", 0)}).items()}})
    return out


def run_cost(prices: Mapping[str, Any], accounting_rows: list[dict[str, Any]], components: list[Any],
             partition: str | None, *, iterations: int, env_steps: int, lost_s: float,
             attempts_wall_s: float) -> dict[str, Any]:
    """Total and per component cost, per useful iteration and per million env steps, waste shares."""
    if accounting_rows:
        source, usage = "slurm accounting", _hours_from_accounting(accounting_rows)
    else:
        source = "events (rank lifetimes; no accounting)"
        usage = [{"component": c.name, "partition": partition, "node_h": c.node_hours,
                  "core_h": c.core_hours, "gpu_h": {"default": c.gpu_hours}} for c in components]
    per: dict[str, dict[str, float]] = {}
    for u in usage:
        row = per.setdefault(u["component"], {"node_h": 0.0, "core_h": 0.0, "gpu_h": 0.0, "cost": 0.0})
        part = u["partition"] or partition
        gpu_h = sum(u["gpu_h"].values())
        row["node_h"] += u["node_h"]
        row["core_h"] += u["core_h"]
        row["gpu_h"] += gpu_h
        row["cost"] += (u["node_h"] * _rate(prices, part, "node_hour") + u["core_h"] * _rate(prices, part, "core_hour")
                        + u.get("mem_gb_h", 0.0) * _rate(prices, part, "mem_gb_hour")
                        + sum(h * _rate(prices, part, "gpu_hour", t) for t, h in u["gpu_h"].items()))
    total = sum(r["cost"] for r in per.values())
    busy = sum(c.busy_s for c in components)
    life = sum(c.life_s for c in components)
    restart_share = min(1.0, lost_s / attempts_wall_s) if attempts_wall_s > 0 else 0.0
    idle_share = (1.0 - busy / life) if life > 0 else 0.0
    return {
        "currency": prices.get("currency", "USD"), "source": source, "total": total,
        "components": per, "per_iteration": total / iterations if iterations else None,
        "per_million_env_steps": total / env_steps * 1e6 if env_steps else None,
        "wasted_restarts_share": round(restart_share, 4), "wasted_idle_share": round(idle_share, 4),
        "wasted_share": round(restart_share + (1 - restart_share) * idle_share, 4),
    }
