"""Running Slurm's command-line tools: timeouts, and retry with exponential
backoff while slurmctld is briefly unreachable (restart, failover, overload).

Only errors that mean "could not talk to the controller" are retried; a
rejected job (bad partition, invalid option) fails at once with Slurm's own
message.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetrun.backoff import Backoff
from hetrun.errors import SlurmError

# Substrings of Slurm client errors that mean the controller was not reachable.
_TRANSIENT = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "connection timed out",
    "zero bytes were transmitted",
    "transport endpoint is not connected",
    "communication connection failure",
    "resource temporarily unavailable",
    "slurmctld not responding",
    "slurm_persist_conn_open",
    "slurmdbd: connection",
    "temporary failure",
)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. Defaults ride out a ~1 minute slurmctld restart."""

    attempts: int = 6
    first_delay_s: float = 1.0
    factor: float = 2.0
    max_delay_s: float = 16.0
    timeout_s: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetryPolicy:
        """``HETRUN_SLURM_ATTEMPTS`` / ``HETRUN_SLURM_TIMEOUT`` override the defaults."""
        env = os.environ if env is None else env
        kwargs: dict[str, float] = {}
        try:
            if env.get("HETRUN_SLURM_ATTEMPTS"):
                kwargs["attempts"] = max(1, int(env["HETRUN_SLURM_ATTEMPTS"]))
            if env.get("HETRUN_SLURM_TIMEOUT"):
                kwargs["timeout_s"] = max(0.1, float(env["HETRUN_SLURM_TIMEOUT"]))
        except ValueError as exc:
            raise SlurmError(f"bad HETRUN_SLURM_ATTEMPTS/HETRUN_SLURM_TIMEOUT: {exc}",
                             hint="give an integer number of attempts and seconds") from exc
        return cls(attempts=int(kwargs.get("attempts", cls.attempts)),
                   timeout_s=kwargs.get("timeout_s", cls.timeout_s))


def is_transient(stderr: str) -> bool:
    low = stderr.lower()
    return any(s in low for s in _TRANSIENT)


def _first_lines(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[:n]) if lines else "(no output)"


def run_slurm(
    cmd: Sequence[str],
    policy: RetryPolicy | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    sleep=time.sleep,
) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command; return it on exit 0, else raise SlurmError naming it."""
    policy = policy or RetryPolicy.from_env()
    shown = shlex.join(cmd)
    delays = Backoff(first=policy.first_delay_s, most=max(policy.max_delay_s, policy.first_delay_s),
                     factor=policy.factor).delays()
    started = time.monotonic()
    last = ""
    for attempt in range(1, policy.attempts + 1):
        try:
            proc = subprocess.run(
                list(cmd), capture_output=True, text=True, timeout=policy.timeout_s,
                env=None if env is None else dict(env), cwd=cwd, check=False,
            )
        except FileNotFoundError as exc:
            raise SlurmError(f"`{cmd[0]}` is not on PATH",
                             hint="install the Slurm client tools, or use --backend local") from exc
        except subprocess.TimeoutExpired:
            last = f"no answer within {policy.timeout_s:g}s"
        else:
            if proc.returncode == 0:
                return proc
            if not is_transient(proc.stderr + proc.stdout):
                raise SlurmError(
                    f"`{shown}` failed (exit {proc.returncode}): {_first_lines(proc.stderr or proc.stdout)}"
                )
            last = _first_lines(proc.stderr or proc.stdout)
        if attempt < policy.attempts:
            sleep(next(delays))
    waited = time.monotonic() - started
    err = SlurmError(
        f"`{shown}` failed: slurmctld unreachable after {policy.attempts} attempts "
        f"over {waited:.1f}s; last error: {last}",
        hint="check that the controller is up (`scontrol ping`, `sinfo`) and that SLURM_CONF "
        "points at the right slurm.conf; retry later",
    )
    # A command that timed out may still have been carried out (sbatch: the job queued).
    err.uncertain = last.startswith("no answer")
    raise err
