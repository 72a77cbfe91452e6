"""A rank's object-store tier: the uploader its writer feeds and the bucket tier its
restore reads, from the plan's ``checkpoint.object_store``, or for the run API in a
script hetrun did not submit, ``$HETRUN_OBJECT_STORE`` (runtime/resume.py calls
:func:`for_rank`; nothing here runs without one of them).

Events: ``ckpt_upload`` (a step reached the bucket: objects sent, bytes, seconds)
and ``ckpt_tier_failure`` (tier ``object``; op upload, list or read; the error
in words, never a credential). Neither stops training.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hetrun.runtime.ckpt.object_store import ObjectStore, ObjectStoreConfig
from hetrun.runtime.ckpt.object_tier import MEMORY_BYTES, BucketTier
from hetrun.runtime.ckpt.object_upload import ObjectUploader
from hetrun.runtime.ckpt.objects import Tier

# How long the end of a run (flush) waits for the upload in flight before it
# leaves the checkpoint on the faster tiers only (the next run uploads it).
FLUSH_TIMEOUT_ENV = "HETRUN_OBJECT_FLUSH_S"
# The run API outside a hetrun job file (a script's own launcher): the same tier from
# the environment, ``HETRUN_OBJECT_STORE=s3://bucket/prefix`` (endpoint: AWS_ENDPOINT_URL).
URL_ENV = "HETRUN_OBJECT_STORE"
DEFAULT_FLUSH_S = 300.0


@dataclass
class RankObjectTier:
    uploader: ObjectUploader
    tier: BucketTier

    def on_commit(self, result: dict[str, Any]) -> None:
        """The writer's ``on_event``: a committed step goes to the uploader."""
        if result.get("ev") == "checkpoint" and result.get("ok"):
            self.uploader.submit(int(result["step"]))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the upload in flight: ``timeout`` seconds, default $HETRUN_OBJECT_FLUSH_S or 300."""
        if timeout is None:
            raw = os.environ.get(FLUSH_TIMEOUT_ENV, "")
            timeout = float(raw) if raw.replace(".", "", 1).isdigit() else DEFAULT_FLUSH_S
        return self.uploader.wait(timeout)

    def close(self) -> None:
        """At exit (runtime/resume.py). A stopping rank does not wait for the upload:
        its grace belongs to the file tiers, and waiting could outlast it into SIGKILL.
        The checkpoint is committed there; the next attempt uploads what is missing."""
        self.flush(close_wait_s())
        self.uploader.close(0)
        self.tier.close()


def close_wait_s() -> float | None:
    """How long close() waits for the upload: 0 once a stop was asked for (a signal
    arrived or a stop reason was agreed), else None (flush's default)."""
    from hetrun.runtime import preempt

    stopping = preempt.stop_reason() is not None or preempt.requested_by_signal() is not None
    return 0.0 if stopping else None


def for_rank(checkpoint_cfg: dict[str, Any] | None, component: str, tiers: list[Tier], *, rank: int,
             world_size: int, keep: int, emit: Callable[[dict[str, Any]], None] | None) -> RankObjectTier | None:
    cfg = ObjectStoreConfig.from_plan(checkpoint_cfg) or _from_env()
    if cfg is None:
        return None
    # BucketTier's reads go through obstore with no boto3 client where the environment names the
    # endpoint and keys (s3_fast_get.py), else it starts making the client (ObjectStore.warm) while
    # the caller builds its writer; the uploader makes it on its first upload, off the critical path.
    # The restore reads each object once, then resume.py closes the tier: objects wait in memory.
    store = ObjectStore.from_config(cfg, component)
    uploader = ObjectUploader(store, tiers, rank=rank, world_size=world_size, keep=keep, on_event=emit,
                              shard_wait_s=cfg.shard_wait_s, max_fetch_ratio=cfg.max_fetch_ratio)
    return RankObjectTier(uploader, BucketTier(store, on_event=emit, memory_bytes=MEMORY_BYTES))


def _from_env() -> ObjectStoreConfig | None:
    url = os.environ.get(URL_ENV, "").strip()
    if not url:
        return None
    from hetrun.dag.object_store_spec import parse_url

    from hetrun.errors import CheckpointError

    try:
        return ObjectStoreConfig(url=str(parse_url(url)))
    except ValueError as exc:
        raise CheckpointError(f"${URL_ENV}: {exc}", hint="e.g. HETRUN_OBJECT_STORE=s3://my-bucket/my-run") from None
