"""This process in the job: its rank, the world size, its device, and the default process group.

A :class:`World` is made once per Context. It initialises torch's default group when nobody has
(and then owns it, destroying it on :meth:`World.close`), or joins the one that exists. Everything
else in the Context reads the world; nothing else initialises or destroys the default group.

>>> world = World.start(backend="fake", rank=1, world_size=4)
>>> world.rank, world.world_size, world.fake, world.device
(1, 4, True, device(type='cpu'))
>>> world.close(), world.close()  # it owned the default group, and ends it once
(True, False)
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import attrs
import torch
import torch.distributed as dist

from fmesh.context import _torch, slurm
from fmesh.context.options import DEFAULT_TIMEOUT, normalize_backend
from fmesh.context.set_up import connect_bound, tries_bound
from fmesh.context.store import keys, rendezvous
from fmesh.context.store.arrivals import Silent, Vigil, silence
from fmesh.context.store.board import Board, read_list
from fmesh.context.store.pulse import Pulse, pulse_seconds, silent_seconds
from fmesh.context.store.rendezvous import START_LOOK_GAP_SECONDS
from fmesh.errors import GroupTimeoutError, LaunchError, MeshMismatchError, RankLostError, RecoveryError
from fmesh.layout.int_tuple import is_int

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MAX_COUNT = 2**31 - 1  # torch numbers ranks (and counts them) with 32-bit ints


def _check_count(label: str, value: object) -> None:
    if value is not None and (not is_int(value) or not 0 <= value <= MAX_COUNT):
        raise ValueError(f"{label} must be an int in 0..2**31 - 1 (torch numbers ranks with 32-bit ints), got "
                         f"{value!r}")


def check_device(device: object, dry_run: bool = False) -> torch.device | None:
    """``device`` as a ``torch.device`` this process has (``None`` stays ``None``); ``TypeError``/``ValueError``
    naming it and the choices otherwise, before any process group exists. An index is this rank's device
    (``cuda:LOCAL_RANK`` differs between ranks, as it should). A ``dry_run`` (the fake backend) may name
    a device this machine lacks: it only describes one.

    >>> check_device("cpu"), check_device(None)
    (device(type='cpu'), None)
    """
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device such as 'cpu' or 'cuda:0', got {device!r}")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device {device!r} is not a device torch knows; expected 'cpu', 'cuda' or 'cuda:N' "
                         "(or another backend's type, such as 'xpu')") from None
    if parsed.type == "meta":
        raise ValueError("device 'meta' holds no data, so no collective can run on it; use 'cpu' or 'cuda:N'")
    if parsed.type == "cuda" and not dry_run:
        count = torch.cuda.device_count()
        if parsed.index is None and count:
            parsed = torch.device("cuda", torch.cuda.current_device())
        if not count or (parsed.index is not None and parsed.index >= count):
            raise ValueError(f"device {device!r}, but this process sees {count} CUDA devices; pass 'cpu', or a "
                             f"device from cuda:0 to cuda:{max(count - 1, 0)}")
    return parsed


def _launcher_int(environ: Mapping[str, str], name: str, low: int) -> int:
    raw = environ[name]
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if value < low:
        raise ValueError(f"the launcher's {name}={raw!r} is not an int >= {low}; check how this process was started "
                         "(torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)")
    return value


def check_launcher_environment(environ: Mapping[str, str]) -> None:
    """``ValueError`` at once for a launcher environment no rank can start from (``RANK=abc``,
    ``WORLD_SIZE=-3``, ``RANK`` outside ``WORLD_SIZE``), naming the variable, before any group exists.

    >>> check_launcher_environment({"RANK": "4", "WORLD_SIZE": "4", "MASTER_PORT": "29500"})
    Traceback (most recent call last):
    ...
    ValueError: the launcher's RANK=4 is outside WORLD_SIZE=4: valid ranks are 0..3; check how this process was started
    """
    world = _launcher_int(environ, "WORLD_SIZE", 1) if "WORLD_SIZE" in environ else None
    rank = _launcher_int(environ, "RANK", 0) if "RANK" in environ else None
    if "MASTER_PORT" in environ and not 0 < _launcher_int(environ, "MASTER_PORT", 1) < 65536:
        raise ValueError(f"the launcher's MASTER_PORT={environ['MASTER_PORT']!r} is not a TCP port (1..65535)")
    if "LOCAL_RANK" in environ:
        _launcher_int(environ, "LOCAL_RANK", 0)
    if world is not None and rank is not None and rank >= world:
        raise ValueError(f"the launcher's RANK={rank} is outside WORLD_SIZE={world}: valid ranks are 0..{world - 1}; "
                         "check how this process was started")


def checked_launch(environ: Mapping[str, str]) -> None:
    """:func:`check_launcher_environment`; a bad environment is also reported to the job's other processes
    through its store, when ``MASTER_ADDR`` and ``MASTER_PORT`` reach it, so that they stop waiting for this one.

    >>> checked_launch({"RANK": "1", "WORLD_SIZE": "2"})
    """
    try:
        check_launcher_environment(environ)
    except ValueError as error:
        rendezvous.report_bad_environment(environ, error)
        raise


@attrs.frozen
class Met:
    """What the start's meeting gave a rank: the job's ``store``, its ``rank``, the ``world_size``, the ``epoch`` of
    the Context it starts (its number among the contexts of its name: it numbers the meeting) and the ``meeting``'s
    keys."""

    store: dist.Store
    rank: int
    world_size: int
    epoch: int
    meeting: keys.MeetingKeys
    # This rank's heartbeat, from its arrival at the meeting (its context's board beats on with it).
    pulse: Pulse | None = attrs.field(default=None, eq=False, repr=False)
    # A watcher's watch of the others' heartbeats while torch sets up the default group (stopped once it is).
    vigil: Vigil | None = attrs.field(default=None, eq=False, repr=False)

    def stop_watching(self) -> None:
        """End the watch of the others' heartbeats (the start is over)."""
        if self.vigil is not None:
            self.vigil.stop()

    def silent(self, waited: float) -> list[Silent]:
        """The ranks that came and whose heartbeats a watcher saw stand still since (:func:`~fmesh.context.store.
        arrivals.silence`), looked for each second for up to ``waited`` seconds (a set-up that failed at once gives
        the watchers a heartbeat's silence to see it)."""
        deadline = time.monotonic() + waited
        while True:
            with contextlib.suppress(Exception):  # the store may be gone: the set-up's own error says so
                quiet = silence(self.store, self.meeting)
                if quiet or time.monotonic() >= deadline:
                    return quiet
            if time.monotonic() >= deadline:
                return []
            time.sleep(1.0)


def _met(environ: Mapping[str, str], rank: int | None, world_size: int | None, timeout: timedelta,
         agenda: str = "", options: Mapping[str, str] | None = None, name: str = "fmesh") -> Met:
    """The job's store, this rank and the world size, once every rank has come (``env://``), meaning ``agenda`` and
    ``options``; the meeting is numbered by the epoch of the Context ``name`` it starts (one ``add``, which numbers
    that Context too). A rank that fails while the others wait for it (any error but the ones the rendezvous reports
    itself) posts its error first, so that they stop waiting at once; a rank whose process the launcher saw end
    (:func:`launcher_ended`) ends the wait too, and so does a rank that came whose heartbeat (started as it arrived:
    :attr:`Met.pulse`) stood still."""
    try:
        store, rank, world_size = rendezvous.open_store(environ, rank, world_size, timeout)
    except ValueError as error:
        rendezvous.report_bad_environment(environ, error)
        raise
    except LaunchError as error:  # MASTER_PORT taken: a rank 0 of this job may host the store there (RANK=0 twice)
        rendezvous.report_bad_environment(environ, error, host=False)
        raise
    epochs: list[int] = []
    beating: list[Pulse] = []
    watching: list[Vigil] = []

    def numbered() -> keys.MeetingKeys:  # the Context's epoch, counted where its later contexts count theirs
        epochs.append(int(dist.PrefixStore(keys.DEFAULT_GROUP, store).add(keys.contexts_made(name, rank), 1)) - 1)
        return keys.starting(name, epochs[0])

    try:
        meeting = rendezvous.meet(store, rank=rank, world_size=world_size, timeout=timeout,
                                  hosts=rendezvous.hosts_store(environ, rank), agenda=agenda, options=options,
                                  gone=launcher_ended(store, world_size), numbered=numbered, beating=beating,
                                  watching=watching)
    except (ValueError, LaunchError, RankLostError, GroupTimeoutError, MeshMismatchError):  # reported, or another's
        _stop(beating, watching)
        raise
    except Exception as error:
        _stop(beating, watching)
        with contextlib.suppress(Exception):  # the report is a courtesy: this process's own error matters more
            rendezvous.post_failure(store, {k: environ[k] for k in rendezvous.ENVIRONMENT if k in environ}, error)
        raise
    return Met(store, rank, world_size, epochs[0], meeting, beating[0] if beating else None,
               watching[0] if watching else None)


def _stop(pulses: Sequence[Pulse | None], watching: Sequence[Vigil] = ()) -> None:
    """End the heartbeats of a start that failed (and a watcher's watch of the others')."""
    for pulse in pulses:
        if pulse is not None:
            pulse.stop()
    for vigil in watching:
        vigil.stop()


def launcher_ended(store: dist.Store, world_size: int) -> Callable[[], list[int]]:
    """The ranks of a world of ``world_size`` whose processes the launcher that hosts ``store`` saw end (none where
    no launcher says: torchrun's agent does not), each time it is called: one store operation."""
    root = _torch.root_store(store)
    return lambda: sorted(r for r in read_list(root, keys.ENDED_LIST) if r < world_size)


def _connected(rank: int, world_size: int, timeout: timedelta, gone: Callable[[], list[int]],
               after: tuple[dist.Store, keys.MeetingKeys] | None = None, beats: bool = False) -> None:
    """Return once every rank's default group has connected: each counts itself in after the meeting the ranks held
    just before (``after``: its store and keys; the start's, or a recovery's), two store operations per rank
    (:func:`~fmesh.context.store.rendezvous.count_connected`), or, where no meeting of fmesh's started the world (a
    store given), in a rendezvous of its own in the group's store. Without
    it a rank that finished connecting and left at once (its program done, or failed) cut a peer still connecting
    to it, which then failed inside torch's set-up with the backend's raw error: the default group's start race.
    Not where the default group connects nothing as it starts (NCCL without a bound device makes its communicator
    at the first collective): nothing races then. ``beats``: the ranks beat at the places of arrival of the meeting
    ``after`` (the start's), and the watchers name one that stands still."""
    if str(dist.get_backend()) == "nccl" and _torch.bound_device() is None:
        return
    if after is not None:
        rendezvous.count_connected(*after, rank=rank, world_size=world_size, timeout=timeout, gone=gone, beats=beats)
        return
    store = dist.PrefixStore(keys.CONNECTED, _torch.default_store())
    rendezvous.meet(store, rank=rank, world_size=world_size, timeout=timeout, gone=gone)


def _set_up_timed_out(error: BaseException) -> bool:
    """Whether torch's set-up of a default group failed for want of time (the store's wait, gloo's connection).

    >>> _set_up_timed_out(RuntimeError("Gloo connectFullMesh failed with [pair.h:311] Connect timeout [none]"))
    True
    """
    return isinstance(error, dist.DistStoreError) or "timeout" in str(error).lower()


def local_gpu(environ: Mapping[str, str], count: int | None = None) -> torch.device:
    """``cuda:LOCAL_RANK``, once this host has a GPU for every local process; ``ValueError`` otherwise
    (every local rank raises it, before any process group exists).

    >>> local_gpu({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, count=2)
    device(type='cuda', index=1)
    """
    visible = torch.cuda.device_count() if count is None else count
    local_rank = int(environ.get("LOCAL_RANK", "0"))
    processes = int(environ.get("LOCAL_WORLD_SIZE", local_rank + 1))
    if max(processes, local_rank + 1) > visible:
        shown = environ.get("CUDA_VISIBLE_DEVICES")
        raise ValueError(
            f"expected a GPU for each of the {processes} processes on this host, but it has {visible} visible"
            f"{f' (CUDA_VISIBLE_DEVICES={shown})' if shown is not None else ''}; start at most {visible} processes "
            f"per host (torchrun --nproc-per-node {visible}), or pass backend='gloo' to run them on the CPU"
        )
    return torch.device("cuda", local_rank)


def _default_device(backend: str) -> torch.device:
    if backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@attrs.frozen
class World:
    """This process: ``rank`` of ``world_size``, its ``device``, ranks per host, and whether it
    initialised (and so owns) the default process group.

    ``epoch`` numbers the contexts of one ``name`` alike on every rank, so that a group created
    again after ``close()`` never meets the rendezvous keys of the old one; ``generation`` counts the
    recoveries (:meth:`fmesh.Context.recover`) that led to this world, so that its groups' names never
    meet those of the groups it kept.
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    local_world_size: int
    name: str
    epoch: int
    owns_default_group: bool
    generation: int = 0
    # What the ranks agreed on in the start's meeting besides the world size (fmesh's env:// rendezvous: the
    # description of the groups of the meshes they start with), or "" where no such meeting ran.
    agreed_at_start: str = ""
    # The Context options the ranks agreed on in that meeting (JSON), or "" where none ran: its context agrees on
    # none again, and each of its ranks is known to have come (its status board need not say so).
    options_at_start: str = ""
    # This rank's heartbeat since it came to the start's meeting (fmesh's env:// rendezvous), which its context's
    # board beats on with (:meth:`board`); None where no such meeting ran.
    pulse: Pulse | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def namespace(self) -> str:
        """What the names of this world's groups start with: its name, epoch and generation."""
        return f"{self.name}:{self.epoch}" + (f"+{self.generation}" if self.generation else "")

    @property
    def fake(self) -> bool:
        """Torch's ``fake`` backend: no communication (a dry run, or :func:`fmesh.simulate`)."""
        return self.backend == "fake"

    @classmethod
    def start(
        cls, *, rank: int | None = None, world_size: int | None = None, backend: str | None = None,
        device: torch.device | str | None = None, gpus_per_node: int | None = None, name: str = "fmesh",
        store: dist.Store | None = None, init_method: str | None = None, timeout: timedelta = DEFAULT_TIMEOUT,
        generation: int = 0, agenda: Callable[[str], tuple[str, Mapping[str, str]]] | None = None,
        connect_timeout: timedelta | None = None,
        gone: Callable[[], list[int]] | None = None, met_before: keys.MeetingKeys | None = None,
    ) -> World:
        """Join the default process group, initialising it first if nobody has.

        Every argument is checked before the default group is touched. ``agenda``: given the backend the world
        will have, what else the ranks must mean as they start (the description of the groups of their meshes, and
        their Context's wire-relevant options), compared in fmesh's env:// rendezvous where it runs
        (:attr:`agreed_at_start` and :attr:`options_at_start` then hold them). Torch's set-up of the default group
        (its rendezvous and connections) is bounded by ``connect_timeout`` (the creation timeout), not by the
        collectives' ``timeout``: a rank that dies inside it costs the others that, not 10 minutes. Then the ranks
        wait until every one has connected (:func:`_connected`; ``gone`` names the ranks whose processes ended, the
        launcher's marks by default; ``met_before``: the keys of a meeting the ranks held in ``store`` just before, a
        recovery's, after which they count their connections).
        """
        backend = normalize_backend(backend)
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"name must be a non-empty string without '/', got {name!r}")
        for label, value in (("rank", rank), ("world_size", world_size), ("gpus_per_node", gpus_per_node)):
            _check_count(label, value)
        if world_size is not None and rank is not None and rank >= world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}: valid ranks are 0..{world_size - 1}")
        checked_device = check_device(device, dry_run=backend == "fake")
        launched = store is None and init_method in (None, "env://")  # torch's default: env://
        if init_method == "env://" or (launched and rank is None):
            checked_launch(os.environ)
        owns = not dist.is_initialized()
        chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")  # torch's own default
        agreed, options, met = "", None, None
        after = (store, met_before) if store is not None and met_before is not None else None
        if owns and launched and backend != "fake":
            # fmesh's own env:// rendezvous: the ranks meet in the store by polling, so that a rank that cannot
            # start ends its peers' wait at once; torch's then runs with every rank present.
            agreed, options = agenda(chosen) if agenda is not None else ("", None)
            met = _met(os.environ, rank, world_size, timeout, agreed, options, name)
            rank, world_size = met.rank, met.world_size
            store = dist.PrefixStore(keys.DEFAULT_GROUP, met.store)  # the namespace torch's env:// gives it
            after = (met.store, met.meeting)
            init_method = None
            # Every rank has come: torch's set-up takes seconds, and a rank that dies inside it costs the others
            # this bound, not the creation timeout (where the timeout can be raised back after: a torch without the
            # setter runs fmesh but lazy groups, and connects under the collectives' timeout).
            if _torch.timeout_settable():
                connect_timeout = min(connect_timeout or timeout, connect_bound(world_size))
        try:
            if owns:
                connecting = timeout if connect_timeout is None else min(timeout, connect_timeout)
                setting_up = time.monotonic()
                try:
                    dist.init_process_group(
                        backend=chosen,
                        init_method=init_method,
                        rank=-1 if rank is None else rank,
                        world_size=-1 if world_size is None else world_size,
                        store=store,
                        timeout=connecting,
                    )
                except RuntimeError as error:  # a recovered world's caller names the ranks that ended (a RecoveryError)
                    # The watchers see who died in a silence from the death, at most the set-up's time before: a
                    # look's gap more past whatever of that silence the set-up did not already last.
                    watch = silent_seconds(met.world_size) if met is not None else 0.0
                    lasted = time.monotonic() - setting_up
                    if met is not None and met.pulse is not None and (quiet := met.silent(
                            START_LOOK_GAP_SECONDS + max(0.0, watch - lasted))):
                        raise rendezvous.silent_error(quiet, met.rank, "while torch set up the job's default "
                                                      f"group ({type(error).__name__})") from error
                    if generation or not _set_up_timed_out(error):
                        raise
                    cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                    raise GroupTimeoutError(
                        f"on rank {rank}: torch's set-up of the job's default group did not complete within "
                        f"{connecting.total_seconds():g}s ({type(error).__name__}: {cause}): a rank died inside it, "
                        f"or this machine is too loaded to connect {world_size} processes in that time. See the other "
                        "ranks' errors first; raise creation_timeout if the machine is only slow") from error
                if connecting < timeout and backend != "fake":
                    _torch.set_group_timeout(None, timeout)
                if backend != "fake" and dist.get_world_size() > 1:
                    _connected(dist.get_rank(), dist.get_world_size(), connecting,
                               gone or launcher_ended(_torch.default_store(), dist.get_world_size()), after,
                               beats=met is not None and met.pulse is not None)
            if met is not None:
                met.stop_watching()
            elif world_size is not None and world_size != dist.get_world_size():
                raise ValueError(
                    f"world_size={world_size}, but the default group already has {dist.get_world_size()} ranks"
                )
        except BaseException:
            if met is not None:
                met.stop_watching()
                _stop([met.pulse])
            raise
        backend = backend or str(dist.get_backend())
        size = int(dist.get_world_size())
        epoch = met.epoch if met is not None else 0  # counted as the start's meeting was numbered
        if backend != "fake" and met is None:
            # The n-th context of this name on each rank is the n-th on every rank (SPMD order), whenever each
            # rank makes it: a count per rank, not one shared count that assumes the ranks move in lockstep.
            epoch = _torch.default_store().add(keys.contexts_made(name, dist.get_rank()), 1) - 1
        return cls(
            rank=int(dist.get_rank()),
            world_size=size,
            backend=backend,
            device=checked_device if checked_device is not None else _default_device(backend),
            local_world_size=gpus_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", size)),
            name=name,
            epoch=epoch,
            owns_default_group=owns,
            generation=generation,
            agreed_at_start=agreed,
            options_at_start=json.dumps(dict(options), sort_keys=True) if options is not None else "",
            pulse=met.pulse if met is not None else None,
        )

    @classmethod
    def from_env(cls, *, backend: str | None = None, timeout: timedelta = DEFAULT_TIMEOUT, **kwargs: Any) -> World:
        """Under ``torchrun`` (any ``env://`` launch): NCCL with CUDA else gloo, bound to ``cuda:LOCAL_RANK``.
        With none of the launcher's variables set, a world of one in this process (one line on stderr
        says so), so that one script runs under ``python`` and under ``torchrun``. Under ``srun`` the launcher's
        variables missing are derived from Slurm's (:func:`fmesh.context.slurm.launcher_variables`)."""
        if not dist.is_initialized():
            os.environ.update(slurm.launcher_variables(os.environ))
        missing = [v for v in LAUNCHER_VARIABLES if v not in os.environ]
        alone = len(missing) == len(LAUNCHER_VARIABLES) and not dist.is_initialized()
        if missing and not alone and not dist.is_initialized():
            error = ValueError(
                f"Context.from_env needs the launcher's environment variables {missing}, or none of "
                f"{list(LAUNCHER_VARIABLES)} for a world of one; start the program with torchrun (e.g. torchrun "
                "--nproc-per-node 4 train.py), with plain python, or use Context(...) explicitly"
            )
            rendezvous.report_bad_environment(os.environ, error)
            raise error
        checked_launch(os.environ)
        backend = normalize_backend(backend) or ("nccl" if torch.cuda.is_available() else "gloo")
        device: torch.device | None = None
        if backend == "nccl":
            device = local_gpu(os.environ)
            torch.cuda.set_device(device)
        if alone:
            print(f"fmesh: no launcher variables ({', '.join(LAUNCHER_VARIABLES)}): a world of one process, "
                  f"rank 0, {backend} on {device or 'cpu'}; start it with torchrun for more", file=sys.stderr,
                  flush=True)
            return cls.start(backend=backend, rank=0, world_size=1, store=dist.HashStore(), timeout=timeout,
                             device=device, **kwargs)
        return cls.start(backend=backend, init_method="env://", timeout=timeout, device=device, **kwargs)

    def hand_over(self) -> World:
        """Abort the default group and every group a recovery did not take, at once (one torch call), and the
        same world, which no longer ends a default group: the next generation's is another world's."""
        _torch.abort_group(None)
        return attrs.evolve(self, owns_default_group=False)

    def renewed(self, survivors: tuple[int, ...], lost: Sequence[int], store: dist.Store, timeout: timedelta,
                meet_timeout: timedelta, ended: Callable[[list[int], bool], list[int]]) -> World:
        """The world a recovery makes of ``survivors`` (old ranks, in new rank order; this rank among them), the
        ``lost`` ranks gone: its default group started on ``store`` (a namespace of the old store of its own), the
        next generation.

        The survivors first meet in ``store`` (:func:`fmesh.context.rendezvous.meet`, within ``meet_timeout``;
        ``ended`` names the old ranks whose processes the launcher saw end): torch's rendezvous would wait the
        whole ``timeout`` for a survivor that died after agreeing, then raise a raw store error. A survivor that
        never comes is one :class:`~fmesh.RecoveryError` naming it."""
        rank, world_size = list(survivors).index(self.rank), len(survivors)

        def gone() -> list[int]:  # old ranks: what the launcher marked, a status or a heartbeat says
            return ended(list(survivors), False)

        try:
            held = rendezvous.meet(store, rank=rank, world_size=world_size, timeout=meet_timeout, gone=gone)
            return World.start(backend=self.backend, rank=rank, world_size=world_size, store=store, timeout=timeout,
                               device=self.device, gpus_per_node=min(self.local_world_size, world_size),
                               name=self.name, generation=self.generation + 1,
                               connect_timeout=min(meet_timeout, connect_bound(world_size)), gone=gone,
                               met_before=held)
        except (RuntimeError, ValueError, GroupTimeoutError) as error:  # a survivor died after the vote, or in torch's
            failure = error                                             # set-up, or never came
            with contextlib.suppress(Exception):  # a half-made default group would be joined by the next try
                if dist.is_initialized():
                    _torch.abort_group(None)
            dead: list[int] = []
            with contextlib.suppress(Exception):  # the store may be gone: then its host is what died
                # Where torch timed out waiting, watched a few seconds: who died in its set-up? (Never on the rank
                # whose own set-up raised: it goes at once, and its launcher's mark names it to the others.)
                dead = ended(list(survivors), _set_up_timed_out(error))
            if isinstance(error, (RankLostError, GroupTimeoutError)):
                cause = f"{error} (ranks by their old number)"
            else:
                cause = (f"ranks {dead} ended while torch set it up ({type(error).__name__}: {error})" if dead else
                         f"torch's set-up of it failed: {type(error).__name__}: {error}")
        raise RecoveryError(f"on rank {self.rank}: the survivors agreed to recover without {list(lost)}, but their new "
                            f"world could not start: {cause}. Recover again without those ranks too, or restart the "
                            "job") from failure

    def board(self, creation_timeout: timedelta, options: Mapping[str, str]) -> Board | None:
        """This rank's status board for one context of this world (``None`` on the fake backend, whose store cannot be
        used), on a store connection of its own, once the ranks agree on the context's wire-relevant ``options``:
        in the start's meeting, where it carried them (:attr:`options_at_start`: no store operation more, and the
        ranks all came, so a rank that posted no status runs), else now
        (:meth:`~fmesh.context.store.board.Board.agree_options`). A rank that means others there raises
        ``ValueError`` naming each field that differs, having posted that error and aborted the default group this
        world made: the peers waiting for it raise ``RankLostError`` with that error."""
        if self.fake:
            return None
        store = _torch.store_client(self.store())
        agreed = self.options_at_start == json.dumps(dict(options), sort_keys=True)  # in the start's meeting
        prefix, beating = keys.context_prefix(self.name, self.epoch), []
        if self.pulse is not None:  # the start's heartbeat beats on as the board's (a connection to its store)
            self.pulse.retarget(store, keys.Keys(prefix).beat(self.rank))
            beating.append(self.pulse)
        connect = min(creation_timeout, connect_bound(self.world_size))
        board = Board(store, prefix, self.rank, creation_timeout, pulse=beating,
                      beat_every=pulse_seconds(self.world_size),
                      set_up_seconds=tries_bound(connect).total_seconds(),
                      launcher_store=_torch.root_store(store) if self.generation == 0 else None, present=agreed).open()
        try:
            if not agreed:
                board.agree_options(options)
        except ValueError as error:
            board.leave(aborted=True, error=error)
            if self.close(abort=True):
                gc.collect()  # the C++ group ends here, not at interpreter exit
            raise
        return board

    def store(self) -> dist.Store:
        """The default group's store, where group creation rendezvous and agreement happen."""
        return _torch.default_store()

    def close(self, abort: bool = False) -> bool:
        """End the default group if this world initialised it: destroy it, or abort it (no waiting).
        Whether it ended one (then the caller collects garbage, so the C++ group goes while the interpreter
        is alive)."""
        if self.pulse is not None:  # a board that took it stopped it already (a start whose context never made one)
            self.pulse.stop()
        if not (self.owns_default_group and dist.is_initialized()):
            return False
        if abort:
            _torch.abort_group(None)
        else:
            dist.destroy_process_group()
        return True
