"""A context's recoveries (:meth:`fmesh.Context.recover`), each of which may be tried again.

A recovery fails in one of two places, and either way the survivors can call ``recover`` again, with the ranks that
failed meanwhile added to the lost ones (the error names them):

* **the vote** (:func:`~fmesh.context.store.recovery_vote.agree_on_loss`): a survivor died or never came, or the
  survivors meant different lost ranks. Nothing was touched: the context is as it was. Each try votes under keys of
  its own (:attr:`~fmesh.context.store.keys.Keys.attempt`, the n-th try of this context, the n-th on every survivor:
  each gets the failed try's verdict): the failed try's claims and verdict stay where they were, so a second try
  is never told that the first one fenced it out.
* **the new world's start** (:meth:`~fmesh.context.world.World.renewed`): a survivor died after the vote. The context
  was handed over (its groups aborted or taken): a second ``recover`` on it votes again and starts another new world
  (under the try's own store namespace), keeping no group (every group is made anew). While it may still be tried
  again, the context's status says it recovers (a final status would have the others call it gone), and its exit
  hook stays; once a new world has started, it leaves its status board, and with it its store connection.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch.distributed as dist

from fmesh.context.options import GroupSettings
from fmesh.context.store import recovery_vote
from fmesh.context.store.board import Board
from fmesh.context.store.records import GONE_STATES
from fmesh.context.store.recovery_vote import HeldGroup
from fmesh.context.world import World
from fmesh.errors import RecoveryError


@attrs.define
class RecoveryTries:
    """A context's recoveries: how many it tried (``attempts``), the old world's ``store`` (kept from the first
    try: once the default group is aborted torch no longer holds it), the last try's ``ballot`` (the status board under
    that try's keys), and whether a try's new world ``failed_to_start`` (the context was handed over already).

    >>> tries = RecoveryTries()
    >>> tries.attempts, tries.failed_to_start
    (0, False)
    """

    attempts: int = 0
    store: dist.Store | None = None
    ballot: Board | None = None
    failed_to_start: bool = False

    def vote(self, world: World, board: Board, survivors: Sequence[int], lost: Sequence[int],
             groups: Sequence[HeldGroup]) -> dict[str, int]:
        """The survivors' vote on ``lost`` (:func:`~fmesh.context.store.recovery_vote.agree_on_loss`) under this try's
        keys; how many survivors hold each of ``groups``."""
        if self.store is None:
            self.store = world.store()
        self.ballot = attrs.evolve(board, attempt=self.attempts)
        self.attempts += 1
        try:
            return recovery_vote.agree_on_loss(self.ballot, survivors, lost, groups)
        finally:
            self.ballot.waiter.release()  # its store connection for blocking waits: one per try, ended with it

    def start(self, old: World, board: Board, world: tuple[int, ...], lost: Sequence[int],
              settings: GroupSettings) -> World | None:
        """The new world of the old ranks ``world`` (``None`` where this rank is not among them: it leaves), started in
        the last try's store namespace; this rank's ``board`` in the old world is left once it has started (or this
        rank leaves). ``RecoveryError`` where it could not start: then the context may recover again."""
        if old.rank not in world:
            board.leave(aborted=True)
            return None
        if self.store is None or self.ballot is None:
            raise RuntimeError("RecoveryTries.start before a vote")
        store = dist.PrefixStore(self.ballot.keys.recovered, self.store)

        def gone(ranks: list[int], failed: bool) -> list[int]:  # the launcher saw it end, it exited or closed, or
            # its heartbeat stood still (a survivor that failed once is on the list of finals too); after a failure
            # (torch's set-up: who died in it?) watched a few seconds where it was not watched before
            board.silent(ranks)

            def known() -> list[int]:
                final = sorted(board.finals().intersection(ranks))
                left = [r for r, status in board.statuses(final).items() if status.state in GONE_STATES]
                return sorted({*board.ended(ranks), *left})

            dead = known()
            if failed and not dead and board.silent(ranks, settle=board.silence):
                dead = known()
            return dead

        try:
            started = old.renewed(world, lost, store, settings.timeout, settings.creation_timeout, gone)
        except RecoveryError:
            self.failed_to_start = True
            raise
        board.leave(aborted=True)
        self.store = self.ballot = None  # the old world's store connections, let go
        return started
