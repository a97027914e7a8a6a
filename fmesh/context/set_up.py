"""How long torch's set-up of a group may take, and the timeout fmesh gives it for that.

The members of a group meet in the store (fmesh's rendezvous, or its agreement) before torch sets the group up, so
the set-up takes milliseconds; a member that dies inside it holds the others in torch's C++, which nothing can
interrupt, for as long as torch was told to wait. :func:`connect_bound` is what fmesh lets that cost, and
:func:`gloo_wait` the timeout that keeps gloo within it.

>>> from datetime import timedelta
>>> gloo_wait(connect_bound(8)).total_seconds(), set_up_bound(connect_bound(8)).total_seconds()
(3.0, 15.0)
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
# groups of 3 to 16, on torch 2.10, 2.13 and 2.15; `python bench/gloo_set_up.py`). So fmesh gives gloo a fifth of
# the time a set-up may take.
GLOO_SET_UP_WAITS = 5
# The shortest connect timeout fmesh gives gloo: one member's wait for another's address or connection, milliseconds
# after the agreement just before, but a loaded machine can keep a process off the CPU for a second.
GLOO_WAIT_FLOOR = timedelta(seconds=2)


def connect_bound(world_size: int) -> timedelta:
    """How long torch's set-up of a group of ``world_size`` ranks that just met in fmesh's rendezvous (or agreed on
    it) may take: :data:`NEW_WORLD_CONNECT`, more for a world past 1,000 ranks. A member that dies inside it costs
    the others this, not the creation timeout (2 minutes by default) nor the collectives' (10 minutes).

    >>> connect_bound(8).total_seconds(), connect_bound(4096).total_seconds()
    (15.0, 61.44)
    """
    return max(NEW_WORLD_CONNECT, CONNECT_PER_RANK * world_size)


def gloo_wait(bound: timedelta) -> timedelta:
    """The connect timeout to give gloo so that its set-up of a group ends within ``bound`` when a member dies inside
    it: a fifth of ``bound`` (:data:`GLOO_SET_UP_WAITS`), and not under :data:`GLOO_WAIT_FLOOR` unless ``bound`` is.

    >>> [gloo_wait(timedelta(seconds=s)).total_seconds() for s in (15, 5, 1)]
    [3.0, 2.0, 1.0]
    """
    return max(bound / GLOO_SET_UP_WAITS, min(bound, GLOO_WAIT_FLOOR))


def set_up_bound(bound: timedelta) -> timedelta:
    """How long gloo's set-up of a group, given :func:`gloo_wait` of ``bound``, may hold a member after a death inside
    it: ``bound``, or more where the floor lifted the wait.

    >>> [set_up_bound(timedelta(seconds=s)).total_seconds() for s in (15, 5)]
    [15.0, 10.0]
    """
    return GLOO_SET_UP_WAITS * gloo_wait(bound)
