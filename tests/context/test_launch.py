"""fmesh.launch (real gloo processes from a notebook) and fmesh.simulate (every rank in one process)."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import time

import pytest
import torch
from support import listening, patience, within

import fmesh
from fmesh.context.launch import StartMethod

pytestmark = pytest.mark.slow  # multi-process or subprocess runs: left out of the quick subset (-m "not slow")


def test_launch_returns_every_ranks_result_for_a_locally_defined_function() -> None:
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[3, 0, 2, 1])

    def body(ctx: fmesh.Context) -> tuple[int, tuple[int, ...], float]:  # defined here, like a notebook cell
        total = ctx.all_reduce(torch.tensor([float(ctx.rank)]), mesh, "tp").item()
        return ctx.rank, mesh.group(ctx.rank, "tp"), total

    results = fmesh.launch(body, world_size=4, timeout=60)
    assert [r[0] for r in results] == [0, 1, 2, 3]
    for rank, group, total in results:
        assert total == float(sum(group)) and rank in group
    assert not multiprocessing.active_children()


class Unpicklable(Exception):
    def __init__(self, handle: object) -> None:
        super().__init__("cannot travel")
        self.handle = handle

    def __reduce__(self) -> object:
        raise TypeError("no pickling")


def test_a_failing_rank_raises_its_exception_with_rank_and_traceback() -> None:
    def body(ctx: fmesh.Context) -> int:
        if ctx.rank == 2:
            raise ValueError(f"bad batch on rank {ctx.rank}")
        return ctx.rank

    started = time.monotonic()
    with pytest.raises(ValueError, match="bad batch on rank 2") as caught:
        fmesh.launch(body, world_size=3, timeout=60)
    assert time.monotonic() - started < within(30)
    assert caught.value.rank == 2  # type: ignore[attr-defined]
    cause = caught.value.__cause__
    assert isinstance(cause, fmesh.errors.RemoteTraceback)
    assert "on rank 2" in str(cause) and "in body" in str(cause) and "raise ValueError" in str(cause)
    assert not multiprocessing.active_children()

    def unpicklable(ctx: fmesh.Context) -> None:
        raise Unpicklable(lambda: None)

    with pytest.raises(fmesh.LaunchError, match="rank 0 failed: Unpicklable: cannot travel"):
        fmesh.launch(unpicklable, world_size=1, timeout=60)


def test_a_hang_ends_at_the_timeout_and_leaves_no_process() -> None:
    timeout = patience(3, 2)  # long enough for rank 0 to start and finish (about a second) on a busy machine

    def body(ctx: fmesh.Context) -> None:
        if ctx.rank == 1:
            time.sleep(timeout + 60)  # past the timeout, however far the load stretched it
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"ranks \[1\] did not finish within {timeout}s"):
        fmesh.launch(body, world_size=2, timeout=timeout)
    assert time.monotonic() - started < timeout + within(15)
    assert not multiprocessing.active_children()


def test_return_exceptions_keeps_every_ranks_outcome() -> None:
    def body(ctx: fmesh.Context) -> int:
        # Every rank connected first: a rank that leaves while another is still connecting the default gloo group
        # breaks that connection (gloo's connectFullMesh fails on rank 0, seen once with both cores busy). That
        # start race is the backend's, not what this test is about (the closing note of 2026-11-26 names it).
        ctx.barrier()
        if ctx.rank == 1:
            raise KeyError(f"no batch for rank {ctx.rank}")
        return 10 * ctx.rank

    results = fmesh.launch(body, world_size=3, timeout=60, return_exceptions=True)
    assert results[0] == 0 and results[2] == 20
    assert isinstance(results[1], KeyError) and results[1].rank == 1  # type: ignore[attr-defined]
    assert "raise KeyError" in str(results[1].__cause__)
    assert not multiprocessing.active_children()


def backend_and_timeout(ctx: fmesh.Context) -> tuple[str, int, float]:
    mesh = fmesh.make_mesh((2,), ("dp",))
    timeout = ctx.group(mesh, "dp")._get_backend(torch.device("cpu")).options._timeout
    return ctx.backend, ctx.world_size, timeout.total_seconds()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawned_ranks_get_the_context_options(method: StartMethod) -> None:
    # forkserver: a rank's parent is the fork server, not the launching process (it used to take itself for orphaned)
    results = fmesh.launch(backend_and_timeout, world_size=2, timeout=60, context_options={"timeout": 7},
                           start_method=method)
    assert results == [("gloo", 2, 7.0), ("gloo", 2, 7.0)]

    def local(ctx: fmesh.Context) -> None:
        pass

    with pytest.raises(TypeError, match="must be a module-level function"):
        fmesh.launch(local, world_size=2, start_method=method)


def one_rank_dies(ctx: fmesh.Context) -> str:
    if ctx.rank == 1:
        os._exit(3)
    time.sleep(3)  # the launcher sees rank 1 die meanwhile (it looks every second)
    return "lived on"


def test_a_dead_rank_ends_the_launch_unless_the_others_continue() -> None:
    with pytest.raises(fmesh.LaunchError, match="rank 1 died with exit code 3"):
        fmesh.launch(one_rank_dies, world_size=2, timeout=60)
    first, second = fmesh.launch(one_rank_dies, world_size=2, timeout=60, on_rank_loss="continue")
    assert first == "lived on"
    assert isinstance(second, fmesh.LaunchError) and (second.rank, second.exitcode) == (1, 3), second


def test_launch_rejects_bad_arguments_before_starting_anything() -> None:
    with pytest.raises(ValueError, match="positive int, got 0"):
        fmesh.launch(lambda ctx: None, world_size=0)
    with pytest.raises(TypeError, match="function of one argument"):
        fmesh.launch("not callable", world_size=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"start_method must be one of .*'spawn'.*got 'thread'"):
        fmesh.launch(lambda ctx: None, world_size=2, start_method="thread")
    with pytest.raises(ValueError, match=r"on_rank_loss: expected one of \('fail', 'continue'\), but got 'go on'"):
        fmesh.launch(lambda ctx: None, world_size=2, on_rank_loss="go on")
    with fmesh.Context.fake(2), pytest.raises(RuntimeError, match="already has a default process group"):
        fmesh.launch(lambda ctx: None, world_size=2)


def test_simulate_runs_collectives_for_every_rank() -> None:
    with fmesh.simulate(8) as sim:
        mesh = fmesh.make_mesh((2, 2, 2), ("pp", "dp", "tp"))
        x = sim.per_rank(lambda r: torch.tensor([float(r)]))
        for axes in ("tp", "dp", ("pp", "tp"), ("dp", "tp")):
            total = sim.values(sim.ctx.all_reduce(x, mesh, axes))
            gathered = sim.values(sim.ctx.all_gather(x, mesh, axes))
            for rank in range(8):
                group = mesh.group(rank, axes)
                assert total[rank].item() == sum(group)
                assert gathered[rank].tolist() == [float(g) for g in group]
        with pytest.raises(ValueError, match=r"ranks ascend.*fmesh.launch"):
            sim.ctx.all_reduce(x, mesh, ("tp", "pp"))
        with pytest.raises(ValueError, match="permuted rank map"):
            sim.ctx.all_reduce(x, fmesh.make_mesh((8,), ("dp",), rank_map=[1, 0, 2, 3, 4, 5, 6, 7]), "dp")


def test_simulate_runs_dtensor_on_exported_meshes() -> None:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    with fmesh.simulate(4) as sim:
        mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
        device_mesh = sim.ctx.device_mesh(mesh)
        full = torch.arange(16.0).reshape(4, 4)
        sharded = distribute_tensor(full, device_mesh, [Shard(0), Shard(1)])
        for rank, local in sim.values(sharded.to_local()).items():
            dp, tp = mesh.coordinate(rank)  # type: ignore[misc]
            assert torch.equal(local, full[2 * dp : 2 * dp + 2, 2 * tp : 2 * tp + 2])
        replicated = sharded.redistribute(device_mesh, [Replicate(), Replicate()]).to_local()
        assert all(torch.equal(t, full) for t in sim.values(replicated).values())


START_FROM_ENV = """
import time, torch, fmesh
started = time.monotonic()
try:
    with fmesh.Context.from_env(backend="gloo", timeout=120) as ctx:
        ctx.all_reduce(torch.ones(1), fmesh.make_mesh((2,), ("dp",)), "dp")
    print("ok")
except Exception as error:
    print(f"{type(error).__name__} after {time.monotonic() - started:.1f}s: {error}")
"""


def started_from_env(ranks: list[int], port: int) -> list[str]:
    """What each process started with ``RANK=ranks[i]`` (``WORLD_SIZE=2``, this ``MASTER_PORT``) printed last."""
    import subprocess
    import sys

    environ = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
               "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in ranks:
        procs.append(subprocess.Popen([sys.executable, "-c", START_FROM_ENV], env={**environ, "RANK": str(rank)},
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        # the first hosts the store first: the next starts once something listens at the port (or the first ended)
        deadline = time.monotonic() + patience(60, 2)
        while not listening(port) and procs[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    try:
        return [proc.communicate(timeout=patience(60, 2))[0].strip().splitlines()[-1] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def seconds_of(line: str) -> float:
    return float(line.split(" after ", 1)[1].split("s:", 1)[0])


def test_two_processes_started_with_rank_0_are_told_which_rank_read_what_in_seconds() -> None:
    # It was a raw DistNetworkError (EADDRINUSE) on one, and the other hung for its whole timeout.
    port = importlib.import_module("fmesh.context.launch").free_port()
    first, second = started_from_env([0, 0], port)
    assert second.startswith("LaunchError") and f"MASTER_PORT={port} is in use" in second, second
    assert "another process of this job was also started with RANK=0" in second, second
    assert first.startswith("RankLostError") and "a process of this job could not start" in first, first
    assert f"MASTER_PORT={port} is in use" in first and seconds_of(first) < within(15), first


@pytest.mark.slow  # rank 1 waits out HANDSHAKE_SECONDS (30 s)
def test_a_master_port_held_by_another_program_is_named_on_every_rank_in_seconds() -> None:
    # It was a raw DistNetworkError (EADDRINUSE) on rank 0, and rank 1 hung (90 s and more).
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        rank0, rank1 = started_from_env([0, 1], port)
    assert rank0.startswith("LaunchError") and f"MASTER_PORT={port} is in use" in rank0, rank0
    assert "another program holds it" in rank0 and seconds_of(rank0) < within(15), rank0
    assert rank1.startswith("LaunchError") and "another program holds MASTER_PORT" in rank1, rank1
    # HANDSHAKE_SECONDS (30 s: a client whose DNS does not answer takes 5-10 s to connect to a real store).
    assert f"(127.0.0.1:{port})" in rank1 and seconds_of(rank1) < 30 + within(15), rank1


def test_the_launchers_store_listens_on_an_ipv4_socket_of_loopback_alone() -> None:
    # torch's own socket (IPv6, every interface) saw each client as ::ffff:127.0.0.1 and asked the name server for
    # that name at each connection, on the server's one thread: a dropped query held every rank's operations.
    from fmesh.context.launch import free_port
    from fmesh.context.store.hosting import host_store

    port = free_port()
    store = host_store(port, 1, timeout=10)
    try:
        assert listening(port, ("/proc/net/tcp",)) and not listening(port, ("/proc/net/tcp6",)), port
        with pytest.raises(torch.distributed.DistNetworkError, match=f"could not listen at 127.0.0.1:{port}"):
            host_store(port, 1, timeout=10)  # taken: torch's error, naming the address
        client = torch.distributed.TCPStore("127.0.0.1", port, 1, is_master=False)
        client.set("said", "so")
        assert store.get("said") == b"so"
    finally:
        del store
