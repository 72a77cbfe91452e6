"""Evaluate each checkpoint of examples/ddp_train_hetrun.py as it lands: the second
component of a het job (a trainer on two nodes, this evaluator on a third).

    name: ddp-train-eval
    components:
      trainer:   {nodes: 2, command: [python3, examples/ddp_train_hetrun.py, --steps, "60"]}
      evaluator: {nodes: 1, command: [python3, examples/ddp_eval_hetrun.py, --steps, "60"]}

Each evaluation is an event (``eval_loss`` at the trainer's step) for ``hetrun report``.
"""

import argparse

import torch
import torch.nn.functional as F
from ddp_train_hetrun import make_data  # the trainer's data (this directory is on sys.path)

import hetrun


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60, help="the trainer's --steps: its last step ends this")
    p.add_argument("--trainer", default="trainer", help="the component whose checkpoints to evaluate")
    p.add_argument("--idle-timeout", type=float, default=600.0)
    args = p.parse_args()
    run = hetrun.attach()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    x, y = make_data().tensors
    trainer = run.checkpoints(args.trainer)
    for step in trainer.follow_loaded({"model": model}, last_step=args.steps - 1,
                                      idle_timeout=args.idle_timeout):
        with torch.no_grad():
            loss = F.mse_loss(model(x), y).item()
        run.log(step, eval_loss=loss)
        print(f"evaluated step {step}: loss {loss:.4f}", flush=True)
    run.close()


if __name__ == "__main__":
    main()
