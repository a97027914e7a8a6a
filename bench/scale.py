"""Benchmark: thousands of simulated ranks against one real store (issue #27).

    python bench/scale.py            # 128, 256 and 512 ranks (under a minute on 2 cores)
    python bench/scale.py --quick    # 64 and 256 ranks (about 15 s): the smoke run

(``--sizes 1024 4096`` runs more ranks: 4 min 11 s here, 4,096 ranks in 231 s, every phase as expected; past
the 1 s grace each group's first member looks at its members while they wait, so on this machine the agreement's
operations per rank grow with the wait there (docs/benchmarks.md). The default stops at 512, where nobody waits.)

N ranks are N threads of this process, each with its own connections (``store.clone()``) to one real
``TCPStore`` (libuv server), each counting its store operations and the bytes they move (its second connection,
for blocking waits, counts for it too). The server runs in a process of its own, the store's host, whose CPU
time is measured per phase (in this process too it would hold both ends of every connection: 4,096 ranks open
three each, which is more descriptors than this machine allows a process). Each rank runs what a real job's
Context puts through the store, with fmesh's own code, phase after phase (all ranks meet at a barrier between
phases):

1. start: ``fmesh.Context(backend="nccl", init_method="env://", rank=r, world_size=N, meshes=[mesh])`` itself,
   fmesh's whole start code as ``Context.from_env(meshes=[mesh])`` runs it (the start rendezvous carrying the
   agreement on every group of a 5-D mesh (pp, dp_replicate, dp_shard, cp, tp) and the context's options, torch's
   set-up of the default group, the connected check where it connects, the context's epoch, its status board):
   only torch's process-wide default group is simulated, one per thread (:class:`SimulatedTorch`, installed in
   torch: ``init_process_group`` records the rank's store and connects nothing, as NCCL's starts), so what is
   counted is fmesh's own operations, and a step added to the start is counted here too;
2. materialize: the one meeting of every rank on every group of the mesh that ``ctx.materialize(mesh)`` holds
   where the start did not carry them;
3. agree: the agreement (``fmesh.context.store.agreement.agree``) on each group of the mesh that the rank is a
   member of, one per axis, keyed and described as fmesh's groups are (``GroupSpec.digest``, ``describe_group``):
   what groups made on first use cost, with neither;
4. mismatch: every rank agrees on its (dp_shard, cp) group, and in rank 0's group the last member means another
   mesh: every member of that group must get ``MeshMismatchError``, every other rank must succeed;
5. recover: the last rank is lost (it exited: its status says so) and every survivor agrees to recover without it
   (``fmesh.context.store.recovery_vote.agree_on_loss``).

Beside them, for comparison, torch's own start barrier (``_store_based_barrier``, which ``init_process_group``
runs on every rank) by the same threads through the same counting connections.

Then the store's capacity on this machine (many threads doing set/get/add against a fresh server for a few
seconds), a fit of the growth (operations per rank constant, totals linear in N) and an extrapolation to 16,384
and 131,072 ranks against that capacity.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Thousands of connections: torch's C++ warning for each client socket whose host name it cannot look up (this
# machine's DNS) would drown the tables.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
# torch looks up the name of each new connection's peer; where DNS does not answer (this machine), some look-ups
# wait out the resolver's timeout (5 s): one try of one second instead (the store host inherits it).
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import fmesh
from fmesh.context.group_plan import Agenda
from fmesh.context.groups import describe_group
from fmesh.context.options import GroupSettings
from fmesh.context.store import agreement as agreement_protocol
from fmesh.context.store import pulse as pulse_module
from fmesh.context.store import rendezvous as rendezvous_module
from fmesh.context.store import wait as wait_module
from fmesh.context.store.board import Board
from fmesh.context.store.keys import Keys
from fmesh.context.store.records import EXITED
from fmesh.context.store.recovery_vote import FENCED, agree_on_loss
from fmesh.errors import MeshMismatchError

PHASES = ("start", "materialize", "agree", "mismatch", "recover", "torch barrier")
FMESH_PHASES = PHASES[:5]
NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
PREFIX = "fmesh/scale/0"  # a Context's namespace: fmesh/<name>/<epoch>
TIMEOUT = timedelta(seconds=600)
SETTINGS = GroupSettings.of(None, 600, backend="nccl")
BOUND = 16  # store operations per member of one agreement: the bound of tests/context/test_store_operations.py
TARGETS = (16_384, 131_072)
CONNECTING = 128  # ranks that connect at once
# A waiting rank's thread wakes every ABORT_NOTICE_SECONDS (0.1 s) to see whether its context was aborted: no store
# operation, nothing in a real job (a process per rank), but thousands of threads of one process on 2 cores spend
# their time in those wake-ups. Here they wake every 2 s: the store sees the same operations (the watcher's looks
# keep their times); only an abort, which nothing here does, would be noticed later.
POLL_SECONDS = 2.0


def mesh_sizes(world: int) -> tuple[int, ...]:
    """Degrees (pp, dp_replicate, dp_shard, cp, tp) for a power-of-two ``world``, torchtitan-like: tp up to 8, cp
    2, pp up to 4, dp_replicate 2, the rest dp_shard.

    >>> mesh_sizes(64), mesh_sizes(4096)
    ((2, 2, 2, 2, 4), (4, 2, 32, 2, 8))
    """
    if world < 32 or world & (world - 1):
        raise ValueError(f"the world must be a power of two of at least 32, not {world}")
    caps = {"tp": 8, "cp": 2, "pp": 4, "dp_replicate": 2}
    sizes = dict.fromkeys(NAMES, 1)
    left = world
    for name in ("tp", "cp", "pp", "dp_replicate", "tp", "pp", "tp"):
        if left > 2 and sizes[name] < caps[name]:
            sizes[name] *= 2
            left //= 2
    sizes["dp_shard"] = left
    return tuple(sizes[name] for name in NAMES)


def _nbytes(value: object) -> int:
    if isinstance(value, (str, bytes, bytearray)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 8 if isinstance(value, int) else 0


class Tally:
    """Per phase and rank: store operations and bytes (keys, values sent, values received)."""

    def __init__(self, size: int) -> None:
        self.ops = {phase: [0] * size for phase in PHASES}
        self.bytes = {phase: [0] * size for phase in PHASES}
        self.phase = ["start"] * size  # the phase each rank is in (it sets it itself)
        self.lock = threading.Lock()

    def count(self, rank: int, moved: int) -> None:
        # The heartbeat (an add a second per rank, on a connection of its own, from the rank's arrival at the start's
        # meeting) beats as in a job, so the watchers read real heartbeats; it is a steady cost, not a protocol's:
        # left out, so that a phase's count does not grow with its wall time (docs/benchmarks.md states its rate).
        if threading.current_thread().name == Beater.NAME or getattr(BEATING, "now", False):
            return
        with self.lock:
            phase = self.phase[rank]
            if phase not in self.ops:  # the harness's own steps (each rank's context closed at the end)
                return
            self.ops[phase][rank] += 1
            self.bytes[phase][rank] += moved


class RankStore:
    """One simulated rank's connection to the shared store, counting its operations (its clones' too).

    ``spares``: connections the rank opened beforehand, which its clones take first: a real rank opens its
    connections as its code runs, but here opening one can stall on this machine's DNS (a look-up of the peer's
    name, see ``RES_OPTIONS`` above), so the harness opens them all before the first phase ("connect")."""

    def __init__(self, inner: Any, tally: Tally, rank: int, spares: list[Any] | None = None) -> None:
        self.inner, self.tally, self.rank = inner, tally, rank
        self.spares = [] if spares is None else spares

    def clone(self) -> RankStore:
        inner = self.spares.pop() if self.spares else self.inner.clone()
        return RankStore(inner, self.tally, self.rank, self.spares)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        call = getattr(self.inner, name)
        if name in ("set_timeout",):  # changes the client alone and sends the store nothing: not an operation
            return call  # type: ignore[no-any-return]

        def counted(*args: Any, **kwargs: Any) -> Any:
            result = call(*args, **kwargs)
            self.tally.count(self.rank, _nbytes(args) + _nbytes(result))
            return result

        return counted


class PrefixedStore:
    """``dist.PrefixStore`` over a rank's counting connection (torch's takes only its own stores): every key under
    ``prefix/``, each operation one of the connection's."""

    def __init__(self, prefix: str, store: Any) -> None:
        self.prefix, self.underlying_store = prefix, store

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def clone(self) -> PrefixedStore:
        return PrefixedStore(self.prefix, self.underlying_store.clone())

    def set_timeout(self, timeout: timedelta) -> None:
        self.underlying_store.set_timeout(timeout)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        call = getattr(self.underlying_store, name)

        def prefixed(first: Any, *args: Any, **kwargs: Any) -> Any:
            keys = [self._key(k) for k in first] if isinstance(first, list) else self._key(first)
            return call(keys, *args, **kwargs)

        return prefixed


class SimulatedTorch(threading.local):
    """torch's process-wide default group, one per simulated rank (thread), installed in torch itself (fmesh's code
    is not touched): ``init_process_group`` records the store the rank's start handed it and connects nothing
    (torch's own set-up, which is not fmesh's, sends the store nothing here), and ``is_initialized``, ``get_rank``,
    ``get_world_size``, ``get_backend`` and the default store answer for the calling thread's rank; the default
    group is bound to no device (NCCL's lazy start). The job's store is the rank's counting connection
    (``rendezvous.open_store``, the one function of fmesh's replaced). Everything else is fmesh's code as a real
    start runs it."""

    store: Any = None  # the rank's connection to the job's store (what open_store gives it)
    size = 0
    default: Any = None  # the default group's store, once "initialised"
    backend = ""
    rank = -1

    def install(self) -> None:
        local = self

        def init_process_group(*, backend: str, rank: int, world_size: int, store: Any, **_: Any) -> None:
            local.default, local.backend, local.rank, local.size = store, backend, rank, world_size

        def open_store(environ: Any, rank: int | None, world_size: int | None, timeout: timedelta) -> Any:
            assert rank is not None and world_size is not None
            return local.store, rank, world_size

        dist.PrefixStore = PrefixedStore  # type: ignore[misc,assignment]  # fmesh's reads of it too (root_store)
        dist.is_initialized = lambda: local.default is not None
        dist.init_process_group = init_process_group  # type: ignore[assignment]
        dist.get_rank = lambda group=None: local.rank
        dist.get_world_size = lambda group=None: local.size
        dist.get_backend = lambda group=None: local.backend  # type: ignore[assignment,return-value]
        c10d._get_default_store = lambda: local.default
        c10d._get_default_group = lambda: None  # bound to no device
        c10d._set_pg_timeout = lambda timeout, group=None: None  # the simulated group: its timeout raised after it
        rendezvous_module.open_store = open_store  # type: ignore[assignment]
        beater = Beater()
        pulse_module.Pulse.start = lambda pulse, first=True, soon=False: beater.start(pulse)  # type: ignore[method-assign]


BEATING = threading.local()  # now: this thread beats a heartbeat (not counted)


class Beater:
    """Every simulated rank's heartbeat, beaten by one thread: a pulse's own thread per rank (thousands of threads
    of one process waking each second) slowed a start of 1,024 ranks from 3 s to 42 s on 2 cores, all in the
    interpreter's lock. Each pulse started (:class:`fmesh.context.store.pulse.Pulse`, its ``start`` replaced) beats at
    once on the rank's thread, as a pulse's own thread does within milliseconds (queued to this thread, the first
    beats came seconds late in a slow start, and the watchers searched for the places not beaten yet: 721 operations
    for one rank), then once a round on this thread, on its own connection, until it is stopped; its operations are
    not counted."""

    NAME = "bench-heartbeats"

    def __init__(self) -> None:
        self.pulses: list[pulse_module.Pulse] = []
        self.fresh: list[pulse_module.Pulse] = []
        self.lock = threading.Lock()
        self.woken = threading.Event()
        threading.Thread(target=self._run, name=self.NAME, daemon=True).start()

    def start(self, pulse: pulse_module.Pulse) -> pulse_module.Pulse:
        BEATING.now = True
        try:
            self._beat([pulse])  # its first beat, at once
        finally:
            BEATING.now = False
        with self.lock:
            self.fresh.append(pulse)
        return pulse

    @staticmethod
    def _beat(pulses: list[pulse_module.Pulse]) -> None:
        for pulse in pulses:
            try:
                pulse.beat()
            except Exception:  # its connection closed (its rank's context closed): it stops
                pulse.stopped.set()

    def _run(self) -> None:
        next_round = time.monotonic() + pulse_module.PULSE_SECONDS
        while True:
            self.woken.wait(max(0.0, next_round - time.monotonic()))
            self.woken.clear()
            with self.lock:
                fresh, self.fresh = self.fresh, []
                self.pulses = [pulse for pulse in self.pulses + fresh if not pulse.stopped.is_set()]
                pulses = list(self.pulses)
            if time.monotonic() >= next_round:
                self._beat(pulses)
                next_round = time.monotonic() + pulse_module.PULSE_SECONDS


SIMULATED = SimulatedTorch()


SERVE = """
import sys
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=600), wait_for_workers=False, use_libuv=True)
print(store.port, flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
"""


class Host:
    """The store's host: a process of its own running one ``TCPStore`` server (libuv), as a job's store host is
    (rank 0's process, or torchrun's agent); its CPU time is the load the store puts on that host."""

    def __init__(self) -> None:
        env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
        self.process = subprocess.Popen([sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
        assert self.process.stdout is not None
        port = int(self.process.stdout.readline())
        self.clients = [dist.TCPStore("127.0.0.1", port, None, False, TIMEOUT, use_libuv=True)]

    def connect(self) -> dist.Store:
        """A new connection to the store."""
        return self.clients[0].clone()

    def cpu(self) -> float:
        """CPU seconds the host's process has used (user + system)."""
        with open(f"/proc/{self.process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.clients.clear()
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def _rss() -> int:
    """This process's resident memory, in bytes (Linux: /proc/self/statm; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def simulate(size: int) -> dict[str, Any]:
    """Run the five phases (and torch's barrier) with ``size`` simulated ranks; per-phase times, counts, outcomes."""
    sizes = mesh_sizes(size)
    mesh = fmesh.make_mesh(sizes, NAMES)
    host = Host()
    tally = Tally(size)
    stores: list[RankStore] = []
    # A few connect at once: thousands at once overflow the server's backlog, and the clients' retries pile up
    # half-open sockets in this one process (a job's ranks are processes of their own, on hosts of their own).
    connecting = threading.Semaphore(CONNECTING)
    gate = threading.Barrier(size + 1)
    outcome: dict[str, list[str]] = {phase: ["?"] * size for phase in PHASES}
    lost = size - 1
    odd_group = mesh.group(0, ("dp_shard", "cp"))
    odd_rank = odd_group[-1]
    agenda = Agenda.of([mesh], SETTINGS)  # what Context.from_env(meshes=[mesh]) and ctx.materialize(mesh) compare

    def group(rank: int, axes: tuple[str, ...], mesh_of: fmesh.Mesh = mesh) -> tuple[str, tuple[int, ...], str, str]:
        members = tuple(mesh_of.group(rank, axes))
        spec = SETTINGS.spec(axes, members)
        what = f"the group {list(members[:8])} along {axes}"
        return spec.digest(), members, describe_group(mesh_of, axes, spec), what

    odd_mesh = fmesh.make_mesh(sizes, ("pp", "dp_replicate", "dp_shard", "cp", "tensor"))  # another name: a mismatch

    def run(rank: int, phase: str, step: Callable[[], object]) -> None:
        gate.wait()  # the phase begins (the first: every rank connected)
        tally.phase[rank] = phase
        try:
            step()
            outcome[phase][rank] = "ok"
        except Exception as error:  # recorded: the table says what each rank got
            outcome[phase][rank] = type(error).__name__
        gate.wait()

    def rank_main(rank: int) -> None:
        with connecting:  # three connections, as a rank opens: its own, the start's waiter, its Context's waiter
            store = RankStore(host.connect(), tally, rank, [host.connect() for _ in range(2)])
        stores.append(store)
        agreement = Board(store, PREFIX, rank, TIMEOUT)  # type: ignore[arg-type]
        held: dict[str, int] = {}  # each group this rank holds: how many of its members survive the loss
        started: list[fmesh.Context] = []  # the rank's Context, once it started

        def start() -> None:
            SIMULATED.store = store
            started.append(fmesh.Context(backend="nccl", init_method="env://", rank=rank, world_size=size,
                                         name="scale", timeout=TIMEOUT, creation_timeout=TIMEOUT, meshes=[mesh]))

        def materialize() -> None:
            agreement_protocol.agree(agreement, "meeting-all-1", range(size), agenda.description, "the mesh")

        def agree() -> None:
            for axis in NAMES:
                key, members, description, what = group(rank, (axis,))
                if len(members) > 1:  # fmesh makes no group of one
                    agreement_protocol.agree(agreement, key, members, description, what)
                    held[key] = sum(member != lost for member in members)

        def mismatch() -> None:
            key, members, description, what = group(rank, ("dp_shard", "cp"))
            if rank == odd_rank:  # this rank built its mesh with another axis name
                description = group(rank, ("dp_shard", "cp"), odd_mesh)[2]
            try:
                agreement_protocol.agree(agreement, key, members, description, what)
            except MeshMismatchError:
                agreement.post("running")  # the job goes on (its next step would post so): recovery needs it
                raise
            finally:
                if rank == lost:  # the lost rank's process ends now; at exit it posts that it exited
                    agreement.post(EXITED)

        def recover() -> None:
            if rank == lost:
                raise LookupError("lost")  # it is gone: it does nothing
            holders = agree_on_loss(agreement, range(size - 1), [lost], list(held))
            if holders != held:  # every surviving member of each group holds it
                raise AssertionError(f"rank {rank}: wrong holders {holders}, expected {held}")

        def torch_barrier() -> None:
            c10d._store_based_barrier(rank, store, "scale", size, TIMEOUT)  # type: ignore[arg-type]

        for phase, step in zip(PHASES, (start, materialize, agree, mismatch, recover, torch_barrier), strict=True):
            run(rank, phase, step)
        tally.phase[rank] = "end"  # not counted: the rank's context closed (its exit hook and connections go)
        SIMULATED.default = None  # torch's default group is the harness's: nothing of torch's to destroy
        for context in started:
            context.close()

    threads = [threading.Thread(target=rank_main, args=(rank,), name=f"rank-{rank}", daemon=True)
               for rank in range(size)]
    gc.collect()
    resident = peak = _rss()  # before the ranks: what each adds is its thread, its connections and fmesh's state
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    seconds: dict[str, float] = {}
    host_cpu: dict[str, float] = {}
    connect = 0.0
    for phase in PHASES:
        gate.wait()
        began, cpu = time.perf_counter(), host.cpu()
        if phase == PHASES[0]:  # every rank connected (two connections each), in parallel as a job's ranks do
            connect = began - started
        gate.wait()
        seconds[phase] = time.perf_counter() - began
        peak = max(peak, _rss())
        host_cpu[phase] = host.cpu() - cpu
        print(f"  {size:,} ranks: {phase} {seconds[phase]:.1f}s", file=sys.stderr, flush=True)
    for thread in threads:
        thread.join()
    fenced = host.clients[0].get(Keys(PREFIX).fate(lost)).decode()
    expected = {
        "mismatch": {rank: "MeshMismatchError" if rank in odd_group else "ok" for rank in range(size)},
        "recover": {rank: "LookupError" if rank == lost else "ok" for rank in range(size)},
    }
    as_expected = {phase: all(outcome[phase][rank] == expected.get(phase, {}).get(rank, "ok") for rank in range(size))
                   for phase in PHASES}
    for connection in stores:  # closed now: the next size needs the descriptors
        del connection.inner
        connection.spares.clear()
    gc.collect()
    host.close()
    return {
        "ranks": size, "mesh": dict(zip(NAMES, sizes, strict=True)), "connect_s": connect, "seconds": seconds,
        "host_cpu_s": host_cpu, "memory_per_rank": (peak - resident) / size,
        "ops": tally.ops, "bytes": tally.bytes, "as_expected": as_expected, "lost_rank_fenced": fenced == FENCED,
        "mismatched_group": list(odd_group), "groups_per_rank": sum(1 for s in sizes if s > 1),
        "outcomes": {phase: sorted(set(outcome[phase])) for phase in PHASES},
        "mismatch_errors": sum(1 for r in outcome["mismatch"] if r == MeshMismatchError.__name__),
    }


def capacity(seconds: float, threads: int = 32, windows: int = 3) -> dict[str, float]:
    """Operations per second a fresh server answers to ``threads`` client threads of this process doing set, get
    and add on keys of their own: the best of ``windows`` runs of ``seconds`` each (the machine is shared; the best
    is the least disturbed). A lower bound of the server's own capacity: its clients share this machine's cores."""
    host = Host()
    clients = [host.connect() for _ in range(threads)]
    rates: list[float] = []
    per_cpu: list[float] = []
    for _ in range(windows):
        done = [0] * threads
        stop = time.perf_counter() + seconds

        def hammer(index: int, done: list[int] = done, stop: float = stop) -> None:
            store, key, count = clients[index], f"cap/{index}", 0
            while time.perf_counter() < stop:
                store.set(key, "x" * 64)
                store.get(key)
                store.add(f"{key}/n", 1)
                count += 3
            done[index] = count

        began, cpu = time.perf_counter(), host.cpu()
        workers = [threading.Thread(target=hammer, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        rates.append(sum(done) / (time.perf_counter() - began))
        per_cpu.append(sum(done) / max(host.cpu() - cpu, 1e-3))
    clients.clear()
    host.close()
    return {"threads": threads, "seconds": seconds, "windows": windows, "ops_per_s": max(rates),
            "all_ops_per_s": rates, "ops_per_host_cpu_s": max(per_cpu)}


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares ``y = a + b x`` and the exponent ``k`` of ``y ~ x^k`` (log-log): (a, b, k)."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    mlx, mly = statistics.mean(lx), statistics.mean(ly)
    k = sum((x - mlx) * (y - mly) for x, y in zip(lx, ly, strict=True)) / sum((x - mlx) ** 2 for x in lx)
    return my - b * mx, b, k


def model(rows: list[dict[str, Any]], store_ops: float) -> dict[str, Any]:
    """Per phase: operations per rank (mean over sizes), the fits of total operations, bytes and time against N,
    and the extrapolation to :data:`TARGETS`."""
    ns = [row["ranks"] for row in rows]
    out: dict[str, Any] = {}
    for phase in PHASES:
        total_ops = [sum(row["ops"][phase]) for row in rows]
        total_bytes = [sum(row["bytes"][phase]) for row in rows]
        times = [row["seconds"][phase] for row in rows]
        per_rank = statistics.mean(t / n for t, n in zip(total_ops, ns, strict=True))
        _, ops_slope, ops_k = fit(ns, total_ops)
        _, _, bytes_k = fit(ns, total_bytes)
        time_a, time_b, time_k = fit(ns, times)
        bytes_per_rank_last = total_bytes[-1] / ns[-1]
        at = {}
        for n in TARGETS:
            ops = per_rank * n
            nbytes = bytes_per_rank_last * n * (n / ns[-1]) ** max(0.0, bytes_k - 1)
            harness = max(time_a + time_b * n, times[-1])
            at[n] = {"ops": ops, "bytes": nbytes, "harness_s": harness, "store_busy_s": ops / store_ops,
                     "load_over_harness_time": ops / harness / store_ops}
        out[phase] = {"ops_per_rank": per_rank, "ops_slope": ops_slope, "ops_exponent": ops_k,
                      "bytes_exponent": bytes_k, "time_a": time_a, "time_b": time_b, "time_exponent": time_k, "at": at}
    return out


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def report(rows: list[dict[str, Any]], cap: dict[str, float], fits: dict[str, Any]) -> None:
    print("### Per phase and size: wall time, store operations per rank, bytes per rank, load on the store host\n")
    print("| ranks | mesh (pp, dpr, dps, cp, tp) | phase | wall s | ops/rank max | ops/rank mean | ops/rank per "
          "agreement, max | bytes/rank mean | store ops/s | % of capacity | host CPU % | host µs/op | outcome |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        n = row["ranks"]
        for phase in PHASES:
            ops, nbytes, seconds = row["ops"][phase], row["bytes"][phase], row["seconds"][phase]
            agreements = row["groups_per_rank"] if phase == "agree" else 1
            rate = sum(ops) / seconds
            shape = "×".join(str(s) for s in row["mesh"].values())
            ended = ("as expected" if row["as_expected"][phase] else "UNEXPECTED " + ",".join(row["outcomes"][phase]))
            if phase == "mismatch" and row["as_expected"][phase]:
                ended = f"{row['mismatch_errors']} MeshMismatchError (the group), the rest ok"
            if phase == "recover" and row["as_expected"][phase]:
                ended = f"{n - 1} survivors ok, lost rank {'fenced' if row['lost_rank_fenced'] else 'NOT fenced'}"
            print(f"| {n:,} | {shape} | {phase} | {seconds:.2f} | {max(ops)} | {statistics.mean(ops):.1f} | "
                  f"{math.ceil(max(ops) / agreements)} | {statistics.mean(nbytes):,.0f} | {rate:,.0f} | "
                  f"{100 * rate / cap['ops_per_s']:.1f} | {100 * row['host_cpu_s'][phase] / seconds:.0f} | "
                  f"{1e6 * row['host_cpu_s'][phase] / max(sum(ops), 1):.0f} | {ended} |")
    memory = ", ".join(f"{row['ranks']:,} ranks {row['memory_per_rank'] / 1024:,.0f} KiB" for row in rows)
    print(f"\nmemory per rank (this process's peak resident memory over the phases, less what it held before the "
          f"ranks started, divided by the ranks: a rank's thread, its three store connections and fmesh's state): "
          f"{memory}")
    opened = ", ".join(f"{row['ranks']:,} ranks in {row['connect_s']:.1f}s" for row in rows)
    print(f"\nconnect: {opened} (three connections per rank, {CONNECTING} ranks at a time, before the first phase)")
    print(f"\n### The store's capacity here\n\n{cap['threads']} client threads of this process, each set + get + add "
          f"on keys of its own, the best of {cap['windows']} runs of {cap['seconds']:g}s "
          f"({', '.join(f'{r:,.0f}' for r in cap['all_ops_per_s'])}): **{cap['ops_per_s']:,.0f} operations/s** "
          "(a lower bound: the clients and the store's host share this machine's cores); per CPU second of the "
          f"host's process: {cap['ops_per_host_cpu_s']:,.0f} operations\n")
    print("### Model: fits against N, and the extrapolation\n")
    print("| phase | ops/rank (mean) | total ops ~ N^k | bytes ~ N^k | wall s here ≈ a + b·N | "
          + " | ".join(f"{n:,}: total ops | store busy s | spread for 10% (s) | bytes | wall s here" for n in TARGETS)
          + " |")
    print("| --- | ---: | ---: | ---: | --- | " + " | ".join("---: | ---: | ---: | ---: | ---:" for _ in TARGETS)
          + " |")
    for phase in PHASES:
        f = fits[phase]
        cells = " | ".join(
            f"{_fmt(a['ops'])} | {a['store_busy_s']:.1f} | {10 * a['store_busy_s']:,.0f} | {_megabytes(a['bytes'])} | "
            f"{a['harness_s']:,.0f}" for a in (f["at"][n] for n in TARGETS))
        print(f"| {phase} | {f['ops_per_rank']:.1f} | {f['ops_exponent']:.2f} | {f['bytes_exponent']:.2f} | "
              f"{f['time_a']:.2f} + {f['time_b'] * 1000:.3f} ms·N | {cells} |")
    print("\n### A start against torch's start barrier, in store operations per rank (mean)\n")
    print("| ranks | start carrying the mesh | start, then materialize | start, then each group on first use | "
          "torch's barrier | carrying / torch | materialize / torch | first use / torch |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        mean = {phase: statistics.mean(row["ops"][phase]) for phase in PHASES}
        ways = (mean["start"], mean["start"] + mean["materialize"], mean["start"] + mean["agree"])
        barrier = mean["torch barrier"]
        print(f"| {row['ranks']:,} | {ways[0]:.1f} | {ways[1]:.1f} | {ways[2]:.1f} | {barrier:.1f} | "
              + " | ".join(f"{way / barrier:.1f}x" for way in ways) + " |")
    n = TARGETS[0]
    start = fits["start"]["at"][n]["ops"]
    busy = start / cap["ops_per_s"]
    spread = fits["start"]["at"][n]["harness_s"]
    torch_ops = fits["torch barrier"]["at"][n]["ops"]
    share = busy / spread
    print("\nstore busy s: the phase's operations at the measured capacity; spread for 10%: how long the ranks' "
          "arrival must be spread for the store host to stay under 10% of that capacity; wall s here: the phase "
          "on this machine, extrapolated (its simulated ranks arrive as fast as 2 cores drive them).")
    print(f"\nAt {n:,} ranks a start (fmesh's whole start: the rendezvous carrying the agreement on every group of "
          f"the 5-D mesh and the context's options, then the context's board) puts "
          f"{start:,.0f} operations through the store: {busy:.1f}s of its measured capacity. Assuming the ranks "
          f"arrive as fast as here (the start extrapolated to {spread:,.0f}s), the store host runs at "
          f"{100 * share:.0f}% of that capacity ({'under' if share < 0.10 else 'OVER'} 10%); it stays under 10% "
          f"when the arrivals are spread over at least {10 * busy:,.0f}s. torch's own start barrier costs "
          f"{torch_ops:,.0f} operations at that size: fmesh's start puts {start / torch_ops:.1f}x as many through "
          "the store as torch's barrier, at whatever rate the ranks arrive.")


def _megabytes(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.0f} MB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="64 and 256 ranks (a smoke run)")
    parser.add_argument("--sizes", type=int, nargs="+", help="the numbers of ranks (powers of two, at least 32)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    sizes = args.sizes or ([64, 256] if args.quick else [128, 256, 512])
    if len(sizes) < 2:
        parser.error("give at least two sizes: the model is a fit")
    threading.stack_size(256 * 1024)  # thousands of threads: each with a small stack
    wait_module.ABORT_NOTICE_SECONDS = POLL_SECONDS  # see POLL_SECONDS
    SIMULATED.install()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}\n")
    rows = []
    for size in sizes:
        began = time.perf_counter()
        rows.append(simulate(size))
        print(f"{size:,} ranks simulated in {time.perf_counter() - began:.1f}s", file=sys.stderr, flush=True)
    cap = capacity(0.5 if args.quick else 2.0)
    fits = model(rows, cap["ops_per_s"])
    report(rows, cap, fits)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "capacity": cap, "model": fits}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
