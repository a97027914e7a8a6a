"""The one blocking wait of fmesh's store protocols: wait for a key to be written, and read it, in ONE store
operation however long it takes, on a connection and a thread of its own, while the caller's thread stays free to
see an abort and to look, now and then, at why the key is slow to come.

>>> store = dist.HashStore(); store.set("k", "v")
>>> Waiter(store, 0).wait_for("k", 1.0)
b'v'
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import attrs
import torch.distributed as dist

from fmesh.errors import ContextClosedError

# Creation normally completes in milliseconds: past this a watcher looks at the members that have not come.
FIRST_LOOK_SECONDS = 1.0
# The longest pause between two looks at the members that have not come (the looks start at FIRST_LOOK_SECONDS and
# double): what a slow wait costs the store, against how late a watcher sees a member that will never come.
LONGEST_LOOK_GAP_SECONDS = 8.0
# How late a waiter learns that its context was aborted: its thread wakes this often (an event: no store operation).
ABORT_NOTICE_SECONDS = 0.1
# How many of the first members to arrive watch a slow wait for members that will never come. Two, so that the watch
# survives the death of one watcher: each watcher is a member, so the other sees its final status (or the launcher's
# mark) and ends the wait with its error; the other members block once, at a constant cost.
WATCHERS = 2


@attrs.frozen
class Waiter:
    """One rank's blocking waits on ``store``: ``halted`` set (``ctx.abort()``, any thread or a signal handler) ends
    them at once; ``first_look``: when a watcher first looks at a slow wait."""

    store: dist.Store
    rank: int
    halted: threading.Event = attrs.field(factory=threading.Event, eq=False, repr=False)
    first_look: float = FIRST_LOOK_SECONDS
    # This rank's second store connection, for blocking waits (:meth:`waiting_store`): made at the first wait.
    second: list[dist.Store] = attrs.field(factory=list, eq=False, repr=False)
    # Why the store can no longer be waited on (its host stopped answering, seen by this rank's heartbeat), or None.
    unanswered: Callable[[], BaseException | None] | None = attrs.field(default=None, eq=False, repr=False)

    def check_halted(self, doing: str) -> None:
        """``ContextClosedError`` once the context was aborted (``ctx.abort()``, from any thread or a signal
        handler)."""
        if self.halted.is_set():
            raise ContextClosedError(f"on rank {self.rank}: this context was aborted (ctx.abort()) while {doing}")

    def check_store(self) -> None:
        """The error of a store that stopped answering (:attr:`unanswered`), once this rank's heartbeat saw it."""
        error = self.unanswered() if self.unanswered is not None else None
        if error is not None:
            raise error

    def waiting_store(self) -> dist.Store:
        """This rank's second connection to the store, for blocking waits (made at the first, then kept)."""
        if not self.second:
            try:
                self.second.append(self.store.clone())
            except (RuntimeError, NotImplementedError, AttributeError):  # a store without clone: shared
                self.second.append(self.store)
        return self.second[0]

    def release(self) -> None:
        """Let go of the second connection (it goes with the last wait on it)."""
        self.second.clear()

    def wait_for(self, key: str, seconds: float, look: Callable[[], bool] | None = None,
                 doing: str = "waiting", longest: float = LONGEST_LOOK_GAP_SECONDS) -> bytes | None:
        """Wait up to ``seconds`` for ``key`` to be set, and read it, in ONE blocking store operation (a ``get``,
        which waits for its key up to the connection's timeout): a constant number of operations, however long, and
        nothing logged when it comes. Its value, or None where it did not come (then no one wrote it yet: the caller
        may write its own outcome with ``compare_set`` and read whichever came first).

        The wait runs on a thread of its own over a connection of its own (:meth:`waiting_store`: a store
        client serves one call at a time, and this one blocks), while the caller's thread waits on an event,
        so a signal handler and ``ctx.abort()`` still end the wait at once (:meth:`check_halted`; the caller
        writes ``key`` then, which ends the blocked thread). ``look``, when given, is called past ``first_look``
        seconds, then at doubling intervals up to ``longest`` (:data:`LONGEST_LOOK_GAP_SECONDS`), on the caller's
        thread (the elected watcher's look at the missing members); it returns True to stop waiting.
        """
        came = threading.Event()
        outcome: list[bytes | None] = []

        def block() -> None:
            try:
                waiting, limit = self.waiting_store(), timedelta(seconds=max(seconds, 0.001))
                if waiting is self.store:  # no connection of its own (an in-process store): its timeout left alone
                    waiting.wait([key], limit)
                else:
                    waiting.set_timeout(limit)  # this connection's own: no store operation
                outcome.append(bytes(waiting.get(key)))
            except Exception:  # the store's timeout (it logs its own warning), or the store is gone
                outcome.append(None)
            finally:
                came.set()

        threading.Thread(target=block, name=f"fmesh-wait-{self.rank}", daemon=True).start()
        started = time.monotonic()
        look_at, look_every = started + self.first_look, self.first_look
        while not came.wait(min(ABORT_NOTICE_SECONDS, max(0.0, look_at - time.monotonic()))
                            if look is not None else ABORT_NOTICE_SECONDS):
            self.check_halted(doing)
            self.check_store()
            if look is not None and time.monotonic() >= look_at:
                if look():
                    break
                look_every = min(look_every * 2, longest)
                look_at = time.monotonic() + look_every
        came.wait(ABORT_NOTICE_SECONDS)  # a look that ended the wait wrote the key: the blocked thread returns now
        self.check_halted(doing)  # aborted as the key came (between two polls): the abort wins, not the key
        self.check_store()  # its connections were cut: the wait ended for that, and nothing more can be read
        if outcome and outcome[0] is not None:
            return outcome[0]
        # The blocked thread timed out, or has not returned yet from a key a look wrote: read it here.
        return self.store.get(key) if self.store.check([key]) else None
