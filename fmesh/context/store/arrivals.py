"""The heartbeats of the ranks that came to a start's meeting, before any context's board exists: a rank killed
after it arrived (in the meeting, or while the default group connects) is named within the death bound, not waited
for the whole timeout (10 minutes by default) as a rank that never came is.

Each rank's pulse starts as it arrives (:func:`~fmesh.context.store.rendezvous.meet`), beating the key of its place
of arrival (:func:`~fmesh.context.store.keys.arrival_beat`): ``world_size`` a beat, and its rank once, so the
counter's value modulo the world size names it. Nobody says who came: the watchers (the first two to arrive, who
watch the meeting anyway) know how many did (one ``add`` of 0), so they read the places ``1..arrived`` (one
``check`` where every one has beaten, one ``multi_get``): three store operations a look, whatever the world size,
and none before the wait is :data:`~fmesh.context.store.wait.FIRST_LOOK_SECONDS` old (a start that completes
in milliseconds pays nothing). A place counted whose key does not exist yet reads as 0 (its pulse's first beat, on
its own thread, comes milliseconds after the count): one that stands still for
:data:`~fmesh.context.store.pulse.SILENT_SECONDS` of the watcher's clock is gone.

>>> store = dist.HashStore(); meeting = MeetingKeys("doc")
>>> store.add(arrival_beat(meeting, 1), 4 + 2)  # rank 2 came first (a world of 4): its first beat
6
>>> watch = Arrivals(store, meeting, world_size=4, since=0.0)
>>> watch.silent(lambda: 1), watch.beats
([], {1: (6, ...)})
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import attrs
import torch.distributed as dist

from fmesh.context.store.board import absent
from fmesh.context.store.keys import MeetingKeys, arrival_beat, arrival_silence
from fmesh.context.store.pulse import silent_seconds
from fmesh.context.store.wait import FIRST_LOOK_SECONDS

SILENT = "silent"  # a verdict: the places of arrival that follow, in JSON, stood still (a heartbeat's silence)


@attrs.frozen
class Silent:
    """A place of arrival whose heartbeat stood still for ``seconds``: its ``rank`` (``None`` where it never beat,
    then it is one of ``candidates``, the ranks no beating place names)."""

    place: int
    rank: int | None
    seconds: float
    candidates: tuple[int, ...] = ()

    def describe(self) -> str:
        """What a waiting rank says of it.

        >>> Silent(3, 2, 12.4).describe()
        'rank 2 is gone: its heartbeat stood still for 12s (the 3rd to arrive)'
        """
        who = (f"rank {self.rank}" if self.rank is not None else
               f"the process of one of ranks {list(self.candidates[:16])}{'...' if len(self.candidates) > 16 else ''}")
        return f"{who} is gone: its heartbeat stood still for {self.seconds:.0f}s (the {ordinal(self.place)} to arrive)"


def ordinal(number: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``11th``...

    >>> ordinal(1), ordinal(12), ordinal(23)
    ('1st', '12th', '23rd')
    """
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


@attrs.frozen
class Arrivals:
    """A watcher's reads of the heartbeats of those who came to ``meeting`` (a start's, of ``world_size`` ranks),
    from ``since`` (its wait's start, on its monotonic clock)."""

    store: dist.Store
    meeting: MeetingKeys
    world_size: int
    since: float = attrs.field(factory=time.monotonic)
    # place -> (the counter, when this watcher first read that value); places whose key was seen (never taken back).
    beats: dict[int, tuple[int, float]] = attrs.field(factory=dict, eq=False, repr=False)
    born: set[int] = attrs.field(factory=set, eq=False, repr=False)

    def silent(self, arrived: Callable[[], int]) -> list[Silent]:
        """The places among the first ``arrived()`` (how many came: asked only past the first second) whose
        heartbeat stood still for :data:`~fmesh.context.store.pulse.SILENT_SECONDS` (none before the wait is
        :data:`~fmesh.context.store.wait.FIRST_LOOK_SECONDS` old)."""
        now = time.monotonic()
        if now - self.since < FIRST_LOOK_SECONDS:
            return []
        places = range(1, arrived() + 1)
        unknown = [place for place in places if place not in self.born]
        never = set(absent(self.store, unknown, lambda place: arrival_beat(self.meeting, place)))
        self.born.update(place for place in unknown if place not in never)
        beating = sorted(self.born)
        read = dict(zip(beating, self.store.multi_get([arrival_beat(self.meeting, place) for place in beating]),
                        strict=True))
        quiet = []
        for place in places:
            value = int(bytes(read[place])) if place in read else 0
            seen = self.beats.get(place)
            if seen is None or seen[0] != value:
                self.beats[place] = (value, now)
            elif now - seen[1] >= silent_seconds(self.world_size):
                quiet.append(place)
        if not quiet:
            return []
        named = {value % self.world_size for value, _ in self.beats.values() if value}
        candidates = tuple(rank for rank in range(self.world_size) if rank not in named)
        return [Silent(place, self.beats[place][0] % self.world_size if self.beats[place][0] else None,
                       now - self.beats[place][1], candidates if not self.beats[place][0] else ())
                for place in quiet]


class Vigil:
    """A watcher's watch of the heartbeats of every rank that came, once the meeting is over and torch sets up the
    default group (its thread blocked in C++, which nothing can tell): a look every ``every`` seconds past the first
    (three store operations, on ``store``: the watcher's pulse's connection, never blocked), until :meth:`stop`. A
    place that stands still is posted under :func:`~fmesh.context.store.keys.arrival_silence` (in the form of the
    meeting's verdict), where each rank whose set-up then fails reads who died (:func:`silence`)."""

    def __init__(self, store: dist.Store, meeting: MeetingKeys, world_size: int, every: float = 1.0) -> None:
        self.store, self.meeting, self.every = store, meeting, every
        self.arrivals = Arrivals(store, meeting, world_size)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fmesh-vigil", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                quiet = self.arrivals.silent(lambda: self.arrivals.world_size)
                if quiet:
                    self.store.compare_set(arrival_silence(self.meeting), "", silenced(quiet))
                    return
            except Exception:  # the store is gone: the set-up's own error says so
                return

    def stop(self) -> None:
        """End the watch (at once: its thread ends at its next wake-up)."""
        self.stopped.set()


def silenced(quiet: list[Silent]) -> str:
    """The verdict that says the places ``quiet`` stood still.

    >>> silenced([Silent(1, 2, 11.0)])
    'silent [{"place": 1, "rank": 2, "seconds": 11.0, "candidates": []}]'
    """
    return f"{SILENT} {json.dumps([attrs.asdict(place) for place in quiet])}"


def silent_in(outcome: str | None) -> list[Silent]:
    """The places a verdict ``outcome`` says stood still (none where it says something else).

    >>> silent_in(silenced([Silent(1, 2, 11.0)]))[0].describe()
    'rank 2 is gone: its heartbeat stood still for 11s (the 1st to arrive)'
    """
    if outcome is None or not outcome.startswith(SILENT):
        return []
    return [Silent(**{**fields, "candidates": tuple(fields.get("candidates", ()))})
            for fields in json.loads(outcome.removeprefix(SILENT))]


def silence(store: dist.Store, meeting: MeetingKeys) -> list[Silent]:
    """The places a watcher's :class:`Vigil` found silent after ``meeting`` (one ``check``; a ``get`` where some)."""
    key = arrival_silence(meeting)
    return silent_in(bytes(store.get(key)).decode()) if store.check([key]) else []
