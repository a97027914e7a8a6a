"""Which thread of a rank uses each of a Context's groups, and which one creates groups now.

One thread uses a group: the first that creates it or runs a collective on it. Collectives are matched across
ranks by their order on each group, so two threads of one rank using one group would mix their tensors: the
second is refused with an error saying so (:meth:`GroupThreads.claim`). Threads on distinct groups (a pipeline
schedule's send/receive thread, an asynchronous checkpoint on a group of its own) run side by side, as torch
allows, once their groups exist: groups are created by one thread at a time (their creation shares the rank's store
connection), and a thread asking for a new group while another creates one is refused, saying to create them first
(``ctx.materialize``; :meth:`GroupThreads.creating`).

>>> threads = GroupThreads()
>>> threads.claim(None, "the default group")  # this thread's now
>>> with threads.creating("a group", check_open=lambda: None):
...     pass
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator


class GroupThreads:
    """The thread that uses each group (by its spec; ``None``: the default group), and the one creating a group."""

    def __init__(self) -> None:
        # (ident, name) of the thread that uses each group (None: the default group)
        self._owners: dict[Hashable, tuple[int, str]] = {}
        self.lock = threading.Lock()  # two threads claiming one group (or making its lock) at once: one wins
        self._creating = threading.Lock()  # held while a group (or a split) is created: one at a time; close waits
        self._creator: tuple[int, str] | None = None  # (ident, name) of the thread creating one now

    def claim(self, spec: Hashable, what: str, doing: str = "a collective") -> None:
        """Make the calling thread the one that uses ``spec``'s group (``None``: the default group), named ``what``
        in errors, if no thread is yet; ``RuntimeError`` if another thread is."""
        me = threading.get_ident()
        owner = self._owners.get(spec)
        if owner is not None and owner[0] == me:
            return
        with self.lock:
            owner = self._owners.setdefault(spec, (me, threading.current_thread().name))
        if owner[0] == me:
            return
        raise RuntimeError(
            f"{what} is used by thread {owner[1]!r}, and thread {threading.current_thread().name!r} asked for "
            f"{doing} on it: a group's collectives belong to one thread (ranks match collectives by their order on "
            "each group, so two threads would mix each other's tensors). Run this group's collectives from one "
            "thread; threads on distinct groups (other axes, or meshes) run side by side")

    def claimed(self, spec: Hashable, what: Callable[[], str]) -> None:
        """:meth:`claim` in eager code (the caller knows it is not compiling: a compiled region runs on the thread that
        traced it), at the cost of one dict lookup once the group is this thread's; ``what()`` names the group, made
        only where a claim is made (the hot path formats no label)."""
        owner = self._owners.get(spec)
        if owner is None or owner[0] != threading.get_ident():
            self.claim(spec, what())

    @contextlib.contextmanager
    def creating(self, what: str, check_open: Callable[[], None]) -> Iterator[None]:
        """Hold the creation lock while ``what`` (a group, or a split) is created: one thread at a time (creation
        shares this rank's store connection, and ranks would wait for each other's groups in different orders); a
        second thread asking meanwhile is refused, saying what to do. ``check_open`` runs under the lock: a registry
        closed meanwhile refuses (:meth:`settled` waits for a creation under way)."""
        me = threading.get_ident()
        with self.lock:
            if self._creator is not None and self._creator[0] != me:
                raise RuntimeError(
                    f"thread {threading.current_thread().name!r} asked for {what}, which does not exist yet, while "
                    f"thread {self._creator[1]!r} creates another group of this context: groups are created by one "
                    "thread at a time (their creation shares this rank's store connection, and ranks would wait for "
                    "each other's in different orders). Create every group first, from one thread "
                    "(ctx.materialize(mesh) for each mesh), then run collectives on distinct groups from distinct "
                    "threads")
            self._creator = (me, threading.current_thread().name)
        try:
            with self._creating:
                check_open()
                yield
        finally:
            with self.lock:
                self._creator = None

    def settled(self) -> None:
        """Return once no group is being created (a creation under way finishes, or fails, first)."""
        with self._creating:
            pass
