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

import contextlib
import errno
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from hetrun.dag.object_store_spec import S3Url, check_endpoint, is_s3_url, parse_url

from hetrun.backoff import Backoff

T = TypeVar("T")
__all__ = ["S3Url", "check_endpoint", "describe", "hint_for", "is_s3_url", "make_client", "parse_url",
           "with_backoff"]

# S3's "slow down" answers: retried along THROTTLE_BACKOFF, never a failure at once.
THROTTLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                            "TooManyRequests", "RequestThrottled", "503", "ServiceUnavailable"})
THROTTLE_BACKOFF = Backoff(0.05, 2.0)
THROTTLE_GIVE_UP_S = 60.0
# A READ that meets trouble on the server's side (a 5xx: SeaweedFS answers 500 InternalError
# while its volume servers register after a restart) or no answer at all is retried along
# THROTTLE_BACKOFF this long before it is reported: a store that is briefly down costs a
# restore a wait, not a fallback. A refused connection (nothing listens: a wrong endpoint,
# a server not running) is reported at once, after botocore's own attempts (2-5 s). Writes are not retried so: an upload that fails is the
# next checkpoint's to send, and training never waits for it. botocore's own retries
# (make_client's ``retries``, standard mode) come first, inside each attempt here.
READ_RETRY_S = 20.0
SERVER_ERROR_CODES = frozenset({"InternalError", "ServiceUnavailable", "RequestTimeout", "RequestTimeoutException",
                                "PriorRequestNotComplete", "BadGateway", "GatewayTimeout"})
UNREACHABLE = frozenset({"EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError",
                         "ReadTimeoutError", "ConnectionError", "ProxyConnectionError"})
SERVER_HINT = ("the S3 server itself failed (an error on its side, not a credentials problem): "
               "check its health and logs, then try again")


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


def http_status(exc: BaseException) -> int | None:
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return int(status) if isinstance(status, int) else None
    return None


def is_throttle(exc: BaseException) -> bool:
    return error_code(exc) in THROTTLE_CODES


def is_server_error(exc: BaseException) -> bool:
    """A 5xx answer (not a throttle): the request was fine, the server failed it."""
    code = error_code(exc)
    status = http_status(exc) or (int(code) if code.isdigit() else 0)
    return not is_throttle(exc) and (status >= 500 or code in SERVER_ERROR_CODES)


def is_unreachable(exc: BaseException) -> bool:
    return type(exc).__name__ in UNREACHABLE


def is_refused(exc: BaseException) -> bool:
    """Nothing listens at the endpoint (connection refused): a wrong endpoint or a
    server that is not running, never worth READ_RETRY_S of waiting (a silent or
    failing server still is). botocore keeps the OS error in ``kwargs['error']``."""
    todo: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
            return True
        if "Connection refused" in str(e):
            return True
        kw = getattr(e, "kwargs", None)
        inner = kw.get("error") if isinstance(kw, dict) else None
        todo += [inner if isinstance(inner, BaseException) else None, e.__cause__, e.__context__]
    return False


def is_transient(exc: BaseException) -> bool:
    """Worth asking again: throttled, a server error, or no answer (but not a refusal)."""
    return is_throttle(exc) or is_server_error(exc) or (is_unreachable(exc) and not is_refused(exc))


def is_missing(exc: BaseException) -> bool:
    return error_code(exc) in ("404", "NoSuchKey", "NotFound")


def describe(exc: BaseException, where: str) -> str:
    """One line saying what went wrong in the user's terms (never the credentials)."""
    code = error_code(exc)
    name = type(exc).__name__
    retried = getattr(exc, "hetrun_retried_s", None)
    after = f" (retried for {retried:.{1 if retried < 10 else 0}f} s)" if retried is not None else ""
    if is_unreachable(exc) and is_refused(exc):
        return f"{where}: the endpoint does not answer (connection refused: no S3 server listens there){after}"
    if is_unreachable(exc):
        return f"{where}: the endpoint does not answer ({name}){after}"
    if is_server_error(exc):
        said = str(((getattr(exc, "response", None) or {}).get("Error") or {}).get("Message") or "").strip()
        status = http_status(exc)
        # A body-less answer (HEAD) has only the status as its code: not said twice.
        shown = "" if code == str(status) else code
        return (f"{where}: the server answered {f'HTTP {status} ' if status else ''}{shown}".rstrip()
                + f"{': ' + said[:200] if said else ''}{after}")
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


def hint_for(exc: BaseException) -> str:
    """The hint beside :func:`describe`'s line: the server's own trouble is not the credentials'."""
    return SERVER_HINT if is_throttle(exc) or is_server_error(exc) else CREDENTIAL_HINT


def with_backoff(call: Callable[[], T], *, give_up_s: float = THROTTLE_GIVE_UP_S, retry_s: float = 0.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> T:
    """``call()``, retried along THROTTLE_BACKOFF while the server says slow down (up to
    ``give_up_s``) and, with ``retry_s`` > 0 (reads: READ_RETRY_S), while it answers a 5xx
    or not at all (up to ``retry_s``). The error that ends the retries carries how long
    they took (``hetrun_retried_s``, which :func:`describe` says)."""
    start = clock()
    for delay in THROTTLE_BACKOFF.delays():
        try:
            return call()
        except Exception as exc:
            spent = clock() - start
            limit = give_up_s if is_throttle(exc) else retry_s if is_transient(exc) else 0.0
            if spent + delay > limit:
                if limit > 0:  # retried (botocore's own retries count: one attempt may use the window)
                    with contextlib.suppress(AttributeError):  # a class with __slots__
                        exc.hetrun_retried_s = spent  # type: ignore[attr-defined]
                raise
        sleep(delay)
    raise AssertionError("unreachable: Backoff.delays() is endless")
