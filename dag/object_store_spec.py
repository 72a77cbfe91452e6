"""``checkpoint.object_store``: the S3-compatible cold tier of a job's checkpoints.

The ``s3://bucket/prefix`` URL rule and the endpoint rule live here (the spec
validates with them; runtime/ckpt/s3_client.py reads URLs with them). No key
of this section can hold a credential: keys come from the standard AWS places
only (environment, profile, shared credentials file), so none is ever written
to plan.json, the batch script or the run directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hetrun.rundir import DEFAULTS

# Bucket names as S3 allows them (3-63 of a-z 0-9 . -, starting and ending alphanumeric).
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# Prefix path segments: plain, shell- and URL-safe characters only.
_SEGMENT_RE = re.compile(r"[A-Za-z0-9._=+@,-]{1,200}")
_ENDPOINT_RE = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?")
_PROFILE_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_REGION_RE = re.compile(r"[a-z0-9-]{1,32}")
# checkpoint.object_store.max_fetch_ratio (its one home): a chunk goes to the bucket as a
# delta only while its delta chain there stays within this many times the chunk's raw
# bytes, else it is re-encoded whole; so a restore from the bucket downloads at most
# ~1.2x the state however long the local tier's chains are (benchmarks/ckpt_s3.md).
DEFAULT_MAX_FETCH_RATIO = 1.2


@dataclass(frozen=True)
class S3Url:
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the bucket's root

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def child(self, name: str) -> S3Url:
        return S3Url(self.bucket, self.key(name))

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def is_s3_url(value: str) -> bool:
    return isinstance(value, str) and value.startswith("s3://")


def parse_url(url: str) -> S3Url:
    """``s3://bucket[/prefix]`` -> S3Url; ValueError naming the fix otherwise."""
    if not is_s3_url(url):
        raise ValueError(f"{url!r} is not an s3:// URL; write s3://BUCKET/PREFIX")
    rest = url[len("s3://"):].strip("/")
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        raise ValueError(f"{url!r}: credentials or ports do not belong in the URL; put the endpoint in "
                         "checkpoint.object_store.endpoint and keys in AWS_* variables or ~/.aws")
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise ValueError(f"{url!r}: {bucket!r} is not a valid bucket name (3-63 characters a-z 0-9 . -)")
    segments = prefix.split("/") if prefix else []
    for s in segments:
        if s in (".", "..") or not _SEGMENT_RE.fullmatch(s):
            raise ValueError(f"{url!r}: prefix part {s!r} is not allowed (letters, digits and ._=+@,- only)")
    return S3Url(bucket, "/".join(segments))


def check_endpoint(endpoint: str) -> str:
    """An http(s) endpoint URL without credentials in it."""
    if "@" in endpoint:
        raise ValueError(f"endpoint {endpoint.split('@')[-1]!r} carries credentials (user:secret@); "
                         "keys belong in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws/credentials")
    if not _ENDPOINT_RE.fullmatch(endpoint):
        raise ValueError(f"endpoint {endpoint!r} is not an http(s)://HOST[:PORT] URL")
    return endpoint.rstrip("/")


class ObjectStoreSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)

    url: str = Field(description="s3://BUCKET/PREFIX; each component's store is PREFIX/<component>/")
    endpoint: str | None = Field(None, description="S3 endpoint, e.g. http://127.0.0.1:8333 "
                                                   "(default: $AWS_ENDPOINT_URL, else AWS)")
    region: str | None = Field(None, description="default: $AWS_DEFAULT_REGION / the profile's")
    profile: str | None = Field(None, description="a profile of ~/.aws/credentials (default: $AWS_PROFILE)")
    upload_threads: int = Field(DEFAULTS.object_upload_threads, ge=1, le=256, description="parallel requests per rank")
    shard_wait_s: float = Field(DEFAULTS.object_shard_wait_s, ge=1, le=86_400,
                                description="how long rank 0 waits for every rank's shard before it "
                                            "gives up on a step's upload (no manifest is written)")
    max_fetch_ratio: float = Field(DEFAULT_MAX_FETCH_RATIO, ge=0, le=64,
                                   description="a restore from the bucket downloads at most this many times "
                                               "each chunk's raw bytes: a chunk whose delta chain would "
                                               "exceed it is uploaded whole (re-encoded) instead of as a "
                                               "delta; 0: always whole, 64: the local tier's chains")
    check: bool = Field(True, description="hetrun plan/submit check reachability, bucket and write "
                                          "access before the job is queued")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return str(parse_url(value))

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        return None if value is None else check_endpoint(value)

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str | None) -> str | None:
        if value is not None and not _PROFILE_RE.fullmatch(value):
            raise ValueError(f"profile {value!r}: letters, digits and ._- only (a profile NAME, never a key)")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and not _REGION_RE.fullmatch(value):
            raise ValueError(f"region {value!r} is not a region name (e.g. us-east-1)")
        return value
