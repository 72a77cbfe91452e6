"""The one interface every backend (sbatch, pyslurm, local) implements.

Planning never depends on the backend: ``submit`` gets a run directory that
already holds job.yaml, plan.json and hetjob.sbatch, and ``dry_run`` shows
exactly what ``submit`` would do with it, without doing it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..rundir import RunInfo

if TYPE_CHECKING:
    from hetrun.dag.plan import Plan

# States a run or component can be in, in Slurm's words (local runs use them too).
ACTIVE_STATES = frozenset(
    {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING",
     "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "STAGE_OUT", "SIGNALING"}
)


@dataclass
class ComponentStatus:
    """One het component of one run, as the scheduler sees it now."""

    name: str
    state: str
    job_id: str | None = None
    nodes: str = ""
    elapsed_s: int | None = None
    restarts: int = 0
    reason: str = ""
    exit_code: int | None = None


@dataclass
class RunStatus:
    run: RunInfo
    components: list[ComponentStatus] = field(default_factory=list)
    source: str = ""  # where the answer came from: squeue, sacct, local, ...

    @property
    def state(self) -> str:
        """The run's overall state: the first active component state, else the worst end state."""
        states = [c.state for c in self.components]
        if not states:
            return "UNKNOWN"
        for s in states:
            if s in ACTIVE_STATES:
                return s
        for bad in ("FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT", "CANCELLED", "PREEMPTED",
                    "BOOT_FAIL", "DEADLINE", "UNKNOWN"):
            if bad in states:
                return bad
        return states[0]


@dataclass
class DryRun:
    """What ``submit`` would do: the command line and the script, nothing executed."""

    backend: str
    command: list[str]
    script: str
    notes: list[str] = field(default_factory=list)


class Backend(ABC):
    """Submit, watch, cancel and requeue runs on one kind of executor."""

    name: str = "abstract"

    @abstractmethod
    def dry_run(self, run: RunInfo, script: str, plan: Plan) -> DryRun:
        """Exactly what ``submit(run)`` would run, without running it."""

    @abstractmethod
    def submit(self, run: RunInfo) -> str:
        """Start the run whose directory holds hetjob.sbatch; return its job id."""

    @abstractmethod
    def status(self, runs: Sequence[RunInfo]) -> dict[str, RunStatus]:
        """Per-component state of many runs at once, keyed by run_dir."""

    @abstractmethod
    def cancel(self, run: RunInfo) -> None:
        """End the run (all components)."""

    @abstractmethod
    def requeue(self, run: RunInfo) -> None:
        """Put the run back into the queue; it resumes from its newest checkpoint."""

    def preempt(self, run: RunInfo, signal_name: str) -> str:
        """Send the run's stop signal (plan.json ``preemption.signal``) the way the scheduler's
        warning would reach it; return where it went. The runtime agrees a stop step,
        checkpoints and exits 85, and the run is requeued (``hetrun preempt``)."""
        from hetrun.errors import SlurmError

        raise SlurmError(f"the {self.name} backend cannot preempt {run.run_dir}",
                         hint="use the sbatch or local backend, or `hetrun cancel`")

    @abstractmethod
    def accounting(self, run: RunInfo) -> list[dict[str, Any]]:
        """Per-component records once the run is over (state, elapsed, exit code...)."""
