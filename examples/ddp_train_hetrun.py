"""examples/ddp_train.py with hetrun's run API: incremental async checkpoints,
an agreed stop on preemption, exact resume (RNG included), snapshots in peer
memory when the job has spare nodes (a node death costs at most a step or so),
events for ``hetrun report``. Runs under torchrun, plain ``srun`` and standalone.

    torchrun --nproc-per-node 2 examples/ddp_train_hetrun.py --steps 60 --out runs/ddp
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import hetrun


def make_data(n: int = 512, dim: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=g)
    y = x @ torch.randn(dim, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--out", default="ddp_out")
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step (tests)")
    p.add_argument("--progress", default=None,
                   help="rank 0 appends 'step end-time start-step' per step to this file (benchmarks)")
    args = p.parse_args()
    run = hetrun.attach()  # before init: sets RANK/MASTER_ADDR... under srun or standalone
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = make_data()
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    os.makedirs(args.out, exist_ok=True)
    start = run.restore(state := {"model": model.module, "optim": opt})  # in place; 0 on a first run
    batches = iter(())
    for step in range(start, args.steps):
        epoch, i = divmod(step, len(loader))
        if i == 0 or step == start:  # a new epoch, or resuming inside one
            sampler.set_epoch(epoch)
            batches = iter(list(loader)[i:])
        x, y = next(batches)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_time)
        if rank == 0 and args.progress:
            with open(args.progress, "a") as f:
                f.write(f"{step} {time.time():.4f} {start}\n")
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        run.log(step, loss=loss.item())
        run.snapshot(step, state)  # peer memory every N steps when the job has spare nodes (else a no-op)
        if run.should_stop(step):  # every rank agrees on the same step
            run.save(step, state, wait=True)
            run.exit_for_requeue()
        if (step + 1) % args.save_every == 0:
            run.save(step, state)  # async, incremental
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(args.out, "final.pt"))
    run.close()  # waits for the last checkpoint (before its process group goes)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
