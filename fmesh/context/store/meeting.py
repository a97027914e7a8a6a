"""The one meeting of fmesh's store protocols: the members of a group (an agreement, a roll call, the survivors of a
recovery, the ranks of a job starting) each compare what they mean with the first member's, count themselves in,
and block ONCE on the verdict, which every outcome writes (the last to arrive ``ok``; a member that disagrees, a
watcher that sees a member gone, a timeout: the reason). A constant number of store operations per member however
many members and however long the wait:

1. ``compare_set(<base>/<compared>, "", mine)``: the first member's value stays, and comes back to every member;
2. ``add(<base>/<arrivals>, 1)``: the member that brings the count to the group's size writes the verdict;
3. one blocking ``get`` of ``<base>/<verdict>`` (:meth:`fmesh.context.store.wait.Waiter.wait_for`).

>>> meeting = Meeting(dist.HashStore(), MeetingKeys("doc"), size=1)
>>> meeting.compare("mine"), meeting.arrive(), meeting.verdict()
('mine', 1, b'ok')
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch.distributed as dist

from fmesh.context.store.keys import MeetingKeys
from fmesh.context.store.records import OK
from fmesh.context.store.wait import WATCHERS, Waiter


@attrs.frozen
class Meeting:
    """The meeting of ``size`` members at ``keys`` in ``store``."""

    store: dist.Store
    keys: MeetingKeys
    size: int

    def compare(self, mine: str) -> str:
        """Step 1: what the first member to come means (``mine`` where this member is the first)."""
        return bytes(self.store.compare_set(self.keys.compared, "", mine)).decode()

    def arrive(self, complete: str | None = OK) -> int:
        """Step 2: count this member in; where that makes ``size``, write the verdict ``complete`` (``None``: the
        caller decides, as the last survivor of a recovery does). This member's place in the order of arrival."""
        count = int(self.store.add(self.keys.arrivals, 1))
        if complete is not None and count >= self.size:
            self.decide(complete)
        return count

    def decide(self, verdict: str) -> bytes:
        """Write ``verdict`` unless one was written already; the verdict that stands."""
        return bytes(self.store.compare_set(self.keys.verdict, "", verdict))

    def wait(self, waiter: Waiter, seconds: float, look: Callable[[], bool] | None = None,
             doing: str = "waiting") -> bytes | None:
        """Step 3: the verdict, in one blocking read (``look``: a watcher's look past the first seconds); ``None``
        where none came within ``seconds`` (the caller writes its own, and reads the one that stands)."""
        return waiter.wait_for(self.keys.verdict, seconds, look, doing)

    def verdict(self) -> bytes:
        """The verdict written (it must be)."""
        return bytes(self.store.get(self.keys.verdict))

    def arrived(self) -> int:
        """How many members came so far."""
        return int(self.store.add(self.keys.arrivals, 0))


def watches(place: int) -> bool:
    """Whether the member that came ``place``-th watches the wait (the first :data:`WATCHERS` do).

    >>> watches(1), watches(3)
    (True, False)
    """
    return place <= WATCHERS
