"""How the processes of a job meet before the default process group exists (fmesh's ``env://`` rendezvous).

torch's ``env://`` rendezvous blocks in C++ until every rank has come (rank 0's store waits for its workers, gloo
for every rank's address), so a rank that cannot start (``RANK=abc``, ``WORLD_SIZE=-3``) leaves its peers waiting
torch's timeout (10 minutes by default), and a thread blocked there can be told nothing. fmesh makes the store as
torch does (rank 0 hosts it, or torchrun's agent does), then the ranks meet in it, before torch's own
rendezvous, at a constant number of store operations per rank however long it waits:

0. ``compare_set(fmesh/start/claims/<restart>/<rank>, "", "host <host>, pid <pid>")``: a second process started
   with this ``RANK`` is a :class:`~fmesh.LaunchError` naming both (and reported, as below);
1. ``add(default_pg/fmesh/<name>/contexts/<rank>, 1)``: the epoch of the Context this start makes (its number among
   the contexts of its name, the n-th on every rank in SPMD order), which numbers this meeting too: ``<n>`` below is
   ``<name>/<epoch>`` (``fmesh.context.world``; a plain :func:`meet` counts ``fmesh/start/inits/<rank>``);
2. ``compare_set(fmesh/start/<n>/world_size, "", mine)``: every rank means the same ``WORLD_SIZE``, the same
   meshes and the same Context options (the first rank's stays and comes back to each);
3. ``add(fmesh/start/<n>/arrived, 1)``: the rank that brings the count to the world size writes ``.../all``;
4. one blocking read of ``.../all``, which every outcome writes (:class:`~fmesh.context.store.meeting.Meeting`:
   a ``get`` waits for its key; nothing logged when it comes). The first two ranks to arrive (two, so that the
   watch survives the death of one) watch ``fmesh/start/failed`` (after 0.1 s, then at doubling intervals up to
   8 s) and write ``failed`` there when a rank reported it cannot start.

Five store operations per rank, the whole of a Context's start where its default group connects nothing as it
starts (NCCL); a default group that connects (gloo) then counts its connected ranks in ``.../connected``
(:func:`count_connected`: two more).

A rank whose launcher environment is bad posts its error and the variables it read under ``fmesh/start/failed``
(:func:`report_bad_environment`, when ``MASTER_ADDR`` and ``MASTER_PORT`` reach the store), and every rank
waiting at step 4 raises :class:`~fmesh.RankLostError` naming it within seconds. torch's ``init_process_group``
then runs on this store with every rank present: milliseconds. A ``MASTER_PORT`` taken on the store's host
(another program, or a second ``RANK=0``) is a :class:`~fmesh.LaunchError` there, reported through whatever store
listens; a client that finds something at the port that does not answer as a store within ``HANDSHAKE_SECONDS``
raises one too (torch's client would wait forever).

>>> import torch.distributed as dist
>>> from datetime import timedelta
>>> meet(dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=5)).verdict  # alone: met at once
'fmesh/start/1/all'
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta

import attrs
import torch.distributed as dist

from fmesh.context.store import keys
from fmesh.context.store.arrivals import Arrivals, Silent, Vigil, silence, silenced, silent_in
from fmesh.context.store.board import absent
from fmesh.context.store.keys import START_FAILED as FAILED
from fmesh.context.store.keys import START_SEEN as SEEN
from fmesh.context.store.keys import MeetingKeys, digest
from fmesh.context.store.meeting import Meeting, watches
from fmesh.context.store.pulse import Pulse, pulse_seconds
from fmesh.context.store.records import MISMATCH, Verdict, options_differ
from fmesh.context.store.wait import Waiter
from fmesh.errors import GroupTimeoutError, LaunchError, MeshMismatchError, RankLostError

ALL_CAME = "1"  # an outcome: every rank came
REPORTED = "failed"  # an outcome: a rank reported that it cannot start (under keys.START_FAILED)
ENDED = "ended"  # an outcome: the ranks that follow, in JSON, ended before coming (``gone``)
# The longest pause between two looks of a start's watchers: 4 s, so that a rank killed after it came is named within
# about 4 + 10 + 4 s (a look, a heartbeat's silence, the look that sees it), under the death bound of 30 s.
START_LOOK_GAP_SECONDS = 4.0
DIFFERENT_OPTIONS = "options"  # an outcome: a rank's Context options differ from the first rank's (the message says)
ENVIRONMENT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
REPORT_CONNECT_SECONDS = 3.0  # how long a bad rank tries to reach the store to report (then it only raises)
WATCH_SECONDS = 0.1  # when the first rank to arrive first looks for a report (then at doubling intervals)
HOST_LINGER_SECONDS = 3.0  # how long a store host that is about to fail waits for its peers to read why
# How long a store client may take to connect once something listens at MASTER_ADDR:MASTER_PORT: torch's client
# waits forever (past its own timeout) on another program's port. A store answers in milliseconds, but torch's client
# looks up its peer's name as it connects, and where DNS does not answer that waits out the resolver (5 s a try,
# two tries by default): 5 s here failed 16-process launches on such a machine (6 of 16 clients took 5.0 s).
HANDSHAKE_SECONDS = 30.0


def hosts_store(environ: Mapping[str, str], rank: int) -> bool:
    """Whether ``rank`` hosts the job's store: rank 0 does, unless torchrun's agent hosts it (as torch reads it).

    >>> hosts_store({}, 0), hosts_store({"TORCHELASTIC_USE_AGENT_STORE": "True"}, 0), hosts_store({}, 1)
    (True, False, False)
    """
    return rank == 0 and environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True)


def _launcher_value(environ: Mapping[str, str], name: str, given: int | None) -> int:
    if given is not None:
        return given
    if name not in environ:
        raise ValueError(f"the launcher's {name} is not set: an env:// start needs RANK, WORLD_SIZE, MASTER_ADDR and "
                         "MASTER_PORT (torchrun sets them); check how this process was started")
    return int(environ[name])  # check_launcher_environment read it already


def open_store(environ: Mapping[str, str], rank: int | None, world_size: int | None,
               timeout: timedelta) -> tuple[dist.Store, int, int]:
    """The job's store (hosted by rank 0, or by torchrun's agent), this rank and the world size, as torch's
    ``env://`` rendezvous reads them (``rank`` and ``world_size`` given override the environment); unlike
    torch's, the host does not block until every rank has connected: :func:`meet` waits instead."""
    rank = _launcher_value(environ, "RANK", rank)
    world_size = _launcher_value(environ, "WORLD_SIZE", world_size)
    address = environ.get("MASTER_ADDR")
    if not address:
        raise ValueError("the launcher's MASTER_ADDR is not set: an env:// start needs RANK, WORLD_SIZE, MASTER_ADDR "
                         "and MASTER_PORT (torchrun sets them); check how this process was started")
    port = _launcher_value(environ, "MASTER_PORT", None)
    hosts = hosts_store(environ, rank)
    if (unknown := _unresolved(address)) is not None:  # the store's host too: its own client connects there
        raise ValueError(f"on rank {rank}: the launcher's MASTER_ADDR={address!r} names no host here ({unknown}): "
                         "expected the name or address of the machine of rank 0 (or of torchrun's agent); check how "
                         "this process was started")
    if not hosts and not _reachable(address, port, timeout.total_seconds()):  # quietly: torch logs each try
        raise GroupTimeoutError(f"on rank {rank}: nothing listens at MASTER_ADDR:MASTER_PORT ({address}:{port}) "
                                f"within {timeout.total_seconds():g}s: the store's host (rank 0, or torchrun's "
                                "agent) did not start, or is gone; see its error first")
    if hosts:
        try:
            store = dist.TCPStore(address, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False,
                                  multi_tenant=True)
        except dist.DistNetworkError as error:
            if "EADDRINUSE" not in str(error) and "already in use" not in str(error):
                raise
            raise LaunchError(
                f"on rank {rank}: it hosts the job's store, but the launcher's MASTER_PORT={port} is in use on this "
                "machine: another program holds it, or another process of this job was also started with RANK=0. "
                f"Expected a free port (torchrun --master-port, or MASTER_PORT) and one process per RANK in "
                f"0..{world_size - 1}") from None
    else:
        store = _client(address, port, world_size, timeout, HANDSHAKE_SECONDS, rank)
    return store, rank, world_size


def _client(address: str, port: int, world_size: int | None, timeout: timedelta, seconds: float,
            rank: int | None) -> dist.Store:
    """A client of the store at ``address:port``, where something listens, within ``seconds``: torch's client
    never returns from another program's port (the attempt is left on a daemon thread; the caller raises)."""
    made: list[dist.Store | BaseException] = []

    def connect() -> None:
        try:
            made.append(dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout))
        except BaseException as error:  # handed to the caller's thread, which raises it
            made.append(error)

    thread = threading.Thread(target=connect, name="fmesh-store-client", daemon=True)
    thread.start()
    thread.join(seconds)
    if not made:
        raise LaunchError(
            f"on rank {rank}: something listens at the launcher's MASTER_ADDR:MASTER_PORT ({address}:{port}) but "
            f"does not answer as a store within {seconds:g}s: another program holds MASTER_PORT (rank 0 then could "
            "not host the job's store there: see its error). Expected a free port (torchrun --master-port, or "
            "MASTER_PORT)")
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def meet(store: dist.Store, *, rank: int, world_size: int, timeout: timedelta, hosts: bool = False,
         gone: Callable[[], list[int]] | None = None, agenda: str = "", options: Mapping[str, str] | None = None,
         numbered: Callable[[], MeetingKeys] | None = None, beating: list[Pulse] | None = None,
         watching: list[Vigil] | None = None) -> MeetingKeys:
    """Wait until all ``world_size`` ranks have come to ``store`` (steps 1-4 above); the keys of the meeting held.

    :class:`~fmesh.RankLostError` as soon as a rank reports a bad launcher environment (naming what it read), or
    ``gone()`` (asked by the first two to arrive, as they watch) names ranks whose processes ended,
    ``ValueError`` when ranks disagree about the world size, :class:`~fmesh.GroupTimeoutError` after ``timeout``.
    ``hosts``: this rank hosts the store, so before raising it waits (a few seconds at most) until the waiting
    ranks have read why.

    ``agenda``: what else every rank must mean as it starts (the description of the groups of the meshes it will
    use, :func:`fmesh.context.group_plan.agenda`), compared in the same ``compare_set`` as the world size, at no
    store operation more: a rank that means another agenda ends the meeting with a mismatch, and every rank raises
    :class:`~fmesh.MeshMismatchError` naming both. ``options``: the record of the Context's wire-relevant options
    (:func:`~fmesh.context.options.wire_options`), compared in the same ``compare_set``: a rank that means others
    ends the meeting, and every rank raises ``ValueError`` naming both ranks and each field that differs.
    ``numbered``: the keys of this meeting, taken once the rank claimed its place (step 1: a Context numbers its
    start by its epoch, :func:`~fmesh.context.store.keys.starting`); by default the rank's next start.
    ``beating``: where a rank's heartbeat starts as it arrives (its :class:`~fmesh.context.store.pulse.Pulse` is
    appended there; the caller stops it, or hands it to its context's board), and the watchers read those of the
    ranks that came (:mod:`fmesh.context.store.arrivals`): one that stands still ends the meeting with
    :class:`~fmesh.RankLostError` naming it. Every rank of a meeting passes it, or none. ``watching``: where a
    watcher appends its :class:`~fmesh.context.store.arrivals.Vigil`, which goes on watching those heartbeats after
    the meeting, while torch sets up the default group (the caller stops it).

    >>> store = dist.HashStore()
    >>> meet(store, rank=0, world_size=1, timeout=timedelta(seconds=5), agenda="Mesh(dp=1)").verdict
    'fmesh/start/1/all'
    """
    _claim(store, rank, world_size, hosts)
    held = numbered() if numbered is not None else keys.start(int(store.add(keys.start_count(rank), 1)))
    meeting = Meeting(store, held, world_size)
    record = json.dumps({"rank": rank, "options": dict(options)}) if options is not None else ""
    mine = "\n".join((str(world_size), digest(agenda) if agenda else "", record, agenda))
    first_size, theirs_digest, theirs_record, theirs = [*meeting.compare(mine).split("\n", 3), "", "", ""][:4]
    if first_size != str(world_size):
        error = ValueError(f"rank {rank} started with WORLD_SIZE={world_size}, but another rank of this job started "
                           f"with WORLD_SIZE={first_size}; expected every rank to be started with the same "
                           "WORLD_SIZE")
        post_failure(store, {"RANK": str(rank), "WORLD_SIZE": str(world_size)}, error)
        if hosts:
            _linger(store, world_size - 1, HOST_LINGER_SECONDS)
        raise error
    if record and theirs_record and (differ := _options_differ(rank, options or {}, json.loads(theirs_record))):
        meeting.decide(Verdict(DIFFERENT_OPTIONS, differ).dumps())
    if theirs_digest != (digest(agenda) if agenda else ""):
        meeting.decide(Verdict(MISMATCH, (
            f"ranks disagree about the meshes they start with. Rank {rank} means: {agenda or 'none given'}; the "
            f"first rank to start means: {theirs or 'none given'}")).dumps())
    # The one key every outcome writes: "1" (all came), "failed" (a rank reported), "ended" and the ranks, or a
    # mismatch of the agendas, or of the Context options.
    arrived = meeting.arrive(ALL_CAME)
    if beating is not None:  # from its arrival: its first beat at once, on the pulse's thread
        beating.append(Pulse(store, keys.arrival_beat(held, arrived), pulse_seconds(world_size), rank, world_size)
                       .start(first=False, soon=True))
    arrivals = Arrivals(store, held, world_size) if beating is not None and watches(arrived) else None

    def look() -> bool:  # the first two to arrive watch for a rank that reports it cannot start, or that ended
        if store.check([FAILED]):
            meeting.decide(REPORTED)
            return True
        ended = gone() if gone is not None else []
        if ended:
            meeting.decide(f"{ENDED} {json.dumps(ended)}")
            return True
        return arrivals is not None and _silenced(meeting, arrivals, meeting.arrived)

    try:
        came = meeting.wait(Waiter(store, rank, first_look=WATCH_SECONDS), timeout.total_seconds(),
                            look if watches(arrived) else None, "waiting for the job's processes to start",
                            START_LOOK_GAP_SECONDS)
        outcome = came.decode() if came is not None else None
        _raise_silent(outcome, rank, "before the job's default group could form")
        if outcome == REPORTED or (outcome is None and store.check([FAILED])):
            raise _reported(store, rank, world_size, hosts)
        if outcome is not None and outcome.startswith(DIFFERENT_OPTIONS):
            raise ValueError(f"on rank {rank}: {Verdict.loads(outcome).message}")
        if outcome is not None and outcome.startswith(MISMATCH):
            raise MeshMismatchError(f"on rank {rank}: {Verdict.loads(outcome).message}. Expected every rank to start "
                                    "with the same meshes (the same sizes, names and rank_map, and the same options)")
        if outcome is not None and outcome.startswith(ENDED):
            raise RankLostError(f"on rank {rank}: the processes of ranks {outcome.removeprefix(ENDED).strip()} ended "
                                "before the job's default group could form (the launcher saw them end); see their "
                                "logs first")
    except dist.DistError as error:  # its host is gone: it failed to start, or died
        raise RankLostError(f"on rank {rank}: the store this job meets in is unreachable while its processes "
                            f"start (its host, rank 0 or torchrun's agent, is gone): {error}") from None
    if outcome == ALL_CAME and arrivals is not None and beating and watching is not None:
        # A look every two beats' periods: each reads every rank's counter (one multi_get of world_size keys).
        watching.append(Vigil(beating[0].store, held, world_size, every=2 * pulse_seconds(world_size)))
    if outcome is None:
        missing = _unclaimed(store, world_size)
        raise GroupTimeoutError(
            f"on rank {rank}: only {meeting.arrived()} of the job's {world_size} processes started within "
            f"{timeout.total_seconds():g}s (ranks {missing[:16]}{'...' if len(missing) > 16 else ''} never came); "
            "check that every rank was started, with the same WORLD_SIZE")
    return held


def _options_differ(rank: int, mine: Mapping[str, str], first: Mapping[str, object]) -> str:
    """Why the Context options of ``rank`` (``mine``) differ from those of the first rank to start (``first``: its
    rank and options), or "" where they do not."""
    theirs = first.get("options")
    differ = options_differ(mine, theirs if isinstance(theirs, dict) else {}, here=f"on rank {rank}",
                            there=f"on rank {first.get('rank')}")
    return (f"rank {rank}'s Context options differ from rank {first.get('rank')}'s, which started first: "
            f"{'; '.join(differ)}. Expected every rank to create its Context with the same options (they decide which "
            "groups a collective runs on and what goes over the wire); pass the same to every rank") if differ else ""


def _silenced(meeting: Meeting, arrivals: Arrivals, arrived: Callable[[], int]) -> bool:
    """A watcher's look at the heartbeats of the ranks that came (``arrived()`` of them): where some stood still, the
    meeting's verdict names them (:data:`SILENT`), and the look ends the wait."""
    quiet = arrivals.silent(arrived)
    if quiet:
        meeting.decide(silenced(quiet))
    return bool(quiet)


def _raise_silent(outcome: str | None, rank: int, when: str) -> None:
    """:class:`~fmesh.RankLostError` where the verdict ``outcome`` says ranks that came stood still."""
    quiet = silent_in(outcome)
    if quiet:
        raise silent_error(quiet, rank, when)


def silent_error(quiet: list[Silent], rank: int, when: str) -> RankLostError:
    """The error of ``rank`` where the ranks that came ``quiet`` stood still (``when``: what they could not do).

    >>> str(silent_error([Silent(1, 2, 11.0)], 0, "before the default group formed"))[:64]
    'on rank 0: rank 2 is gone: its heartbeat stood still for 11s (th'
    """
    return RankLostError(f"on rank {rank}: {'; '.join(place.describe() for place in quiet)} (its process was killed, "
                        f"crashed, or is frozen) after it came to the job's start, {when}; see its log first")


def count_connected(store: dist.Store, meeting: MeetingKeys, *, rank: int, world_size: int, timeout: timedelta,
                    gone: Callable[[], list[int]] | None = None, beats: bool = False) -> None:
    """Return once all ``world_size`` ranks, having met in ``meeting`` (:func:`meet`), connected their default group:
    each counts itself in (one ``add``; the last writes the verdict) and blocks once on the verdict, two store
    operations per rank. :class:`~fmesh.RankLostError` as soon as ``gone()`` (asked by the first two to count
    themselves, as they watch) names ranks whose processes ended, or (``beats``: the ranks beat their heartbeats at
    the meeting's places of arrival, :func:`meet`'s ``beating``) one's heartbeat stood still,
    :class:`~fmesh.GroupTimeoutError` after ``timeout``.

    >>> count_connected(dist.HashStore(), keys.start(1), rank=0, world_size=1, timeout=timedelta(seconds=5))
    """
    counted = Meeting(store, keys.connected(meeting), world_size)
    place = counted.arrive(ALL_CAME)
    arrivals = Arrivals(store, meeting, world_size) if beats and watches(place) else None

    def look() -> bool:  # the first two watch for a rank whose process ended, or whose heartbeat stood still
        ended = gone() if gone is not None else []
        if ended:
            counted.decide(f"{ENDED} {json.dumps(ended)}")
            return True
        return arrivals is not None and _silenced(counted, arrivals, lambda: world_size)  # every rank came

    try:
        came = counted.wait(Waiter(store, rank, first_look=WATCH_SECONDS), timeout.total_seconds(),
                            look if watches(place) else None, "waiting for the job's processes to connect",
                            START_LOOK_GAP_SECONDS)
    except dist.DistError as error:  # its host is gone
        raise RankLostError(f"on rank {rank}: the store this job meets in is unreachable while its processes "
                            f"connect (its host, rank 0 or torchrun's agent, is gone): {error}") from None
    outcome = came.decode() if came is not None else None
    _raise_silent(outcome, rank, "before the job's default group connected")
    if outcome is not None and outcome.startswith(ENDED):
        raise RankLostError(f"on rank {rank}: the processes of ranks {outcome.removeprefix(ENDED).strip()} ended "
                            "before the job's default group connected (the launcher saw them end); see their logs "
                            "first")
    if outcome is None and beats and (quiet := silence(store, meeting)):  # a watcher's vigil saw one stand still
        raise silent_error(quiet, rank, "before the job's default group connected")
    if outcome is None:
        raise GroupTimeoutError(f"on rank {rank}: only {counted.arrived()} of the job's {world_size} processes "
                                f"connected their default group within {timeout.total_seconds():g}s; see the "
                                "others' errors first")


def _unclaimed(store: dist.Store, world_size: int) -> list[int]:
    """The ranks no process claimed in this start of the workers (found by halving the ranks checked: a few checks
    per missing rank), the slow path of a timeout."""
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return absent(store, range(world_size), lambda rank: keys.start_claim(restarts, rank))


def _claim(store: dist.Store, rank: int, world_size: int, hosts: bool) -> None:
    """Claim ``rank`` for this process (its host and pid; a process may start several times): a second process
    with the same ``RANK`` is a :class:`~fmesh.LaunchError` naming both, and reports it, so the waiting ranks
    stop at once instead of one pairing with the wrong process and the other hanging."""
    me = f"host {socket.gethostname()}, pid {os.getpid()}"
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # torchrun restarts the workers with one store
    holder = store.compare_set(keys.start_claim(restarts, rank), "", me).decode()
    if holder == me:
        return
    error = LaunchError(
        f"two processes of this job read RANK={rank}: this one ({me}) and another ({holder}) that started first. "
        f"Expected each of the WORLD_SIZE={world_size} processes to be started with its own RANK in "
        f"0..{world_size - 1}; check how these processes were started")
    post_failure(store, {"RANK": str(rank), "WORLD_SIZE": str(world_size)}, error)
    if hosts:
        _linger(store, world_size - 1, HOST_LINGER_SECONDS)
    raise error


def _reported(store: dist.Store, rank: int, world_size: int, hosts: bool) -> RankLostError:
    """The error of a waiting rank that found a bad rank's report (having said it read it)."""
    report = Report.loads(store.get(FAILED))
    store.add(SEEN, 1)
    if hosts:  # the others read the report through this process (those still starting too): wait until they have
        _linger(store, world_size - 1, HOST_LINGER_SECONDS)
    return RankLostError(f"on rank {rank}: a process of this job could not start, so the job's default group can "
                         f"never form: {report.describe()}. Fix how that process was started")


@attrs.frozen
class Report:
    """What a process that cannot start posts: its error, the launcher variables it read, its host and pid.

    >>> Report.loads(Report("ValueError: bad", (("RANK", "abc"),), "node7", 42).dumps()).describe()
    "ValueError: bad (it read RANK='abc'; host node7, pid 42)"
    """

    error: str
    environment: tuple[tuple[str, str], ...]
    host: str
    pid: int

    def dumps(self) -> str:
        return json.dumps(attrs.asdict(self))

    @classmethod
    def loads(cls, raw: bytes | str) -> Report:
        """The report in ``raw``; an unreadable one says so (it still means a process could not start)."""
        with contextlib.suppress(ValueError, TypeError, UnicodeDecodeError):
            fields = json.loads(raw)
            return cls(str(fields["error"]), tuple((str(k), str(v)) for k, v in fields["environment"]),
                       str(fields["host"]), int(fields["pid"]))
        return cls("an unreadable report", (), "?", 0)

    def describe(self) -> str:
        read = ", ".join(f"{name}={value!r}" for name, value in self.environment) or "no launcher variables"
        return f"{self.error} (it read {read}; host {self.host}, pid {self.pid})"


def post_failure(store: dist.Store, environment: Mapping[str, str], error: BaseException) -> None:
    """Post that this process cannot start, with ``error`` and the launcher ``environment`` it read (the first
    report stays)."""
    report = Report(f"{type(error).__name__}: {error}"[:2000], tuple(environment.items()), socket.gethostname(),
                    os.getpid())
    store.compare_set(FAILED, "", report.dumps())


def _unresolved(address: str) -> OSError | UnicodeError | None:
    """Why ``address`` (``MASTER_ADDR``) names no host here, or ``None`` if it does: reaching a name that names no
    host would be tried for the whole timeout (10 minutes by default), and it can never answer.

    >>> _unresolved("127.0.0.1") is None, type(_unresolved("no-such-host.invalid")).__name__
    (True, 'gaierror')
    """
    try:
        socket.getaddrinfo(address, None)
    except (OSError, UnicodeError) as error:
        return error
    return None


def _reachable(address: str, port: int, seconds: float) -> bool:
    """Whether something listens at ``address:port`` within ``seconds`` (a plain socket: torch's store client
    logs every failed try)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((address, port), timeout=max(0.05, deadline - time.monotonic())):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def report_bad_environment(environ: Mapping[str, str], error: BaseException,
                           seconds: float = REPORT_CONNECT_SECONDS, host: bool = True) -> bool:
    """Tell the job's other processes, through its store, that this one cannot start (``error``), so that they
    stop waiting for it; whether the report was posted. Needs ``MASTER_ADDR`` and ``MASTER_PORT``; a process that
    would host the store (``RANK=0`` without torchrun's agent) hosts it and stays until its peers have read the
    report (a few seconds at most; ``host=False``: it only connects, as a rank 0 that found its port taken
    does). Never raises: the caller raises ``error``.

    >>> report_bad_environment({"RANK": "abc"}, ValueError("RANK='abc'"))  # no MASTER_ADDR: nowhere to report
    False
    """
    address, port_text = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT", "")
    if not address or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return False
    port = int(port_text)
    environment = {name: environ[name] for name in ENVIRONMENT if name in environ}
    hosts = host and environ.get("RANK") == "0" and hosts_store(environ, 0)
    try:
        if hosts:
            store = dist.TCPStore(address, port, None, is_master=True, timeout=timedelta(seconds=seconds),
                                  wait_for_workers=False)
        elif _unresolved(address) is None and _reachable(address, port, seconds):
            store = _client(address, port, None, timedelta(seconds=seconds), seconds, None)
        else:
            return False
        post_failure(store, environment, error)
    except Exception:  # the report is a courtesy: this process's own error matters more
        return False
    if hosts:
        _linger(store, None, seconds)
    return True


def _linger(store: dist.Store, readers: int | None, seconds: float) -> None:
    """Keep the store this process hosts up until ``readers`` ranks have read the report, at most ``seconds``
    (``None``: this process cannot tell the world size, so it takes the one the arriving ranks posted)."""
    deadline = time.monotonic() + seconds
    posted = keys.starting("fmesh", 0).compared  # a fresh store (this process hosts it): the first Context's start
    with contextlib.suppress(Exception):
        while time.monotonic() < deadline:
            if readers is None and store.check([posted]):
                readers = int(store.get(posted).decode().partition("\n")[0]) - 1
            if readers is not None and store.add(SEEN, 0) >= readers:
                return
            time.sleep(0.02)
