"""The object-store checks ``hetrun plan`` / ``submit`` run before a job is queued.

Kept apart from runtime/ckpt/object_store.py (which pulls in the chunk codec,
torch and numpy) so the CLI's light path stays light: this module needs only
s3_client, and boto3 is imported only when a check actually runs.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from typing import Any

from hetrun.runtime.ckpt import s3_client
from hetrun.runtime.ckpt.s3_client import S3Url, with_backoff

from hetrun.errors import CheckpointError


def _where(endpoint: str | None, env: Mapping[str, str] | None) -> str:
    env = env if env is not None else os.environ
    return endpoint or env.get("AWS_ENDPOINT_URL") or "the default AWS endpoint"


def check_writable(client: Any, url: S3Url, *, endpoint: str | None = None,
                   env: Mapping[str, str] | None = None) -> None:
    """Reachable, the bucket exists, these credentials may write and delete under
    ``url``: CheckpointError in words otherwise (a probe object, put then deleted)."""
    where = _where(endpoint, env)
    try:
        client.head_bucket(Bucket=url.bucket)
    except Exception as exc:
        code = s3_client.error_code(exc)
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise CheckpointError(f"bucket {url.bucket!r} does not exist at {where}",
                                  hint="create it (aws s3 mb s3://" + url.bucket + ") or fix "
                                       "checkpoint.object_store.url") from None
        if code not in ("403", "AccessDenied"):  # a HEAD's 403 has no body: the PUT below says why
            raise CheckpointError(s3_client.describe(exc, f"bucket {url.bucket} at {where}"),
                                  hint=s3_client.hint_for(exc)) from None
    probe = url.key(f".hetrun-probe/{socket.gethostname()}-{uuid.uuid4().hex[:8]}")
    try:
        with_backoff(lambda: client.put_object(Bucket=url.bucket, Key=probe, Body=b"hetrun write probe\n"))
        with_backoff(lambda: client.delete_objects(Bucket=url.bucket,
                                                   Delete={"Objects": [{"Key": probe}], "Quiet": True}))
    except Exception as exc:
        raise CheckpointError(f"cannot write checkpoints to {url}: "
                              + s3_client.describe(exc, f"cannot write {url.bucket}/{probe}"),
                              hint=s3_client.hint_for(exc)) from None


def preflight(spec: Any, file: str) -> None:
    """``hetrun plan`` / ``submit``: the job's ``checkpoint.object_store`` (an
    ObjectStoreSpec, or None) is reachable, its bucket exists and these
    credentials may write there; CheckpointError naming the file and key otherwise."""
    if spec is None or not getattr(spec, "check", True):
        return
    where = f"{file}: checkpoint.object_store"
    try:
        client = s3_client.make_client(spec.endpoint, region=spec.region, profile=spec.profile, retries=1, timeout=5)
        check_writable(client, s3_client.parse_url(spec.url), endpoint=spec.endpoint)
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: {exc.message}", hint=(exc.hint or "") + "; or set "
                              "checkpoint.object_store.check: false to skip this check") from None
    except Exception as exc:  # the client could not be made (an unknown profile, ...)
        raise CheckpointError(s3_client.describe(exc, f"{where} {spec.url}"),
                              hint=s3_client.hint_for(exc)) from None
