"""`hetrun ckpt import FILE --into RUN`: a torch.save snapshot of examples/ddp_train.py,
imported, is what examples/ddp_train_hetrun.py restores, bit for bit, and the continued
run ends bit-identical to the baseline script run uninterrupted; a DCP directory needs
--trust-pickle; a file that needs a full unpickle is refused."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.api_helpers import BASELINE, EXAMPLE, assert_bit_identical, final_params

CHECK_RESTORE = """\
import sys, torch, hetrun
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
run = hetrun.attach(run_dir=sys.argv[1])
start = run.restore({"model": model, "optim": opt})
snap = torch.load(sys.argv[2], weights_only=True)
assert start == snap["step"] + 1, (start, snap["step"])
for k, v in snap["model"].items():
    assert torch.equal(model.state_dict()[k], v), k
got, want = opt.state_dict(), snap["optim"]
assert got["param_groups"] == want["param_groups"]
for i, st in want["state"].items():
    for name, t in st.items():
        assert torch.equal(got["state"][i][name], t), (i, name)
run.close()
print("restored ok", start)
"""


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _baseline(out: Path, steps: int) -> None:
    """examples/ddp_train.py, one rank, as torchrun would start it."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": _free_port(), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(BASELINE), "--steps", str(steps), "--out", str(out)], env=env,
                   check=True, capture_output=True, timeout=300)


def _hetrun(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetrun.cli", *args], capture_output=True, text=True,
                          timeout=300, check=False)


def _clean_env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HETRUN_RUN_DIR", "SLURM_JOB_ID")
    return {k: v for k, v in os.environ.items() if k not in drop} | {"OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_imported_torch_save_restores_bit_exactly_and_continues_like_the_baseline(tmp_path: Path) -> None:
    _baseline(tmp_path / "half", 20)  # snapshot.pt after step 19 (--save-every 10)
    snapshot = tmp_path / "half" / "snapshot.pt"
    run_dir = tmp_path / "run"
    imported = _hetrun("ckpt", "import", str(snapshot), "--into", str(run_dir))
    assert imported.returncode == 0, imported.stderr
    assert "run.restore() starts at step 20" in imported.stdout, imported.stdout
    check = tmp_path / "check_restore.py"
    check.write_text(CHECK_RESTORE)
    got = subprocess.run([sys.executable, str(check), str(run_dir), str(snapshot)], capture_output=True,
                         text=True, timeout=300, env=_clean_env())
    assert got.returncode == 0 and "restored ok 20" in got.stdout, got.stdout + got.stderr
    # The API script continues from the import; the baseline runs all 40 steps at once.
    cont = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "40", "--out", str(tmp_path / "cont")],
                          capture_output=True, text=True, timeout=300, env={**_clean_env(), "HETRUN_RUN_DIR": str(run_dir)})
    assert cont.returncode == 0, cont.stdout + cont.stderr
    _baseline(tmp_path / "full", 40)
    assert_bit_identical(final_params(tmp_path / "cont"), final_params(tmp_path / "full"))


def test_dcp_directory_needs_trust_pickle(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "step": 4}
    dcp.save(state, checkpoint_id=str(tmp_path / "dcp"))
    refused = _hetrun("ckpt", "import", str(tmp_path / "dcp"), "--into", str(tmp_path / "run"))
    assert refused.returncode != 0 and "--trust-pickle" in refused.stderr and "arbitrary code" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "run" / "ckpt").exists()
    ok = _hetrun("ckpt", "import", str(tmp_path / "dcp"), "--into", str(tmp_path / "run"), "--trust-pickle")
    assert ok.returncode == 0 and "starts at step 5" in ok.stdout, ok.stdout + ok.stderr


class NotATensor:
    pass


def test_a_file_that_needs_a_full_unpickle_is_refused(tmp_path: Path) -> None:
    torch.save({"model": NotATensor(), "step": 1}, tmp_path / "evil.pt")
    res = _hetrun("ckpt", "import", str(tmp_path / "evil.pt"), "--into", str(tmp_path / "run"))
    assert res.returncode != 0 and "weights_only=True" in res.stderr and "Traceback" not in res.stderr, res.stderr
    torch.save({"model": {"w": torch.ones(2)}}, tmp_path / "nostep.pt")
    res = _hetrun("ckpt", "import", str(tmp_path / "nostep.pt"), "--into", str(tmp_path / "run"))
    assert res.returncode != 0 and "--step N" in res.stderr, res.stderr
