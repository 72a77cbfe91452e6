"""Bucketed asynchronous gradient all-reduce that overlaps the last backward.

The executor arms a ``BucketedGradSync`` just before the backward of the
last micro-batch of an iteration. Each parameter's
``post_accumulate_grad_hook`` marks it ready; a bucket whose parameters are
all ready is flattened and handed to an async ``all_reduce`` (gloo on CPU,
NCCL on GPU) while autograd keeps computing the gradients of earlier layers.
Buckets are always *launched in index order* (a bucket that becomes ready
early waits for its predecessors) so every rank issues the same collectives
in the same order, whatever order its hooks fire in. ``launch_rest`` starts
what did not become ready (parameters without a gradient this step get
zeros); ``finish`` waits, averages and writes the results back into
``.grad``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

DEFAULT_BUCKET_BYTES = 1 << 20


class BucketedGradSync:
    def __init__(self, params: list[torch.Tensor], group: Any, world: int,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self.group = group
        self.world = world
        # Reverse order: backward produces the last layers' gradients first.
        ordered = [p for p in reversed(params) if p.requires_grad]
        self.buckets: list[list[torch.Tensor]] = []
        cur: list[torch.Tensor] = []
        size = 0
        for p in ordered:
            cur.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                self.buckets.append(cur)
                cur, size = [], 0
        if cur:
            self.buckets.append(cur)
        self.bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self.pending = [len(b) for b in self.buckets]
        self.next_launch = 0
        self.handles: list[Any] = []
        self.flats: list[torch.Tensor] = []
        self.hooks: list[Any] = []
        self.first_launch: float | None = None
        self.launched_in_backward = 0
        self.nbytes = 0
        self._in_backward = False

    def arm(self) -> None:
        """Register the hooks; call right before the last micro-batch's backward."""
        self._in_backward = True
        for bucket in self.buckets:
            for p in bucket:
                self.hooks.append(p.register_post_accumulate_grad_hook(self._ready))

    def _ready(self, p: torch.Tensor) -> None:
        i = self.bucket_of.get(id(p))
        if i is None or self.pending[i] <= 0:
            return
        self.pending[i] -= 1
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self.next_launch < len(self.buckets) and self.pending[self.next_launch] == 0:
            self._launch(self.next_launch)

    def _launch(self, i: int) -> None:
        import torch.distributed as dist

        grads = []
        for p in self.buckets[i]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad.reshape(-1))
        flat = torch.cat(grads)
        if self.first_launch is None:
            self.first_launch = time.time()
        self.handles.append(dist.all_reduce(flat, group=self.group, async_op=True))
        self.flats.append(flat)
        self.nbytes += flat.numel() * flat.element_size()
        if self._in_backward:
            self.launched_in_backward += 1
        self.pending[i] = -1
        self.next_launch = i + 1

    def disarm(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks.clear()
        self._in_backward = False

    def launch_rest(self) -> None:
        """Start every bucket not started yet (the sync action itself)."""
        self.disarm()
        for i in range(self.next_launch, len(self.buckets)):
            self.pending[i] = 0
        self._launch_ready()

    def finish(self) -> None:
        """Wait for every bucket, average, write back into ``.grad``."""
        self.launch_rest()
        for h in self.handles:
            h.wait()
        for flat, bucket in zip(self.flats, self.buckets, strict=True):
            flat.div_(self.world)
            offset = 0
            for p in bucket:
                n = p.numel()
                assert p.grad is not None
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n
