"""Compressed vs exact all-to-all on shared memory, loopback and emulated 1 Gbit/s links.

    sudo python benchmarks/alltoall_netemu.py [--mb 64] [--reps 5] [--out DIR]

Side by side in one run, with real Open MPI ranks:

- ``shm``: 2 ranks, shared memory (btl vader), no namespaces;
- ``loopback``: 2 ranks over TCP on ``lo``;
- ``1gbit-2`` / ``1gbit-4``: 2 and 4 ranks, one network namespace per
  emulated node, veth pairs into a bridge in a "switch" namespace, ``tbf``
  1 Gbit/s on both ends of every veth, addresses in 198.18.0.0/24 (reserved
  for benchmarking), traffic only on those veths (see shared/NETEMU.md).
  Everything is created here and deleted when the run ends, also on failure.

Per configuration and codec (exact = hetrun's ``exact_all_to_all``, an MPI
``Alltoallv``; ``onebit``/``int8`` = ``compressed_all_to_all``): the median
over ``reps`` of the slowest rank's time, ``mb`` MB of fp32 per rank split
evenly; plus the adaptive policy's decision for the links of that
configuration, and the bytes one MoE step puts on the wire (dispatch and
combine, forward and backward) with ``int8`` forward / ``onebit_ef``
backward vs fp32. Writes ``alltoall_netemu.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUBNET = "198.18.0"


# ------------------------------------------------------------------ rank side


def _rank_body(mb: int, reps: int, out_path: str) -> None:
    import torch
    from hetrun.runtime.comms.alltoall import AllToAllComm, all_to_all, exact_all_to_all
    from hetrun.runtime.comms.bandwidth import calibrate
    from hetrun.runtime.comms.compressed import (
        DIRECTION_DEFAULTS,
        compressed_all_to_all,
        exchange_for,
    )
    from mpi4py import MPI

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    comm = AllToAllComm.from_mpi(world)
    width = 256
    rows = (mb << 20) // (4 * width)
    rows -= rows % size
    splits = [rows // size] * size
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(rank))

    def timed(fn) -> float:
        times = []
        for i in range(reps + 1):
            world.Barrier()
            t0 = time.perf_counter()
            fn()
            dt = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if i:  # the first run warms buffers and connections
                times.append(dt)
        return statistics.median(times)

    result: dict[str, object] = {"ranks": size, "mb_per_rank": mb, "reps": reps}
    # Peers: hetrun's exact all-to-all (MPI Alltoallv into a fresh result, as
    # the MoE layer calls it) and a raw mpi4py Alltoall into a reused buffer.
    result["exact_s"] = timed(lambda: exact_all_to_all(x, splits, splits, comm))
    reuse = torch.empty_like(x)
    reuse.fill_(0)
    xb = x.view(torch.uint8).numpy()
    rb = reuse.view(torch.uint8).numpy()
    result["exact_reused_s"] = timed(lambda: world.Alltoall(xb, rb))
    # each codec with the block size and scale format of the direction it serves by default
    for codec, direction in (("onebit", "backward"), ("int8", "forward")):
        comm.reset_stats()
        result[f"{codec}_s"] = timed(
            lambda c=codec, d=direction: compressed_all_to_all(x, splits, splits, comm, codec=c, direction=d)
        )
        result[f"{codec}_speedup"] = result["exact_s"] / result[f"{codec}_s"]  # type: ignore[operator]
        comm.reset_stats()
        result[f"{codec}_reused_s"] = timed(
            lambda c=codec, d=direction: compressed_all_to_all(
                x, splits, splits, comm, codec=c, direction=d, out=reuse
            )
        )
        result[f"{codec}_reused_speedup"] = result["exact_reused_s"] / result[f"{codec}_reused_s"]  # type: ignore[operator]
        # where the time of one call went on rank 0 (encode, decode, idle waiting)
        result[f"{codec}_reused_phases_ms"] = {
            k: round(comm.stats.get(k, 0.0) / comm.stats["calls"] * 1e3, 1)
            for k in ("encode_s", "decode_s", "wait_s", "seconds")
        }

    # Bytes on the wire in one MoE step: dispatch + combine, forward and backward.
    step_rows = rows // 8
    xs = x[:step_rows].clone().requires_grad_(True)
    sp = [step_rows // size] * size
    sp[-1] += step_rows - sum(sp)
    sp_in = world.alltoall(sp)
    wire = {}
    for label, fc, bc in (("fp32", None, None), ("int8+onebit_ef", "int8", "onebit_ef")):
        comm.reset_stats()
        there = all_to_all(xs, sp, sp_in, comm, codec=fc, backward_codec=bc)
        back = all_to_all(torch.tanh(there), sp_in, sp, comm, codec=fc, backward_codec=bc)
        back.sum().backward()
        wire[label] = world.allreduce(comm.stats["bytes_sent"], op=MPI.SUM)
    result["moe_step_wire_bytes"] = wire
    result["moe_step_cut"] = 1.0 - wire["int8+onebit_ef"] / wire["fp32"]
    result["codec_defaults"] = {d: f"block {b}, {sc} scales" for d, (b, sc) in DIRECTION_DEFAULTS.items()}

    pol = calibrate(comm, "onebit", nbytes=16 << 20)
    ex = exchange_for(comm)
    result["adaptive"] = {
        "reason": pol.reason,
        "break_even_gbit": pol.break_even_bps * 8 / 1e9,  # type: ignore[attr-defined]
        "link_gbit": [[round(b * 8 / 1e9, 2) for b in row] for row in pol.bandwidth],  # type: ignore[attr-defined]
        "compress": pol.compress,
        # the whole-exchange check (exact, compressed ms) that confirms or vetoes the pairs
        "exchange_ms": None if pol.exchange_s is None else [round(t * 1e3, 1) for t in pol.exchange_s],  # type: ignore[attr-defined]
    }
    result["adaptive_s"] = timed(
        lambda: compressed_all_to_all(x, splits, splits, comm, codec="onebit", out=reuse)
    )
    ex.policy = None
    if rank == 0:
        Path(out_path).write_text(json.dumps(result))


# ------------------------------------------------------------------ network


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=check, capture_output=True, text=True)


class EmulatedNetwork:
    """Namespaces + veths + bridge + tbf, removed by :meth:`close` whatever happened."""

    def __init__(self, nodes: int, rate: str = "1gbit") -> None:
        tag = f"hr{os.getpid() % 100000}"
        self.switch = f"{tag}sw"
        self.nodes = [f"{tag}n{i}" for i in range(nodes)]
        self.addrs = [f"{SUBNET}.{i + 1}" for i in range(nodes)]
        self.created: list[str] = []
        try:
            self._build(rate)
        except BaseException:
            self.close()
            raise

    def _build(self, rate: str) -> None:
        burst = "256kb"  # max(256 KiB, 1 ms at 1 Gbit/s)
        _sh("ip", "netns", "add", self.switch)
        self.created.append(self.switch)
        _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        _sh("ip", "-n", self.switch, "link", "set", "lo", "up")
        for i, (ns, addr) in enumerate(zip(self.nodes, self.addrs, strict=True)):
            _sh("ip", "netns", "add", ns)
            self.created.append(ns)
            port = f"p{i}"
            _sh("ip", "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", port, "netns", self.switch)
            _sh("ip", "-n", self.switch, "link", "set", port, "master", "br0")
            _sh("ip", "-n", self.switch, "link", "set", port, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "v0")
            _sh("ip", "-n", ns, "link", "set", "v0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            for where, dev in ((ns, "v0"), (self.switch, port)):
                _sh("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root",
                    "tbf", "rate", rate, "burst", burst, "latency", "2ms")

    def close(self) -> None:
        for ns in reversed(self.created):
            pids = _sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _sh("ip", "netns", "del", ns, check=False)
        self.created.clear()


def _agent_script(net: EmulatedNetwork, tmp: Path) -> Path:
    """Plays ssh for mpirun: runs the command inside the namespace of the given address."""
    cases = "\n".join(f"  {a}) ns={n} ;;" for a, n in zip(net.addrs, net.nodes, strict=True))
    script = tmp / "netns_agent.sh"
    script.write_text(
        "#!/bin/sh\n"
        'while [ "${1#-}" != "$1" ]; do shift; done\n'
        'host=$1; shift\n'
        f'case "$host" in\n{cases}\n  *) echo "unknown host $host" >&2; exit 1 ;;\nesac\n'
        'exec ip netns exec "$ns" /bin/sh -c "$*"\n'
    )
    script.chmod(0o755)
    return script


BASE_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_pml": "ob1",
    "OMPI_MCA_mpi_yield_when_idle": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_hwloc_base_binding_policy": "none",
    "OMP_NUM_THREADS": "1",
}


def _run(config: str, ranks: int, mb: int, reps: int, tmp: Path, timeout: int) -> dict:
    out = tmp / f"{config}.json"
    body = [sys.executable, __file__, "--rank-body", str(mb), str(reps), str(out)]
    env = {**os.environ, **BASE_ENV}
    net = None
    try:
        if config == "shm":
            env["OMPI_MCA_btl"] = "self,vader"
            cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), *body]
        elif config == "loopback":
            env.update(OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo",
                       OMPI_MCA_oob_tcp_if_include="lo", OMPI_MCA_btl_tcp_links="2")
            cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), *body]
        else:
            net = EmulatedNetwork(ranks)
            env.update(
                OMPI_MCA_plm="rsh",
                OMPI_MCA_plm_rsh_agent=str(_agent_script(net, tmp)),
                OMPI_MCA_btl="self,vader,tcp",
                OMPI_MCA_btl_tcp_if_include=f"{SUBNET}.0/24",
                OMPI_MCA_oob_tcp_if_include=f"{SUBNET}.0/24",
                OMPI_MCA_btl_tcp_links="2",
            )
            cmd = ["ip", "netns", "exec", net.nodes[0], "mpirun", "--host", ",".join(net.addrs),
                   "-np", str(ranks), *body]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{config}: mpirun failed ({proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())
    finally:
        if net is not None:
            net.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=64, help="MB of fp32 per rank")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--configs", default="shm,loopback,1gbit-2,1gbit-4")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args()
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("mpirun") is None:
        sys.exit("needs root, iproute2 and Open MPI (network namespaces are created)")
    # Turn SIGTERM into an exception so the finally blocks delete the namespaces.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    results = {}
    with tempfile.TemporaryDirectory(prefix="hetrun-netemu-") as tmpdir:
        tmp = Path(tmpdir)
        for config in args.configs.split(","):
            ranks = int(config.split("-")[1]) if config.startswith("1gbit") else 2
            t0 = time.time()
            res = _run(config, ranks, args.mb, args.reps, tmp, args.timeout)
            results[config] = res
            print(
                f"{config:9s} ranks={ranks} {args.mb} MB/rank ({time.time() - t0:.0f} s)\n"
                f"  fresh result : exact {res['exact_s'] * 1e3:7.1f} ms | 1-bit {res['onebit_s'] * 1e3:7.1f} ms "
                f"({res['onebit_speedup']:.2f}x) | int8 {res['int8_s'] * 1e3:7.1f} ms ({res['int8_speedup']:.2f}x)\n"
                f"  reused buffer: exact {res['exact_reused_s'] * 1e3:7.1f} ms | 1-bit {res['onebit_reused_s'] * 1e3:7.1f} ms "
                f"({res['onebit_reused_speedup']:.2f}x) | int8 {res['int8_reused_s'] * 1e3:7.1f} ms "
                f"({res['int8_reused_speedup']:.2f}x) | adaptive 1-bit {res['adaptive_s'] * 1e3:7.1f} ms\n"
                f"  1-bit phases (rank 0, ms/call): {res['onebit_reused_phases_ms']}\n"
                f"  adaptive: {res['adaptive']['reason']}; links Gbit/s {res['adaptive']['link_gbit']}; "
                f"whole exchange exact/compressed ms {res['adaptive']['exchange_ms']}\n"
                f"  MoE step (int8 fwd + 1-bit EF bwd; {res['codec_defaults']}) wire bytes "
                f"{res['moe_step_wire_bytes']}: cut {res['moe_step_cut'] * 100:.1f}%",
                flush=True,
            )
    os.system("uptime")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "alltoall_netemu.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {out / 'alltoall_netemu.json'}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-body":
        _rank_body(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        main()
