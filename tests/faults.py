"""The seeded fault campaign: random faults at random points of random jobs, each run judged by the failure model's
promises (docs/guides/failures.md).

A :class:`Trial` is drawn from a seed alone (:func:`draw`): a world of 2 to 8 gloo processes started by
:func:`fmesh.launch` (``on_rank_loss="continue"``, the launcher hosts the store), a random mesh over it (random
factors, names and rank map), the collectives each step runs, whether the launcher marks the dead (in 7 runs of 10;
otherwise, as under torchrun, only the roll call, the statuses and the heartbeat tell), and one or two
:class:`Fault` s: a kind (``kill``: SIGKILL; ``raise``: an exception in the rank's program; ``stop``: SIGSTOP, then
SIGCONT some seconds later; ``delay``: a sleep) at a point of the job (:data:`POINTS`: the Context's start, a
group's agreement, the members' tensor check, a collective, between steps; and, for a second fault, the roll call,
the recovery's agreement, the new world's start and torch's set-up of it). Every point is a function the faulty rank
calls, wrapped in the launching process before the fork (:func:`wrapped`): the wrapper acts only in the victim's
process, on its n-th call.

Every rank runs :func:`program`: the steps, each sum checked against the mesh's own answer; on a named fmesh error
a survivor recovers without the ranks whose deadly fault fired (as the launcher tells an operator), retrying
``recover`` when a second fault ends the first try, then runs two steps on the new world. :func:`judge` holds each
run to the promises: no hang (the launch's bound), no wrong sum, every survivor raises a named fmesh error (or fmesh's
own explanation that every member answered: :func:`explained`) within :func:`bound` of the first fault, and, when a
deadly fault struck, recovers into the same new world (the survivors, in ascending order: the store is the
launcher's, so every loss can be recovered from); no error names a living rank as gone (:func:`blamed`); a
non-deadly fault ends no rank. The leak check is the caller's
(``nothing_left_behind`` in the suite, :func:`leaks` in ``bench/faults.py``).

``python bench/faults.py --seeds N`` runs seeds 0..N-1; ``tests/context/test_fault_campaign.py`` a fixed sample.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import random
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import attrs
import torch
import torch.distributed as dist
from support import patience

import fmesh
from fmesh import errors
from fmesh.context import call_checks, creation, failures, set_up
from fmesh.context.store import agreement, pulse, recovery_vote, rendezvous, wait
from fmesh.context.world import World

KINDS = ("kill", "raise", "stop", "delay")
DEADLY = ("kill", "raise")  # the victim leaves the job; a stopped or delayed one comes back
# Where a first fault strikes (the job running), and where a second one does (the survivors handling the first).
FIRST_POINTS = ("start", "agreement", "tensor check", "collective", "between steps")
SECOND_POINTS = ("roll call", "recovery", "new world's start", "torch's set-up")
POINTS = FIRST_POINTS + SECOND_POINTS
# Options every rank's Context gets: short, so that a run is seconds; the bound below is derived from them. The
# creation timeout leaves a survivor kept at one group time to learn of a loss at another (seed 152: rank 4 waited
# 9 s at [4, 5] while rank 5 learnt of rank 1's failure at [1, 3, 5, 7], with the suite's two workers per core).
CREATION_TIMEOUT = 12.0
COLLECTIVE_TIMEOUT = 30.0
STEPS = 4
NAMED = tuple(getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type))


@attrs.frozen
class Fault:
    """One fault: ``kind`` on rank ``rank`` at the ``call``-th time it reaches ``point`` (``seconds``: how long a
    ``stop`` or a ``delay`` lasts)."""

    kind: str
    point: str
    rank: int
    call: int = 1
    seconds: float = 0.0

    def __str__(self) -> str:
        held = f" for {self.seconds:.1f}s" if self.kind in ("stop", "delay") else ""
        return f"{self.kind}{held} on rank {self.rank} at {self.point} (call {self.call})"


@attrs.frozen
class Trial:
    """A job and the faults it meets, drawn from ``seed`` (:func:`draw`)."""

    seed: int
    world: int
    shape: tuple[int, ...]
    names: tuple[str, ...]
    rank_map: tuple[int, ...] | None
    axes: tuple[tuple[str, ...], ...]  # what each step reduces along
    faults: tuple[Fault, ...]
    check_tensors: bool
    # Whether the launcher marks the dead in the store (fmesh.launch does); without, as under torchrun, the survivors
    # learn of a death from the roll call, a status, or the heartbeat (fmesh.context.store.pulse).
    marks: bool = True

    def mesh(self) -> fmesh.Mesh:
        return fmesh.make_mesh(self.shape, self.names, rank_map=None if self.rank_map is None else list(self.rank_map))

    def __str__(self) -> str:
        mapped = "" if self.rank_map is None else f" rank_map={list(self.rank_map)}"
        return (f"seed {self.seed}: {self.world} ranks, mesh {dict(zip(self.names, self.shape, strict=True))}"
                f"{mapped}, check_tensors={self.check_tensors}{'' if self.marks else ', no launcher marks'}; "
                + "; then ".join(map(str, self.faults)))


def factors(n: int, rng: random.Random) -> tuple[int, ...]:
    """A random factorisation of ``n`` into 1 to 3 factors (each > 1, unless ``n`` is 1... or a factor 1 for an axis
    of size one, now and then)."""
    shape: list[int] = []
    rest = n
    while rest > 1 and len(shape) < 2:
        divisors = [d for d in range(2, rest + 1) if rest % d == 0]
        d = rng.choice(divisors)
        shape.append(d)
        rest //= d
    if rest > 1:
        shape.append(rest)
    if rng.random() < 0.15:
        shape.insert(rng.randrange(len(shape) + 1), 1)
    return tuple(shape) or (1,)


def draw(seed: int, worlds: tuple[int, int] = (2, 8)) -> Trial:
    """The trial of ``seed``: everything random is drawn here, so a seed is a run.

    >>> draw(7) == draw(7)
    True
    """
    rng = random.Random(seed)
    world = rng.randint(*worlds)
    shape = factors(world, rng)
    names = tuple(rng.sample(["dp", "tp", "pp", "cp", "ep"], len(shape)))
    rank_map = tuple(rng.sample(range(world), world)) if rng.random() < 0.3 else None
    # The last step is over every rank: each survivor learns of a loss there, if not before, and recovers.
    axes = (*(tuple(rng.sample(names, rng.randint(1, len(names)))) for _ in range(STEPS - 1)), names)
    check_tensors = rng.random() < 0.7
    mesh = fmesh.make_mesh(shape, names, rank_map=None if rank_map is None else list(rank_map))
    kind, victim, point = rng.choice(KINDS), rng.randrange(world), rng.choice(FIRST_POINTS)
    first = Fault(kind, point, victim, call=rng.randint(1, reached(point, mesh, axes, victim)),
                  seconds=round(rng.uniform(0.2, 2.5), 1))
    faults = (first,)
    survivors = [r for r in range(world) if r != first.rank]
    if kind in DEADLY and len(survivors) >= 3 and rng.random() < 0.4:  # a second fault, while the survivors handle it
        faults += (Fault(rng.choice(DEADLY), rng.choice(SECOND_POINTS), rng.choice(survivors), call=1),)
    # Drawn last, so every field above is what the seed drew before. A kill in the start's rendezvous, before the
    # Context's heartbeat exists, is named only by a launcher's mark (docs/guides/failures.md: still past 30 s).
    marks = rng.random() >= 0.3 or (kind == "kill" and point == "start")
    return Trial(seed, world, shape, names, rank_map, axes, faults, check_tensors, marks)


def reached(point: str, mesh: fmesh.Mesh, axes: tuple[tuple[str, ...], ...], rank: int) -> int:
    """How many times ``rank`` reaches a first fault's ``point`` in a run without faults (at least once), so that
    the fault's call is drawn among those that happen."""
    shared = [along for along in axes if len(mesh.group(rank, along)) > 1]  # a group of one sends nothing
    counts = {"start": 1, "agreement": len({tuple(mesh.group(rank, along)) for along in shared}),
              "tensor check": len(axes), "collective": len(shared),  # the members' check sends no collective
              "between steps": len(axes)}
    return max(1, counts[point])


# ---------------------------------------------------------------------------------------------- injection


def strike(fault: Fault, directory: pathlib.Path) -> None:
    """Do ``fault`` in this process, having written down when (the judge measures from it)."""
    (directory / f"fault-{fault.rank}-{fault.point}").write_text(repr(time.time()))
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "raise":
        (directory / f"leaving-{fault.rank}").write_text("")
        raise RuntimeError(f"injected fault: {fault}")
    elif fault.kind == "stop":
        me = os.getpid()
        if os.fork() == 0:  # a child that only sleeps and signals: safe in a process with threads
            time.sleep(fault.seconds)
            os.kill(me, signal.SIGCONT)
            os._exit(0)
        os.kill(me, signal.SIGSTOP)
    else:
        time.sleep(fault.seconds)


def wrapped(original: Callable[..., Any], faults: list[Fault], directory: pathlib.Path,
            skip: int = 0) -> Callable[..., Any]:
    """``original``, which strikes each of ``faults`` in its victim's process (``RANK``, as the launcher set it) at
    the fault's n-th call (after ``skip`` calls not counted: the point's earlier uses, such as the first start's
    rendezvous for the new world's). The count lives in the closure, one copy per forked rank."""
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rank = int(os.environ.get("RANK", "-1"))
        calls[0] += 1
        for fault in faults:
            if fault.rank == rank and calls[0] == skip + fault.call:
                strike(fault, directory)
        return original(*args, **kwargs)

    return wrapper


def _patch_points() -> dict[str, tuple[Any, str, int]]:
    """Where each point is: (owner, attribute, calls to skip); a function is wrapped where its caller looks it up."""
    return {
        "start": (rendezvous, "meet", 0),
        "agreement": (creation, "agree", 0),
        "tensor check": (call_checks.CallChecks, "check", 0),
        "collective": (dist, "all_reduce", 0),
        "roll call": (failures, "roll_call", 0),
        "recovery": (recovery_vote, "agree_on_loss", 0),
        "new world's start": (World, "renewed", 0),
        "torch's set-up": (dist, "init_process_group", 1),
    }


@contextlib.contextmanager
def injected(faults: tuple[Fault, ...], directory: pathlib.Path) -> Iterator[None]:
    """Every point of ``faults`` wrapped while the launch forks its ranks (this process calls none of them)."""
    places = _patch_points()
    by_function: dict[tuple[Any, str], list[Fault]] = {}
    for fault in faults:
        owner, name, _ = places.get(fault.point, (None, "", 0))
        if owner is not None:
            by_function.setdefault((owner, name), []).append(fault)
    saved = [(owner, name, getattr(owner, name)) for owner, name in by_function]
    try:
        for (owner, name), struck in by_function.items():
            function = getattr(owner, name)
            for skip in sorted({places[f.point][2] for f in struck}):  # one point after another on one function
                function = wrapped(function, [f for f in struck if places[f.point][2] == skip], directory, skip)
            setattr(owner, name, function)
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


# ---------------------------------------------------------------------------------------------- the program


def fired(directory: pathlib.Path, faults: tuple[Fault, ...]) -> list[int]:
    """The ranks whose deadly fault has struck (what the launcher's results, or its marks, tell an operator)."""
    return sorted({f.rank for f in faults if f.kind in DEADLY and (directory / f"fault-{f.rank}-{f.point}").exists()})


def steps(ctx: fmesh.Context, mesh: fmesh.Mesh, axes: tuple[tuple[str, ...], ...], leaving: pathlib.Path,
          between: Callable[[int], None] = lambda step: None) -> list[str]:
    """Run every step's all_reduce of this rank's ``rank + 1`` (``between(n)`` before step n); the sums that came out
    wrong (none, when all is well)."""
    wrong = []
    for step, along in enumerate(axes, start=1):
        between(step)
        got = ctx.all_reduce(torch.tensor([ctx.rank + 1.0]), mesh, along).item()
        expected = float(sum(r + 1 for r in mesh.group(ctx.rank, along)))
        if got != expected:
            wrong.append(f"rank {ctx.rank}: sum along {along} {got} != {expected}")
        if leaving.exists():  # an injected exception was swallowed on its way: the victim leaves as it meant to
            raise RuntimeError("injected fault: leaving")
    return wrong


def program(ctx: fmesh.Context, trial: Trial, directory: pathlib.Path) -> dict[str, Any]:
    """What each rank does; what it saw (``wrong`` sums, its ``errors`` with their wall-clock times, the new world's
    old ranks once ``recovered``)."""
    me = ctx.rank
    leaving = directory / f"leaving-{me}"
    seen: dict[str, Any] = {"wrong": [], "errors": [], "recovered": None, "attempts": 0}
    try:
        seen["wrong"] += steps(ctx, trial.mesh(), trial.axes, leaving, lambda step: [
            strike(f, directory) for f in trial.faults if (f.point, f.rank, f.call) == ("between steps", me, step)])
        return seen
    except Exception as error:
        # fmesh's "every member answered, none is lost" (a member's collective raised on itself) is a survivor's to
        # act on once the launcher says that member left (an operator's program asks it, as this one asks `fired`):
        # it recovers without it. With no deadly fault struck it is the rank's result, as any other error.
        told = explained(error) and any(r != me for r in fired(directory, trial.faults))
        if leaving.exists() or not (isinstance(error, NAMED) or told):
            raise
        seen["errors"].append((type(error).__name__, str(error), time.time()))
        if not (isinstance(error, errors.RankLostError) or told):
            return seen
    current = ctx
    while seen["attempts"] < 3:
        lost = [r for r in fired(directory, trial.faults) if r != me]
        if not lost:
            return seen
        seen["attempts"] += 1
        try:
            renewed = current.recover(lost)
        except NAMED as error:  # a RecoveryError is retried (a second fault); any other ends the recovery
            if leaving.exists():
                raise
            seen["errors"].append((type(error).__name__, str(error), time.time()))
            if isinstance(error, errors.RecoveryError):
                continue
            return seen
        if renewed is None:
            return seen
        with renewed:
            world = fmesh.make_mesh((renewed.world_size,), ("all",))
            seen["wrong"] += steps(renewed, world, (("all",),) * 2, leaving)
            olds = renewed.all_gather(torch.tensor([me]), world, "all").tolist()
            seen["recovered"] = olds
        return seen
    return seen


# ---------------------------------------------------------------------------------------------- the judge

_GONE = [re.compile(p) for p in (
    r"ranks \[([\d, ]+)\] of the group are gone",
    r"ranks \[([\d, ]+)\] of the group did not answer a roll call",
    r"launcher saw the processes of ranks \[([\d, ]+)\] end",
    r"ranks \[([\d, ]+)\] are lost",
    r"ranks \[([\d, ]+)\] ended",
    r"rank (\d+) is gone: its heartbeat",
)]


def blamed(message: str) -> set[int]:
    """The ranks an error's message says are gone (lost, ended, never came, silent in a roll call).

    >>> sorted(blamed("ranks [3] of the group are gone (the launcher saw the processes of ranks [3, 1] end)"))
    [1, 3]
    """
    named: set[int] = set()
    for pattern in _GONE:
        for match in pattern.finditer(message):
            named.update(int(r) for r in match.group(1).split(","))
    return named


def explained(error: BaseException) -> bool:
    """fmesh's explanation of a collective that failed on its members while every member answered the roll call
    (one member's collective raised on itself, an error that is not a closed connection): a ``RuntimeError`` by design
    (docs/guides/failures.md: nobody is lost, each member's error is named), not the backend's bare error.

    >>> explained(RuntimeError("on rank 0: all_reduce ... failed on its members, and every member answered a roll "
    ...                        "call"))
    True
    """
    text = str(error)
    return type(error) is RuntimeError and text.startswith("on rank ") and "every member answered a roll call" in text


def bound(trial: Trial, created: float = 0.0) -> float:
    """How long after the first fault a survivor may take to raise (the creation timeout, a 5 s roll call, the longest
    stop, and 10 s for the rest; with no launcher marks, a heartbeat's silence and a watcher's longest gap between
    looks), stretched by the machine's load (:func:`support.patience`)."""
    held = max((f.seconds for f in trial.faults if f.kind in ("stop", "delay")), default=0.0)
    # ``created``: the creation timeout the run's contexts had (stretched by the load at its start, which may have
    # eased since): the bound never allows less.
    return max(created, patience(creation_timeout(trial), trial.world)) + patience(5 + held + 10, trial.world)


def set_up_bound(trial: Trial, limit: float, created: float = 0.0) -> float:
    """How long after the first fault a survivor told of it by torch's set-up of a group may take to raise:
    ``limit``, and the longest the others wait for that set-up: fmesh's ``tries_bound`` of its ``connect_bound``
    (or of the creation timeout where shorter), stretched by the load."""
    connect = min(max(created, patience(creation_timeout(trial), trial.world)),
                  patience(set_up.connect_bound(trial.world).total_seconds(), trial.world))
    return limit + set_up.tries_bound(timedelta(seconds=connect)).total_seconds()


def creation_timeout(trial: Trial) -> float:
    """The creation timeout of ``trial``'s contexts on a quiet machine (:func:`run` stretches it by the load, as
    :func:`bound` does): :data:`CREATION_TIMEOUT`; with no launcher marks, longer than a heartbeat's watch (a silence
    and a watcher's longest gap between looks), as the default (2 minutes) is, so that a member killed before it came
    is named gone by its heartbeat, not timed out as one that never came."""
    return CREATION_TIMEOUT + (0.0 if trial.marks else pulse.SILENT_SECONDS + wait.LONGEST_LOOK_GAP_SECONDS)


@attrs.frozen
class Verdict:
    """A run judged: its ``trial``, what broke a promise (``violations``, empty when none did), and per rank what
    it ended with (``outcomes``)."""

    trial: Trial
    violations: tuple[str, ...]
    outcomes: tuple[str, ...]
    seconds: float
    struck: tuple[Fault, ...] = ()  # the faults that happened (a fault's point may not be reached: a run it spares)
    named: float | None = None  # the longest time from the first fault to a survivor's first error (None: none raised)

    @property
    def ok(self) -> bool:
        return not self.violations

    def __str__(self) -> str:
        said = "ok" if self.ok else "VIOLATED: " + " | ".join(self.violations)
        spared = [f for f in self.trial.faults if f not in self.struck]
        missed = f" (not reached: {'; '.join(map(str, spared))})" if spared else ""
        return f"{self.trial} [{self.seconds:.1f}s]{missed} -> {said}\n    " + "\n    ".join(self.outcomes)


def judge(trial: Trial, results: list[Any], directory: pathlib.Path, seconds: float, ended: float,
          created: float = 0.0) -> Verdict:
    """The promises of the failure model, held against one run's ``results`` (one per rank), the launch ``ended``
    (wall-clock time; ``created``: the creation timeout its contexts had)."""
    dead = set(fired(directory, trial.faults))
    struck = tuple(f for f in trial.faults if (directory / f"fault-{f.rank}-{f.point}").exists())
    first = min((float((directory / f"fault-{f.rank}-{f.point}").read_text()) for f in struck), default=None)
    # Where torch's set-up of a group told a survivor of the loss (agreement.INSIDE_SET_UP), every survivor is bound
    # by that set-up (after a death inside it, gloo holds the others five connect timeouts), since each may have
    # waited for that one (an agreement, the vote).
    held_in_set_up = any(isinstance(result, dict) and any(agreement.INSIDE_SET_UP in message
                                                          for _, message, _ in result["errors"])
                         for rank, result in enumerate(results) if rank not in dead)
    limit = set_up_bound(trial, bound(trial, created), created) if held_in_set_up else bound(trial, created)
    violations: list[str] = []
    outcomes: list[str] = []
    worlds = {}
    named: float | None = None
    for rank, result in enumerate(results):
        if rank in dead:
            outcomes.append(f"rank {rank}: the victim ({type(result).__name__})")
            continue
        if isinstance(result, BaseException):
            outcomes.append(f"rank {rank}: {type(result).__name__}: {str(result)[:300]}")
            if not (isinstance(result, NAMED) or explained(result)):
                violations.append(f"rank {rank} (not a victim) raised a bare {type(result).__name__}: "
                                  f"{str(result)[:300]}")
            continue
        violations += result["wrong"]
        if first is not None and result["errors"]:
            named = max(named or 0.0, result["errors"][0][2] - first)
        for kind, message, at in result["errors"]:
            wrong_blame = blamed(message) - dead
            if wrong_blame:
                violations.append(f"rank {rank}: {kind} names living ranks {sorted(wrong_blame)} as gone: {message}")
            if first is None:
                violations.append(f"rank {rank}: {kind} with no fault struck: {message[:300]}")
            elif at - first > limit:
                violations.append(f"rank {rank}: {kind} {at - first:.1f}s after the fault, past the {limit:.0f}s "
                                  f"bound: {message[:300]}")
        if result["recovered"] is not None:
            worlds[rank] = tuple(result["recovered"])
        last = result["errors"][-1] if result["errors"] else None
        outcomes.append(f"rank {rank}: " + (f"recovered into {result['recovered']} after {len(result['errors'])} "
                                            "errors" if result["recovered"] is not None else
                                            "finished" if last is None else f"{last[0]}: {last[1][:400]}"))
        if not dead and result["errors"]:
            violations.append(f"rank {rank}: a fault that ends no rank ({trial.faults[0]}) ended it: {last}")
        elif dead and result["recovered"] is None:  # the store is the launcher's: every loss can be recovered from
            violations.append(f"rank {rank} survived ranks {sorted(dead)} but did not recover: {last}")
    if first is not None and ended - first > limit + 10:  # a rank's error, its recovery and its last steps
        violations.append(f"the run ended {ended - first:.1f}s after the first fault, past the {limit:.0f}s bound "
                          "(and 10 s to recover and run on)")
    expected = tuple(r for r in range(trial.world) if r not in dead)
    for rank, world in worlds.items():
        if world != expected:
            violations.append(f"rank {rank} recovered into {list(world)}, expected the survivors {list(expected)}")
    return Verdict(trial, tuple(violations), tuple(outcomes), seconds, struck, named)


@contextlib.contextmanager
def unmarked(really: bool) -> Iterator[None]:
    """``fmesh.launch`` marking no dead rank in the store while the block runs (``really``), as torchrun's agent."""
    import importlib

    launcher = importlib.import_module("fmesh.context.launch")
    saved = launcher.mark_ended
    if really:
        launcher.mark_ended = lambda *args: None
    try:
        yield
    finally:
        launcher.mark_ended = saved


def run(trial: Trial, timeout: float = 120) -> Verdict:
    """Launch ``trial``'s job with its faults, and judge it. A launch past its bound is a hang (a violation)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fmesh-faults-") as name:
        directory = pathlib.Path(name)
        # Stretched by the machine's load, as the collective timeout is: a process held off the CPU is no fault the
        # campaign draws (8 processes connecting a full mesh on 2 cores under a load of 20 took past 8 s).
        options: dict[str, Any] = {"creation_timeout": patience(creation_timeout(trial), trial.world),
                                   "check_tensors": trial.check_tensors}
        try:
            with injected(trial.faults, directory), unmarked(not trial.marks):
                results = fmesh.launch(lambda ctx: program(ctx, trial, directory), trial.world,
                                       timeout=patience(timeout, trial.world),
                                       context_options={"timeout": patience(COLLECTIVE_TIMEOUT, trial.world),
                                                        **options},
                                       return_exceptions=True, on_rank_loss="continue")
        except TimeoutError as error:
            return Verdict(trial, (f"hang: {error}",), (), time.monotonic() - started)
        return judge(trial, results, directory, time.monotonic() - started, time.time(), options["creation_timeout"])


PROMISES = ("hang", "wrong blame", "wrong result", "leak", "other")


def broken(violation: str) -> str:
    """Which promise ``violation`` broke (:data:`PROMISES`; ``other``: a bound, a recovery, a bare error).

    >>> broken("hang: launch: ranks [1] did not finish"), broken("rank 0: RankLostError names living ranks [1] ...")
    ('hang', 'wrong blame')
    """
    if violation.startswith("hang:"):
        return "hang"
    if "names living ranks" in violation:
        return "wrong blame"
    if ": sum along " in violation:
        return "wrong result"
    if violation.startswith("left behind:"):
        return "leak"
    return "other"


def leaks(before: tuple[int, int]) -> str | None:
    """What this process holds more than ``before`` (threads, file descriptors) or any child left: ``None`` if
    nothing (a short wait first: a queue's feeder thread takes a moment to end)."""
    import gc
    import multiprocessing

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        gc.collect()
        now = (threading.active_count(), len(os.listdir("/proc/self/fd")))
        if now[0] <= before[0] and now[1] <= before[1] and not multiprocessing.active_children():
            return None
        time.sleep(0.05)
    return f"left behind: threads {before[0]} -> {now[0]}, fds {before[1]} -> {now[1]}, " \
           f"children {multiprocessing.active_children()}"


def launched_once() -> None:
    """A first launch: it opens a pipe multiprocessing keeps for the process's life (not a run's leak)."""
    fmesh.launch(lambda ctx: ctx.world_size, 1, timeout=60)
