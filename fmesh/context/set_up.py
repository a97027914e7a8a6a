"""How long torch's set-up of a group may take, and how long a death inside it holds the other members.

The members of a group meet in the store (fmesh's rendezvous, or its agreement) before torch sets the group up, so
the set-up takes milliseconds; a member that dies inside it holds the others in torch's C++, which nothing can
interrupt. gloo holds the others five of the connect timeout it was given (:func:`set_up_bound`), so fmesh sets a
gloo group up in tries (:func:`connect_tries`): a short first one, after which a death is named within 30 s, then,
where that one failed with nobody lost (a slow name server, a loaded machine), :func:`connect_bound`.

>>> [set_up_bound(connect).total_seconds() for connect in connect_tries(connect_bound(8))]
[15.0, 75.0]
"""

from __future__ import annotations

from datetime import timedelta

# How long torch's set-up of a recovered world's default group may take: the survivors met in fmesh's rendezvous just
# before, so it takes milliseconds; a survivor that dies inside it (the others block in torch's C++, which nothing
# can tell) costs the others this, not the creation timeout (2 minutes by default). The survivors may then recover
# again without it.
NEW_WORLD_CONNECT = timedelta(seconds=15)
# How much longer a world of many ranks may take to connect, per rank (gloo connects every pair): 15 s up to 1,000.
CONNECT_PER_RANK = timedelta(seconds=0.015)
# A member's death inside gloo's set-up of a group ends the other members' set-up after five of the connect timeouts
# torch was given, whatever the group's size: their connections wait on each other in turn (measured: 5.0 timeouts for
# groups of 3 to 16, on torch 2.10, 2.13 and 2.15; `python bench/gloo_set_up.py`). A shorter timeout alone would end
# it sooner, but fails healthy set-ups where the name server is slow (docs/guides/failures.md): hence the tries.
GLOO_SET_UP_WAITS = 5
# The connect timeout of the first try at a gloo group's set-up: the members met just before, so a healthy set-up takes
# milliseconds; a death inside it holds the others five of this (15 s), and the agreement that follows names it
# (fmesh.context.creation). A try that fails with nobody lost is made once more, with connect_bound.
FIRST_TRY_CONNECT = timedelta(seconds=3)


def connect_bound(world_size: int) -> timedelta:
    """The connect timeout torch's set-up of a group of ``world_size`` ranks that just met in fmesh's rendezvous (or
    agreed on it) is given: :data:`NEW_WORLD_CONNECT`, more for a world past 1,000 ranks, not the creation timeout
    (2 minutes by default) nor the collectives' (10 minutes).

    >>> connect_bound(8).total_seconds(), connect_bound(4096).total_seconds()
    (15.0, 61.44)
    """
    return max(NEW_WORLD_CONNECT, CONNECT_PER_RANK * world_size)


def set_up_bound(connect: timedelta) -> timedelta:
    """How long gloo's set-up of a group, given the connect timeout ``connect``, may hold a member after a death
    inside it: :data:`GLOO_SET_UP_WAITS` of them.

    >>> set_up_bound(timedelta(seconds=12)).total_seconds()
    60.0
    """
    return GLOO_SET_UP_WAITS * connect


def connect_tries(connect: timedelta) -> tuple[timedelta, ...]:
    """The connect timeouts of the tries at a gloo group's set-up whose bound is ``connect``: :data:`FIRST_TRY_CONNECT`,
    then ``connect`` (where that one failed with nobody lost).

    >>> [connect.total_seconds() for connect in connect_tries(timedelta(seconds=15))]
    [3.0, 15.0]
    >>> [connect.total_seconds() for connect in connect_tries(timedelta(seconds=2))]
    [2.0]
    """
    return (FIRST_TRY_CONNECT, connect) if connect > FIRST_TRY_CONNECT else (connect,)


def tries_bound(connect: timedelta) -> timedelta:
    """How long gloo may hold a member in the set-up of a group, in all its tries (:func:`connect_tries`), after a
    death inside it: :func:`set_up_bound` of each.

    >>> tries_bound(timedelta(seconds=15)).total_seconds()
    90.0
    """
    return sum((set_up_bound(each) for each in connect_tries(connect)), timedelta())
