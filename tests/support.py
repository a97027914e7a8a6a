"""Helpers shared by the tests (and by ``bench/group_creation.py`` and ``bench/gpu_check.py``): one launch wrapper
for the multi-process tests, timeouts that stretch with the machine's load, the leak check of the failure guide's
scenarios (:func:`nothing_left_behind`), a store that counts what each caller moves, and the answers collectives must
give along a group (an oracle computed from the group's ranks alone)."""

from __future__ import annotations

import gc
import itertools
import json
import multiprocessing
import os
import pathlib
import pickle
import random
import select
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import pytest
import strict_nccl
import torch
import torch.distributed as dist

import fmesh
from fmesh import Context, Mesh

strict_nccl.install()  # in every process a multi-process test starts: NCCL's rules on each rank (strict_nccl.py)

T = TypeVar("T")


def slowdown() -> float:
    """How many times longer than on a free core work takes in this process now: the one measured figure of the
    machine's speed that every time bound of the tests is scaled by (1.0 when a core is free for it).

    It is measured, not guessed from the load average: a fixed 0.1 s of this thread's CPU work is timed on the wall
    clock, and the ratio is how much of a core this process gets (three busy loops per core give about 3.5 on two
    cores; a test run under ``nice`` sees its own lower share). A bound covers time already spent (a test's run, then
    its assertion), so the figure is the largest measured in the last minute or so: one is taken at most every 30 s,
    when asked for, and those of the two periods before count too. ``FMESH_TEST_SLOWDOWN`` pins it (to replay a run).

    >>> slowdown() >= 1.0
    True
    """
    pinned = os.environ.get("FMESH_TEST_SLOWDOWN")
    if pinned:
        return float(pinned)
    period = int(time.monotonic() // SLOWDOWN_PERIOD)
    if period not in _MEASURED:
        _MEASURED[period] = _measured_slowdown()
    return max(figure for at, figure in _MEASURED.items() if at >= period - 2)


SLOWDOWN_PERIOD = 30  # seconds: at most one measure of the slowdown in each
SLOWDOWN_PROBE = 0.1  # seconds of CPU work the measure times
_MEASURED: dict[int, float] = {}  # this process's measured slowdowns by period (the one cache of this module)


def _measured_slowdown() -> float:
    """The wall time of :data:`SLOWDOWN_PROBE` seconds of this thread's CPU work, over that CPU time (at least 1)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    while time.thread_time() - cpu < SLOWDOWN_PROBE:
        pass
    return max(1.0, (time.perf_counter() - wall) / (time.thread_time() - cpu))


def within(seconds: float) -> float:
    """A bound of ``seconds`` that a test asserts (a promise of the product, such as "a death is named within 7 s",
    measured on a quiet 2-core machine), scaled by this machine's :func:`slowdown` now.

    >>> within(7) >= 7
    True
    """
    return seconds * slowdown()


def patience(seconds: float, processes: int = 1) -> float:
    """``seconds`` on a quiet machine, stretched for ``processes`` new processes on this machine as busy as it is
    now: a guard against hangs, not a speed target.

    A quiet machine running the suite has one process per core but one besides the test's own (the other pytest
    workers): each of the ``processes`` gets ``cpus / (cpus - 1 + processes)`` of a core there. The
    :func:`slowdown` ``s`` says that ``cpus * s - 1`` others compete now: each gets ``cpus / (cpus * s - 1 +
    processes)``, and the guard is stretched by the ratio (``s`` itself for one process; 1 on a quiet machine).

    >>> patience(10, processes=1) >= 10
    True
    """
    cpus = os.cpu_count() or 1
    others = cpus * slowdown() - 1
    return seconds * max(1.0, (others + processes) / (cpus - 1 + processes))


def launch(fn: Callable[[Context], Any], world: int, timeout: float = 60, context_timeout: float | None = None,
           on_rank_loss: str = "fail", **options: Any) -> list[Any]:
    """Every rank's result (or, for a failing rank, its exception) of ``fn`` on ``world`` forked gloo processes.

    ``timeout`` bounds the whole launch and stretches with the load (:func:`patience`); so does the Context's
    collective timeout unless the test sets it (a test that times something sets what it times). ``on_rank_loss``
    goes to :func:`fmesh.launch`.
    """
    bound = patience(timeout, world)
    context = {"timeout": patience(60, world) if context_timeout is None else context_timeout, **options}
    return fmesh.launch(fn, world, timeout=bound, context_options=context, return_exceptions=True,
                        on_rank_loss=on_rank_loss)


def open_fds() -> int:
    """How many file descriptors this process holds open."""
    return len(os.listdir("/proc/self/fd"))


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def listening(port: int, tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")) -> bool:
    """Whether a socket of this machine listens at TCP ``port`` (read from ``/proc/net``, so nothing connects to it;
    ``tables``: IPv4's and IPv6's).

    >>> listening(0)
    False
    """
    for table in tables:
        try:
            with open(table) as rows:
                for row in itertools.islice(rows, 1, None):
                    local, state = row.split()[1], row.split()[3]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                        return True
        except OSError:
            continue
    return False


def world_size(ctx: Context) -> int:
    return ctx.world_size


@pytest.fixture(scope="session")
def launched_once() -> None:
    """A first launch opens a pipe that multiprocessing keeps for the process's life: not a scenario's leak."""
    assert fmesh.launch(world_size, 1, timeout=60) == [1]


@pytest.fixture
def nothing_left_behind(launched_once: None) -> Iterator[None]:
    """After a scenario: no child process, no extra thread, no extra file descriptor in the test process
    (docs/guides/failures.md says so of every scenario). A module of the guide's scenarios asks for it with
    ``pytestmark = pytest.mark.usefixtures("nothing_left_behind")``; conftest.py makes it visible to every module."""
    threads, fds = threading.active_count(), open_fds()
    yield
    deadline = time.monotonic() + patience(5)  # a queue's feeder thread takes a moment to finish
    while time.monotonic() < deadline and (threading.active_count() > threads or open_fds() > fds
                                           or multiprocessing.active_children()):
        gc.collect()  # a store connection in an unreachable cycle is closed by the collector: not held, not a leak
        time.sleep(0.05)
    assert not multiprocessing.active_children(), multiprocessing.active_children()
    assert threading.active_count() <= threads, [t.name for t in threading.enumerate()]
    assert open_fds() <= fds, (fds, open_fds(), sorted(os.listdir("/proc/self/fd")))


def timed(call: Callable[[], Any]) -> tuple[str, float, str]:
    """What ``call()`` raised (or ``ok``), after how many seconds, and its message (a scenario's outcome)."""
    started = time.monotonic()
    try:
        result = call()
    except Exception as error:
        return type(error).__name__, time.monotonic() - started, str(error)
    return "ok", time.monotonic() - started, repr(result)


def succeeded(results: list[Any]) -> list[Any]:
    """``results``, once no rank failed (a failure is raised with its rank's traceback)."""
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def in_threads(fn: Callable[[int], None], ranks: Sequence[int], timeout: float = 60) -> None:
    """``fn(rank)`` for every rank of ``ranks``, each in a thread of this process, all at once; fails when one is
    still running after ``timeout`` seconds (a hang), stretched by :func:`patience`."""
    timeout = patience(timeout)
    threads = [threading.Thread(target=fn, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    hung = [rank for rank, thread in zip(ranks, threads, strict=True) if thread.is_alive()]
    assert not hung, f"ranks {hung} hung"


class CountingStore(dist.Store):
    """A store that forwards to ``inner`` (an in-process one by default) and counts, per calling thread, the
    distinct keys it touches, the bytes it moves and its operations."""

    def __init__(self, inner: dist.Store | None = None) -> None:
        super().__init__()
        self.inner = dist.HashStore() if inner is None else inner
        self.keys: dict[int, set[str]] = defaultdict(set)
        self.bytes: dict[int, int] = defaultdict(int)
        self.ops = 0

    @property
    def all_keys(self) -> set[str]:
        """Every key touched, by any thread."""
        return set().union(*self.keys.values())

    @property
    def all_bytes(self) -> int:
        """Every byte moved, by any thread."""
        return sum(self.bytes.values())

    def _touch(self, keys: Sequence[str], moved: int = 0) -> None:
        me = threading.get_ident()
        self.ops += 1
        self.keys[me].update(keys)
        self.bytes[me] += moved + sum(len(k) for k in keys)

    def set(self, key: str, value: str | bytes) -> None:
        self._touch([key], len(value))
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        value = self.inner.get(key)
        self._touch([key], len(value))
        return bytes(value)

    def add(self, key: str, amount: int) -> int:
        self._touch([key], 8)
        return int(self.inner.add(key, amount))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        value = self.inner.compare_set(key, expected, desired)
        self._touch([key], len(expected) + len(desired) + len(value))
        return bytes(value)

    def append(self, key: str, value: str | bytes) -> None:
        self._touch([key], len(value))
        self.inner.append(key, value)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._touch(keys)
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        self._touch(keys)
        return bool(self.inner.check(keys))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        values = [bytes(v) for v in self.inner.multi_get(keys)]
        self._touch(keys, sum(map(len, values)))
        return values

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._touch(keys, sum(map(len, values)))
        self.inner.multi_set(keys, values)

    def delete_key(self, key: str) -> bool:
        self._touch([key])
        return bool(self.inner.delete_key(key))

    def num_keys(self) -> int:
        return int(self.inner.num_keys())

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)


def collective_inputs(rank: int, n: int, device: Any = "cpu") -> dict[str, torch.Tensor]:
    """What rank ``rank`` sends into each collective checked by :func:`collective_answers` (``n``: group size)."""
    return {
        "all_reduce": torch.tensor([float(rank), 1.0], device=device),
        "all_gather": torch.tensor([rank], device=device),
        "reduce_scatter": torch.arange(n * 2, dtype=torch.float, device=device).reshape(n, 2) + 100 * rank,
        "broadcast": torch.tensor([rank], device=device),
        "all_to_all": torch.tensor([1000 * rank + i for i in range(n)], device=device),
    }


def collective_answers(rank: int, group: Sequence[int]) -> dict[str, list[Any]]:
    """What ``rank`` must receive from each collective along ``group`` (its ranks in group order) given the
    :func:`collective_inputs`, computed from the group alone; ``broadcast`` is from the last member.

    >>> collective_answers(1, (3, 1))["all_to_all"]
    [3001, 1001]
    """
    n, me = len(group), list(group).index(rank)
    return {
        "all_reduce": [float(sum(group)), float(n)],
        "all_gather": list(group),
        "reduce_scatter": [[float(sum(2 * me + k + 100 * r for r in group)) for k in range(2)]],
        "broadcast": [group[-1]],
        "all_to_all": [1000 * r + me for r in group],
    }


# ------------------------------------------------------- meshes the Context tests share

MESHES = {
    4: [((2, 2), ("dp", "tp"), None), ((2, 2), ("dp", "tp"), [3, 0, 2, 1]),
        ((2, 1, 2), ("pp", "dp", "tp"), [1, 3, 0, 2])],
    8: [((2, 4), ("dp", "tp"), None), ((2, 2, 2), ("pp", "dp", "tp"), None),
        ((2, 2, 2), ("pp", "dp", "tp"), [5, 2, 7, 0, 3, 6, 1, 4])],
}


def axis_sets(mesh: Mesh) -> list[tuple[str, ...]]:
    return [(n,) for n in mesh.axis_names] + list(itertools.permutations(mesh.axis_names, 2))


def random_perm(rng: random.Random, n: int) -> list[tuple[int, int]]:
    """A random partial permutation of ``range(n)``: k sources paired with k distinct destinations."""
    k = rng.randint(0, n)
    return list(zip(rng.sample(range(n), k), rng.sample(range(n), k), strict=True))


def shift_perm(n: int, offset: int, wrap: bool) -> list[tuple[int, int]]:
    """The pairs ``shift`` means, written out: every i sends to i + offset (around the ring with wrap)."""
    if wrap:
        return [(i, (i + offset) % n) for i in range(n)]
    return [(i, i + offset) for i in range(n) if 0 <= i + offset < n]


def one_axis_views(mesh: Mesh) -> list[tuple[Mesh, str, tuple[str, ...]]]:
    """Every axis, and every ordered pair of axes flattened into one: (mesh, axis, the original axes)."""
    views = [(mesh, name, (name,)) for name in mesh.axis_names]
    for pair in axis_sets(mesh)[mesh.ndim:]:
        views.append((fmesh.flatten(mesh, pair, "pair"), "pair", pair))
    return views


def losses(path: pathlib.Path) -> tuple[int, list[float]]:
    data = json.loads(path.read_text())
    return data["start"], data["losses"]


def in_a_child(fn: Callable[[], T], timeout: float = 300) -> T:
    """``fn()`` run in a forked child of this process, its result (or its exception, re-raised here) sent back.

    For what starts autograd's engine threads in this process (a gradient of a gradient; Dynamo compiling, after
    which any backward does): a process that has done so cannot fork children that run autograd (torch's CUDA
    builds: "Unable to handle autograd's threading in combination with fork-based multiprocessing"), and a pytest
    worker forks the ranks of every later test. ``fn`` may be a closure: the child is a fork. A child that has not
    answered within ``timeout`` seconds is killed and ``TimeoutError`` raised: never a hang."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, send, leave without running this process's exit hooks
        os.close(read)
        try:
            payload = pickle.dumps((True, fn()))
        except BaseException as error:  # sent back, raised in the parent
            payload = pickle.dumps((False, RuntimeError(f"in the child: {type(error).__name__}: {error}")))
        with os.fdopen(write, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(write)
    deadline, chunks = time.monotonic() + patience(timeout), []
    try:
        while chunk := _read_by(read, deadline):
            chunks.append(chunk)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        raise TimeoutError(f"in_a_child: {fn!r} did not answer within {timeout}s") from None
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    ok, value = pickle.loads(b"".join(chunks))
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _read_by(fd: int, deadline: float) -> bytes:
    """The next bytes of the pipe ``fd`` (empty at its end); ``TimeoutError`` if none come by ``deadline``."""
    ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise TimeoutError
    return os.read(fd, 1 << 16)
