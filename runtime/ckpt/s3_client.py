"""The S3 client the object-store tier uses (boto3; chosen on measurement,
benchmarks/ckpt_s3.md), the ``s3://bucket/prefix`` URL rule, and errors in words.

Credentials come only from boto3's standard chain: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and the
shared credentials/config files, instance/container roles. hetrun never
takes a key as a parameter of a job file, a plan or a command line, so none
can end up in a run directory. The endpoint: the job file's
``checkpoint.object_store.endpoint``, else ``AWS_ENDPOINT_URL`` (botocore
reads it), else AWS.

boto3 is imported here only, and only when a client is made: the light CLI
commands never load it (tests/test_cli_startup.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from hetrun.dag.object_store_spec import S3Url, check_endpoint, is_s3_url, parse_url

from hetrun.backoff import Backoff

T = TypeVar("T")
__all__ = ["S3Url", "check_endpoint", "is_s3_url", "make_client", "parse_url", "with_backoff"]

# S3's "slow down" answers: retried along THROTTLE_BACKOFF, never a failure at once.
THROTTLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                            "TooManyRequests", "RequestThrottled", "503", "ServiceUnavailable"})
THROTTLE_BACKOFF = Backoff(0.05, 2.0)
THROTTLE_GIVE_UP_S = 60.0


def make_client(endpoint: str | None = None, *, region: str | None = None, profile: str | None = None,
                env: Mapping[str, str] | None = None, pool: int = 16, retries: int = 2,
                timeout: float = 20.0) -> Any:
    """A boto3 S3 client. ``env``: AWS_* values to use instead of this
    process's environment (tests and benchmarks starting their own server)."""
    import boto3
    from botocore.config import Config

    kw: dict[str, Any] = {}
    if env is not None:
        kw = {"aws_access_key_id": env.get("AWS_ACCESS_KEY_ID"),
              "aws_secret_access_key": env.get("AWS_SECRET_ACCESS_KEY"),
              "aws_session_token": env.get("AWS_SESSION_TOKEN")}
        endpoint = endpoint or env.get("AWS_ENDPOINT_URL")
        region = region or env.get("AWS_DEFAULT_REGION")
    session = boto3.session.Session(profile_name=profile, region_name=region or None)
    cfg = Config(max_pool_connections=pool, connect_timeout=min(5.0, timeout), read_timeout=timeout,
                 retries={"max_attempts": retries + 1, "mode": "standard"},
                 s3={"addressing_style": "path"} if endpoint else {},
                 # Checksums on every request only where the server asks (S3-compatible
                 # stores differ in what they accept); hetrun checks content hashes itself.
                 request_checksum_calculation="when_required", response_checksum_validation="when_required")
    return session.client("s3", endpoint_url=endpoint or None, config=cfg, region_name=region or None, **kw)


def error_code(exc: BaseException) -> str:
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        err = resp.get("Error", {}) or {}
        code = str(err.get("Code") or "")
        if code:
            return code
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return str(status or "")
    return type(exc).__name__


def is_throttle(exc: BaseException) -> bool:
    return error_code(exc) in THROTTLE_CODES


def is_missing(exc: BaseException) -> bool:
    return error_code(exc) in ("404", "NoSuchKey", "NotFound")


def describe(exc: BaseException, where: str) -> str:
    """One line saying what went wrong in the user's terms (never the credentials)."""
    code = error_code(exc)
    name = type(exc).__name__
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError",
                "ReadTimeoutError", "ConnectionError"):
        return f"{where}: the endpoint does not answer ({name})"
    if name in ("NoCredentialsError", "PartialCredentialsError", "ProfileNotFound"):
        return f"{where}: no S3 credentials ({exc})"
    if code in ("NoSuchBucket",):
        return f"{where}: the bucket does not exist"
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AuthorizationHeaderMalformed"):
        return f"{where}: the S3 credentials are wrong ({code})"
    if code in ("AccessDenied", "403", "AllAccessDisabled"):
        return f"{where}: access denied (the credentials may not write here)"
    if code in ("QuotaExceeded", "EntityTooLarge", "InsufficientStorage", "507"):
        return f"{where}: the bucket is full ({code})"
    if code in THROTTLE_CODES:
        return f"{where}: the server kept throttling ({code}) for {THROTTLE_GIVE_UP_S:.0f} s"
    return f"{where}: {name} {code}".rstrip()


CREDENTIAL_HINT = ("hetrun reads S3 credentials only from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                   "AWS_PROFILE or ~/.aws/credentials; the endpoint from checkpoint.object_store.endpoint "
                   "or AWS_ENDPOINT_URL")


def with_backoff(call: Callable[[], T], *, give_up_s: float = THROTTLE_GIVE_UP_S,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, retried along THROTTLE_BACKOFF while the server says slow down."""
    start = time.monotonic()
    for delay in THROTTLE_BACKOFF.delays():
        try:
            return call()
        except Exception as exc:
            if not is_throttle(exc) or time.monotonic() - start + delay > give_up_s:
                raise
        sleep(delay)
    raise AssertionError("unreachable: Backoff.delays() is endless")
