"""Two torchrun agents on this machine act as two nodes; one is killed mid-run; the other goes on alone.

    python examples/elastic_torchrun.py --steps 16 --kill-at 8

Each agent runs ``examples/train.py --elastic`` on 2 gloo processes (``torchrun --nnodes 1:2
--nproc-per-node 2``, c10d rendezvous on 127.0.0.1), a 4-rank data-parallel job. The rendezvous store is
hosted by this script, outside both nodes, as a real cluster hosts it outside the ranks: were it hosted by an
agent, losing that agent's node would take the store with it and end the job. Once the job has
checkpointed step ``--kill-at``, the second agent and its processes are killed (SIGKILL). The first
agent's processes fail in their next collective; torchrun restarts them, the rendezvous closes with
the one node left, and ``train.py`` resumes from the last checkpoint, resharded over 2 ranks
(``fmesh.ParallelDims`` for the smaller world). The first agent's output is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import torch.distributed

from fmesh.context.launch import free_port

HERE = pathlib.Path(__file__).resolve().parent


def agent(port: int, directory: pathlib.Path, steps: int, name: str) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "fmesh-elastic",
        "--rdzv-conf", "last_call_timeout=5,join_timeout=60,is_host=false", "--max-restarts", "2",
        "--monitor-interval", "0.5",
        str(HERE / "train.py"), "--backend", "gloo", "--elastic", "--steps", str(steps), "--checkpoint-dir",
        str(directory / "ckpt"), "--checkpoint-every", "2", "--log-every", "1", "--seq-len", "16", "--dim", "32",
        "--losses-to", str(directory / f"{name}.json"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # Its own session: killing the agent's process group kills its workers too, as losing the node would.
    with open(directory / f"{name}.log", "w") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)


def family(pid: int) -> list[int]:
    """``pid`` and every process under it (Linux ``/proc``): torchrun starts each worker in a session of its own,
    so killing the agent's process group would leave its workers running."""
    parents: dict[int, int] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def checkpointed(directory: pathlib.Path) -> int:
    try:
        return int(json.loads((directory / "ckpt" / "fmesh.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--kill-at", type=int, default=8, help="kill the second node once this step is checkpointed")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        directory = pathlib.Path(scratch)
        port = free_port()
        # The store outlives either node (both agents are told is_host=false): when both agents may host it,
        # whichever binds the port first does, and on a loaded machine that can be the node this script kills.
        store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        first = agent(port, directory, args.steps, "first")
        second = agent(port, directory, args.steps, "second")
        deadline = time.monotonic() + args.timeout
        try:
            while checkpointed(directory) < args.kill_at:
                if time.monotonic() > deadline or first.poll() is not None:
                    raise RuntimeError(f"the job ended or stalled before checkpointing step {args.kill_at}")
                time.sleep(0.1)
            for pid in family(second.pid):  # the node is lost: its agent and its processes, at once
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed = time.time()
            print(f"killed the second node (agent {second.pid} and its processes) after step {args.kill_at}",
                  flush=True)
            first.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for proc in (first, second):
                for pid in family(proc.pid) if proc.poll() is None else []:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                proc.wait()
            print((directory / "first.log").read_text())
        print(f"the first node finished {time.time() - killed:.1f} s after the second was killed; "
              f"exit code {first.returncode}")
        del store
        return first.returncode


if __name__ == "__main__":
    sys.exit(main())
