"""How long torch's set-up of a group may take, and how long a death inside it holds the other members.

The members of a group meet in the store (fmesh's rendezvous, or its agreement) before torch sets the group up, so
the set-up takes milliseconds; a member that dies inside it holds the others in torch's C++, which nothing can
interrupt. torch is given :func:`connect_bound` as its connect timeout, and gloo then holds the others
:func:`set_up_bound` (five of those timeouts).

>>> set_up_bound(connect_bound(8)).total_seconds()
75.0
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
# groups of 3 to 16, on torch 2.10, 2.13 and 2.15; `python bench/gloo_set_up.py`). A shorter timeout would end it
# sooner, but fails healthy set-ups where the name server is slow (docs/guides/failures.md).
GLOO_SET_UP_WAITS = 5


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
