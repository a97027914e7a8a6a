"""Every key fmesh writes in a job's store, spelled in one place.

A Context's keys live under its namespace, ``fmesh/<name>/<epoch>`` (:class:`Keys`); the start rendezvous and the
launcher's marks live under ``fmesh/start`` and ``fmesh/ended``, outside any context. A meeting (an agreement, a
roll call, the recovery's vote, the start) has four keys of its own (:class:`MeetingKeys`): what the members
compare, their arrival count, and the verdict every member blocks on.

>>> keys = Keys("fmesh/job/0")
>>> keys.status(3), keys.agreement("d").verdict, keys.roll_call("barrier-world").arrivals
('fmesh/job/0/status/3', 'fmesh/job/0/agree/d/done', 'fmesh/job/0/roll/barrier-world/count')
"""

from __future__ import annotations

import hashlib

import attrs

START = "fmesh/start"
START_FAILED = f"{START}/failed"  # a bad rank's report: JSON with its error, the variables it read, host and pid
START_SEEN = f"{START}/failed/seen"  # how many waiting ranks read the report (its host stays up until they all have)
ENDED_LIST = "fmesh/ended/all"  # every rank the launcher saw end, "3,7,": one read tells a watcher about them all


@attrs.frozen
class MeetingKeys:
    """The keys of one meeting under ``base``: what the members compare (``compared``: the first member's value
    stays), how many came (``arrivals``) and the ``verdict`` every outcome writes."""

    base: str
    compared_name: str = "digest"
    arrivals_name: str = "arrived"
    verdict_name: str = "done"

    @property
    def compared(self) -> str:
        return self.under(self.compared_name)

    @property
    def arrivals(self) -> str:
        return self.under(self.arrivals_name)

    @property
    def verdict(self) -> str:
        return self.under(self.verdict_name)

    def under(self, *parts: object) -> str:
        """A key of the meeting's own (``members``, ``fate/3``, ...)."""
        return "/".join((self.base, *map(str, parts)))


def context_prefix(name: str, epoch: int) -> str:
    """The namespace of a Context's keys: its world's ``name`` and ``epoch`` (its number among the contexts made
    on that world).

    >>> context_prefix("job", 2)
    'fmesh/job/2'
    """
    return f"fmesh/{name}/{epoch}"


def contexts_made(name: str, rank: int) -> str:
    """How many contexts ``rank`` made on the world ``name`` (each takes the next epoch)."""
    return f"fmesh/{name}/contexts/{rank}"


def ended(rank: int) -> str:
    """Where a launcher that saw ``rank``'s process end says so, in the store it hosts (the key :func:`fmesh.launch`
    writes): a roll call stops waiting for a rank that can never answer. (A process that ends on its own posts the
    status ``exited`` itself; one killed cannot.)"""
    return f"fmesh/ended/{rank}"


def start(generation: int | str) -> MeetingKeys:
    """The keys of the ranks' ``generation``-th start rendezvous: they compare the world size, count themselves, and
    block on ``.../all``. A Context's start is numbered by its world's name and its epoch (:func:`starting`).

    >>> start(1).verdict
    'fmesh/start/1/all'
    """
    return MeetingKeys(f"{START}/{generation}", compared_name="world_size", verdict_name="all")


def starting(name: str, epoch: int) -> MeetingKeys:
    """The keys of the start rendezvous of the Context ``epoch`` of the world ``name`` (its number among the
    contexts of that name, :func:`contexts_made`, taken as the rank starts: a Context's start is the n-th on every
    rank).

    >>> starting("fmesh", 0).compared
    'fmesh/start/fmesh/0/world_size'
    """
    return start(f"{name}/{epoch}")


def connected(meeting: MeetingKeys) -> MeetingKeys:
    """The keys of the ranks' count of the default group's connections after the start ``meeting``: each adds itself
    once connected, and blocks on ``.../connected/all``.

    >>> connected(starting("fmesh", 0)).verdict
    'fmesh/start/fmesh/0/connected/all'
    """
    return MeetingKeys(meeting.under("connected"), verdict_name="all")


def arrival_beat(meeting: MeetingKeys, place: int) -> str:
    """The heartbeat of the rank that came ``place``-th to the start ``meeting``, from its arrival until its context's
    board beats its own (:mod:`fmesh.context.store.arrivals`): its value modulo the world size is that rank.

    >>> arrival_beat(starting("fmesh", 0), 3)
    'fmesh/start/fmesh/0/beat/3'
    """
    return meeting.under("beat", place)


def arrival_silence(meeting: MeetingKeys) -> str:
    """Where a watcher of the start ``meeting`` posts the ranks that came and stood still while torch set up the
    default group (:class:`~fmesh.context.store.arrivals.Vigil`)."""
    return meeting.under("silent")


CONNECTED = "fmesh/connected"  # the rendezvous of the connected ranks where no start of fmesh's numbered one
DEFAULT_GROUP = "default_pg"  # the namespace of the default group's store: the one torch's env:// rendezvous gives it


def start_claim(restarts: str, rank: int) -> str:
    """Which process claimed ``rank`` in the launcher's ``restarts``-th start of the workers."""
    return f"{START}/claims/{restarts}/{rank}"


def start_count(rank: int) -> str:
    """How many times ``rank`` started (the n-th start is the n-th on every rank)."""
    return f"{START}/inits/{rank}"


@attrs.frozen
class Keys:
    """The keys of one Context (``prefix``: :func:`context_prefix`); ``attempt``: which of its recoveries the
    recovery's keys are (a recovery retried after a :class:`~fmesh.RecoveryError` votes, and starts its new world,
    under keys of its own: the failed try's verdict and claims stay where they were).

    >>> Keys("fmesh/job/0").fate(3), Keys("fmesh/job/0", attempt=2).fate(3)
    ('fmesh/job/0/recovery-agreement/fate/3', 'fmesh/job/0/recovery-agreement/2/fate/3')
    """

    prefix: str
    attempt: int = 0

    def status(self, rank: int) -> str:
        """``rank``'s status (a :class:`~fmesh.context.store.records.Status`)."""
        return f"{self.prefix}/status/{rank}"

    def beat(self, rank: int) -> str:
        """``rank``'s heartbeat: a counter its pulse adds to every second (:mod:`fmesh.context.store.pulse`)."""
        return f"{self.prefix}/beat/{rank}"

    @property
    def finals(self) -> str:
        """The list of ranks whose status is final."""
        return f"{self.prefix}/finals"

    @property
    def options(self) -> str:
        """The context's wire-relevant options, as the first rank to start posted them (and who it was)."""
        return f"{self.prefix}/options"

    def agreement(self, key: str) -> MeetingKeys:
        """The agreement on the group at ``key`` (the digest of its content)."""
        return MeetingKeys(f"{self.prefix}/agree/{key}")

    def members(self, key: str) -> str:
        """The members of the group at ``key``, published by a watcher for the others' search for cycles."""
        return self.agreement(key).under("members")

    def roll_call(self, label: str) -> MeetingKeys:
        """The roll call ``label``: each member's answer under it (:meth:`answer`), the list of those who answered."""
        return MeetingKeys(f"{self.prefix}/roll/{label}", arrivals_name="count")

    def conclusion(self, label: str) -> str:
        """What the survivors of the failed group of roll call ``label`` conclude: the first to conclude writes it."""
        return self.roll_call(label).under("conclusion")

    def answer(self, label: str, rank: int) -> str:
        return self.roll_call(label).under(rank)

    def answered(self, label: str) -> str:
        return self.roll_call(label).under("answered")

    @property
    def recovery(self) -> MeetingKeys:
        """The survivors' vote on the ranks lost: they compare the lost set (the first survivor's stays)."""
        base = f"{self.prefix}/recovery-agreement" + (f"/{self.attempt}" if self.attempt else "")
        return MeetingKeys(base, compared_name="lost", arrivals_name="count")

    def fate(self, rank: int) -> str:
        """``rank``'s fate in the recovery: a survivor (it claims it) or fenced out (the last survivor's)."""
        return self.recovery.under("fate", rank)

    def held(self, group: str) -> str:
        """How many survivors hold the group whose digest is ``group``."""
        return self.recovery.under("held", group)

    @property
    def came_to_recover(self) -> str:
        """The list of survivors that came to recover."""
        return self.recovery.under("called")

    @property
    def cut(self) -> str:
        """The list of groups the survivors cut while they waited (closed by the last to come)."""
        return self.recovery.under("cut")

    @property
    def recovered(self) -> str:
        """The namespace of the store of the world a recovery makes."""
        return f"{self.prefix}/recovered" + (f"/{self.attempt}" if self.attempt else "")

    def refusals(self, group: str, rank: int) -> str:
        """How many collectives ``rank`` refused on itself on the torch group ``group``."""
        return f"{self.prefix}/refusals/{group}/{rank}"

    def guarded(self, rank: int) -> str:
        """How many failures ``rank`` explained in collectives fmesh did not run."""
        return f"{self.prefix}/guarded/{rank}"

    def call_meeting(self, group: str, meeting: int) -> MeetingKeys:
        """The ``meeting``-th meeting of the members' check of their calls on the group whose digest is ``group``:
        they compare the windows of their last calls (:mod:`fmesh.context.call_checks`)."""
        return MeetingKeys(f"{self.prefix}/calls/{group}/meet/{meeting}", compared_name="window")

    def calls_made(self, group: str, meeting: int, rank: int) -> str:
        """``rank``'s last calls, posted when that meeting found a difference (to name them)."""
        return self.call_meeting(group, meeting).under("calls", rank)

    def blocked(self, group: str) -> str:
        """The last call on the group that a member's watch saw it blocked in: its number, the member, the call."""
        return f"{self.prefix}/calls/{group}/blocked"

    def checkpoint(self, group: str, count: int) -> str:
        """The hashes of the calls up to ``count`` on the group (the first member's stays)."""
        return f"{self.prefix}/calls/{group}/checkpoint/{count}"

    def broken(self, group: str) -> str:
        """Why the group was cut after a checkpoint found a difference (the first member to find it)."""
        return f"{self.prefix}/calls/{group}/broken"


def digest(text: str) -> str:
    """A fixed-size digest of ``text``, the same in every process: what names a group's agreement, and what its
    members compare.

    >>> len(digest("Mesh(dp=2; world=2)"))
    32
    """
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
