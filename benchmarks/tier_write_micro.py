"""What a memory-tier blob's tmpfs write costs the thread that makes it, and what a write into a
preallocated, mapped slot would (a design not built: benchmarks/node_death.md, session 41).

    python3 benchmarks/tier_write_micro.py --rounds 400

``file``: ``MemoryTier.write`` as the tier runs it (runtime/ckpt/memory.py: the oldest file
renamed and reused, written, truncated, renamed into place; ``keep`` 4). ``slot``: the same
bytes copied into one of ``keep`` tmpfs files mapped once (``mmap``), between a slot header made
invalid and then valid again (a torn slot is one whose blob fails its digests on read, as every
read of a memory blob verifies them). Each write follows a pass over 8 MB (caches cooled, as a
training step leaves them). Prints the medians in ms of the thread's CPU and wall time per write,
the first 20 rounds left out. The PPO learner's blob is 176 KB (the default ``--bytes``).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import tempfile
import time

WARMUP = 20
HEAD = 64  # the slot header's bytes: magic, step, length


def measure(rounds: int, size: int, keep: int = 4) -> dict[str, float]:
    from hetrun.runtime.ckpt import memory

    blobs = [bytearray(os.urandom(size)) for _ in range(keep)]
    junk = bytearray(8 << 20)
    zeros = bytes(len(junk) // 64)  # one byte in each 64-byte cache line of junk
    out: dict[str, list[float]] = {k: [] for k in ("file_cpu", "file_wall", "slot_cpu", "slot_wall")}
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm, tempfile.TemporaryDirectory() as run:
        tier = memory.MemoryTier(run, shm, keep=keep)
        ring = os.path.join(shm, "ring")
        os.makedirs(ring)
        slots = []
        for k in range(keep):
            fd = os.open(os.path.join(ring, f"slot-{k}"), os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(fd, size + HEAD)
            slots.append(mmap.mmap(fd, size + HEAD))
            os.close(fd)
        for i in range(rounds):
            blob = blobs[i % keep]
            junk[::64] = zeros  # cool the caches
            c0, t0 = time.thread_time(), time.perf_counter()
            tier.write(0, i, blob)
            out["file_cpu"].append(time.thread_time() - c0)
            out["file_wall"].append(time.perf_counter() - t0)
            junk[::64] = zeros
            c0, t0 = time.thread_time(), time.perf_counter()
            m = slots[i % keep]
            m[0:8] = bytes(8)  # invalid while the payload changes
            m[HEAD:HEAD + len(blob)] = blob
            m[8:24] = i.to_bytes(8, "little") + len(blob).to_bytes(8, "little")
            m[0:8] = b"HRSLOT01"
            out["slot_cpu"].append(time.thread_time() - c0)
            out["slot_wall"].append(time.perf_counter() - t0)
        for m in slots:
            m.close()
    return {k: round(1e3 * statistics.median(v[WARMUP:]), 4) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--bytes", type=int, default=175776)
    p.add_argument("--json", help="write the result here")
    a = p.parse_args()
    if a.rounds <= WARMUP:
        p.error(f"--rounds must exceed the {WARMUP} warm-up rounds")
    res = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_before": os.getloadavg(),
           "bytes": a.bytes, "rounds": a.rounds, "ms": measure(a.rounds, a.bytes)}
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            f.write(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
