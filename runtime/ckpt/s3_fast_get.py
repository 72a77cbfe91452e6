"""The object store's reads through obstore (Rust), where it is installed.

Chosen on measurement (benchmarks/ckpt_s3.md): on 2 cores, the same parallel GETs
of a 160 MB checkpoint's objects from the same server took 0.14 s through obstore
and 0.19 s through boto3, whose response handling holds the GIL the decoder needs.
GETs and listings of a "directory" go through here; writes, deletes, HEADs,
preflight and other listings stay on boto3, whose errors s3_client puts in words.

The same server, bucket and credentials as boto3 would use. ``without_client``: the
endpoint given (the job file's, else ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``)
and the keys in the environment with no profile named, the first place boto3's chain
looks: no boto3 import or client at all (a fresh restore's 0.1-0.5 s of CPU).
Otherwise ``from_client``: the boto3 client's endpoint and region (``client.meta``),
the credentials from boto3's own chain (a ``boto3.session.Session`` with the store's
profile, refreshed as botocore refreshes them). Nothing here is written anywhere.

A missing key is an answer (FileNotFoundError, which the caller reports as boto3's
404). A read that fails here for any other reason is not reported from here: the
caller asks again through boto3 (its retries, its fallbacks, its words) and the
store stops using this path: a server that is down costs one refused connection
more, not one per object.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

T = TypeVar("T")

# obstore's own retries are off: the boto3 path behind this one retries in hetrun's way.
_RETRY: dict[str, Any] = {"max_retries": 0, "retry_timeout": timedelta(seconds=5)}
CREDENTIAL_TTL = timedelta(minutes=15)


def available() -> bool:
    """Installed (the s3 extra): looked up, not imported, until a GET needs it."""
    import importlib.util

    return importlib.util.find_spec("obstore") is not None


def _credentials(profile: str | None, env: Mapping[str, str] | None) -> Callable[[], dict[str, Any]]:
    """obstore's credential callback: the caller's ``env`` values, else boto3's chain."""
    if env is not None:
        key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        if not key or not secret:
            raise ValueError("no credentials in the given environment")
        static = {"access_key_id": key, "secret_access_key": secret,
                  "token": env.get("AWS_SESSION_TOKEN") or None, "expires_at": None}
        return lambda: dict(static)
    import boto3

    creds = boto3.session.Session(profile_name=profile).get_credentials()
    if creds is None:
        raise ValueError("boto3 found no credentials")

    def provide() -> dict[str, Any]:
        frozen = creds.get_frozen_credentials()  # botocore refreshes expiring ones here
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key,
                "token": frozen.token, "expires_at": datetime.now(UTC) + CREDENTIAL_TTL}
    return provide


class FastGet:
    """GETs (and the manifest listing) of one bucket through obstore; each raises whatever
    went wrong (the caller falls back)."""

    def __init__(self, bucket: str, *, endpoint: str, region: str,
                 credentials: Callable[[], dict[str, Any]], timeout_s: float = 20.0) -> None:
        from obstore.store import S3Store

        config: dict[str, Any] = {"region": region}
        options: dict[str, Any] = {"timeout": timedelta(seconds=timeout_s),
                                   "connect_timeout": timedelta(seconds=min(5.0, timeout_s))}
        if endpoint:
            # Path-style, as make_client addresses a configured endpoint.
            config.update(endpoint=endpoint, virtual_hosted_style_request=False)
            options["allow_http"] = endpoint.startswith("http://")
        kw: dict[str, Any] = {"config": config, "client_options": options, "retry_config": _RETRY,
                              "credential_provider": credentials}
        self._store = S3Store(bucket, **kw)

    def get(self, key: str) -> Any:
        import obstore

        return obstore.get(self._store, key).bytes()

    def keys_under(self, dir_key: str) -> list[tuple[str, int, float]]:
        """(key, size, modified epoch seconds) of every object under ``dir_key/``."""
        import obstore

        return [(str(m["path"]), int(m["size"]), m["last_modified"].timestamp())
                for batch in obstore.list(self._store, prefix=dir_key.rstrip("/")) for m in batch]


def without_client(bucket: str, *, endpoint: str | None, region: str | None, profile: str | None,
                   env: Mapping[str, str] | None) -> FastGet | None:
    """A FastGet made from what the caller and the environment say, with no boto3 at all (its
    import and client cost a fresh restore 0.1-0.5 s of the CPU the decoder needs), where that
    is unambiguous: an endpoint given (the job file's, else ``AWS_ENDPOINT_URL_S3`` /
    ``AWS_ENDPOINT_URL``, as botocore reads them) and keys in the environment with no profile
    named (the first place boto3's chain looks). Else None: made from the boto3 client."""
    src = env if env is not None else os.environ
    if env is None and (profile or os.environ.get("AWS_PROFILE")):
        return None  # a named profile takes precedence over the variables in boto3's chain
    if not (src.get("AWS_ACCESS_KEY_ID") and src.get("AWS_SECRET_ACCESS_KEY")):
        return None
    url = endpoint or (src.get("AWS_ENDPOINT_URL") if env is not None
                       else src.get("AWS_ENDPOINT_URL_S3") or src.get("AWS_ENDPOINT_URL"))
    if not url:
        return None
    return FastGet(bucket, endpoint=url, region=region or src.get("AWS_DEFAULT_REGION") or "us-east-1",
                   credentials=_credentials(profile, src))


def from_client(client: Any, bucket: str, *, profile: str | None, env: Mapping[str, str] | None) -> FastGet:
    """A FastGet on the boto3 client's own endpoint and region, with boto3's credentials."""
    meta = client.meta
    return FastGet(bucket, endpoint=str(meta.endpoint_url or ""), region=meta.region_name or "us-east-1",
                   credentials=_credentials(profile, env))


class FastGetSlot:
    """One store's FastGet, made on first use, and switched off for good after a failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fast: FastGet | None = None
        self.off = not available()
        self.why_off: str | None = None if not self.off else "obstore is not installed"
        self.gets = 0  # requests this path answered (tests and benchmarks read it)

    def _turn_off(self, exc: Exception) -> None:
        self.off, self.why_off = True, f"{type(exc).__name__}: {str(exc)[:200]}"

    def _made(self, make: Callable[[], FastGet | None]) -> FastGet | None:
        with self._lock:
            if self._fast is None:
                self._fast = make()
            return self._fast

    def prepare(self, make: Callable[[], FastGet | None]) -> bool:
        """Make the FastGet now if ``make`` can (None: it needs a boto3 client); True if ready."""
        if self.off:
            return False
        try:
            return self._made(make) is not None
        except Exception as exc:
            self._turn_off(exc)
            return False

    def call(self, make: Callable[[], FastGet], fn: Callable[[FastGet], T]) -> T | None:
        """``fn(fast)`` through obstore, or None: the caller asks boto3 instead."""
        if self.off:
            return None
        try:
            fast = self._made(make)
            assert fast is not None  # make() always makes one
            out = fn(fast)
        except FileNotFoundError:
            raise  # a missing key (obstore's 404) is an answer, not a failure of this path
        except Exception as exc:  # every failure goes the boto3 way, which says why
            self._turn_off(exc)
            return None
        with self._lock:
            self.gets += 1
        return out
