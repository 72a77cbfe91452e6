"""Two local-backend command runs at once each get their own MASTER_PORT.

Outside Slurm no job id tells two runs on one host apart; a port derived from
the component index alone (29500 + k, torchrun's default) made the second run's
rendezvous fail with EADDRINUSE. Here two runs of two command components each
start together; every rank 0 binds its MASTER_ADDR:MASTER_PORT (as torch's
TCPStore does) and keeps it until all four rank 0s hold theirs, so the ports
are in use at the same time; every rank 1 connects to its own component's
rank 0 and must hear that component's name. Real processes, real sockets.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hetrun.dag.spec import spec_from_dict
from hetrun.slurm_plugin.backends.local import LocalBackend, command_processes, free_ports
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

RENDEZVOUS = r'''
import os, socket, sys, time
from pathlib import Path

shared, tag = Path(sys.argv[1]), sys.argv[2]
addr, port, rank = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["RANK"])
deadline = time.time() + 90
if rank == 0:
    server = socket.socket()
    server.bind((addr, port))  # EADDRINUSE when another run's component holds the port
    server.listen()
    (shared / f"{tag}.bound").write_text(str(port))
    while len(list(shared.glob("*.bound"))) < 4:  # every component of both runs holds its port
        assert time.time() < deadline, "the other components never bound their ports"
        time.sleep(0.05)
    conn, _ = server.accept()
    conn.sendall(tag.encode())
    conn.close()
else:
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            assert time.time() < deadline, f"rank 0 never listened on {addr}:{port}"
            time.sleep(0.05)
    heard = conn.recv(100).decode()
    assert heard == tag, f"rank 1 of {tag} reached {heard}'s rank 0 on port {port}"
    (shared / f"{tag}.heard").write_text(heard)
'''


def _job(name: str, program: Path, shared: Path) -> dict[str, object]:
    def comp(tag: str) -> dict[str, object]:
        return {"nodes": 1, "tasks_per_node": 2, "command": [sys.executable, str(program), str(shared), tag]}

    return {"name": name, "components": {"a": comp(f"{name}-a"), "b": comp(f"{name}-b")},
            "env": {"OMP_NUM_THREADS": "1"}}


def test_two_local_command_runs_at_once_both_finish(tmp_path: Path) -> None:
    program, shared = tmp_path / "rendezvous.py", tmp_path / "shared"
    program.write_text(RENDEZVOUS)
    shared.mkdir()
    runs = [submit_spec(spec_from_dict(_job(name, program, shared)), backend="local", runs_dir=tmp_path / "runs")
            for name in ("one", "two")]
    for res in runs:
        final = wait_for_end(res.run, LocalBackend(), timeout_s=180, poll_s=0.3)
        logs = Path(res.run.run_dir) / "logs"
        assert [c.state for c in final.components] == ["COMPLETED", "COMPLETED"], \
            "\n".join(p.read_text()[-1500:] for p in sorted(logs.glob("*.out")))
    tags = ["one-a", "one-b", "two-a", "two-b"]
    assert sorted(p.stem for p in shared.glob("*.heard")) == tags
    ports = [int((shared / f"{t}.bound").read_text()) for t in tags]
    assert len(set(ports)) == 4, ports


def test_each_command_component_gets_its_port_and_the_dry_run_none() -> None:
    plan = {"components": [{"name": "a", "nodes": 1, "tasks_per_node": 2, "command": ["x"]},
                           {"name": "learner", "nodes": 1, "tasks_per_node": 1, "actions": ["forward"]},
                           {"name": "b", "nodes": 1, "tasks_per_node": 1, "command": ["y"]}]}
    ports = free_ports(2)
    assert len(set(ports)) == 2 and all(0 < p < 65536 for p in ports)
    got = [extra for _argv, extra in command_processes(Path("/r"), plan, "python3", ports=ports)]
    assert [e["HETRUN_COMMAND_PORT"] for e in got] == [str(ports[0])] * 2 + [str(ports[1])]
    assert all("HETRUN_COMMAND_PORT" not in e for _a, e in command_processes(Path("/r"), plan, "python3"))


def test_command_rank_takes_the_given_port_and_ignores_a_bad_one() -> None:
    from hetrun.runtime.command_rank import command_port, component_env
    from hetrun.runtime.plan_view import plan_from_dict

    view = plan_from_dict({"components": [{"name": "a", "nodes": 1, "tasks_per_node": 1, "ntasks": 1,
                                           "command": ["x"]}]})
    env = component_env({"HETRUN_COMMAND_RANK": "0", "HETRUN_COMMAND_PORT": "41234"}, view, "a", Path("/r"))
    assert env["MASTER_PORT"] == "41234"
    env = component_env({"HETRUN_COMMAND_RANK": "0", "HETRUN_COMMAND_PORT": "99999"}, view, "a", Path("/r"))
    assert env["MASTER_PORT"] == str(command_port(None, 0))
