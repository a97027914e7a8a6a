"""How one of a Context's process groups comes to exist: its members agree on what they mean (through the store,
:mod:`fmesh.context.store.agreement`), then connect, within the creation timeout.

Before a group is created, the process's file descriptors are counted
(:meth:`~fmesh.context.store.connections.Connections.check_room`); connecting it is bounded by the creation timeout
(gloo's rendezvous otherwise waits the collective timeout), and a member that fails meanwhile is named
(:func:`~fmesh.context.store.agreement.connect_failed`). Every failure is posted in this rank's status first, so the
peers waiting for it learn it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import torch.distributed as dist

from fmesh.context import _torch
from fmesh.context.options import GroupSettings, GroupSpec
from fmesh.context.set_up import connect_bound, connect_tries
from fmesh.context.store.agreement import agree, connect_failed
from fmesh.context.store.board import Board
from fmesh.context.store.connections import apart_from_store, open_sockets
from fmesh.context.store.keys import digest
from fmesh.context.store.pulse import tcp_address
from fmesh.context.store.records import RUNNING
from fmesh.context.world import World
from fmesh.errors import GroupTimeoutError
from fmesh.mesh import Mesh


@attrs.frozen
class GroupMaker:
    """Creates the groups of one Context on ``world`` (``board``: ``None`` on the fake backend, whose store cannot be
    used: then nothing is agreed or counted)."""

    world: World
    settings: GroupSettings
    board: Board | None

    def create(self, spec: GroupSpec, axes: tuple[str, ...], label: str, description: str, held: int,
               agreed: bool = False) -> dist.ProcessGroup:
        """The group of ``spec`` along ``axes`` (``label`` names it in errors; ``description`` is what its members
        compare, unless they ``agreed`` on it already), this rank holding ``held`` groups already."""
        _torch.require(_torch.GROUPS)  # on every member before they meet: each raises it, none waits for another
        board = self.board
        if board is not None and len(spec.ranks) > 1:
            self.failing_as_posted(lambda: board.connections.check_room(len(spec.ranks), held, label))
        if not agreed:
            self.agree(spec.digest(), spec.ranks, description, label)
        # A group agreed elsewhere (in the start's meeting) has no agreement here to mark where its members stand:
        # one try, as a try made again could not tell a member inside the set-up from one that went on past it.
        tries = self.connect_tries(spec)[-1 if agreed else 0:]
        for attempt, connect in enumerate(tries):
            here, next_key = spec.digest() + (f"~{attempt}" if attempt else ""), f"{spec.digest()}~{attempt + 1}"
            again = (functools.partial(self.all_waiting, spec.ranks, (here, next_key))
                     if attempt + 1 < len(tries) else None)
            probe = tries[-1] if again is not None else None
            if again is not None and board is not None:
                # The members' heartbeats as the try begins (three store operations): a member that dies inside it
                # is named by a silence counted from here, not from the meeting after the try (seen: 30.5 s).
                try:
                    board.silent(spec.ranks)
                except dist.DistNetworkError as error:  # the store's host died: named as the agreement names it
                    raise board.store_gone(f"creating {label}", error) from None
            group = self.connect(spec.ranks, label, functools.partial(self.set_up, spec, axes, attempt, connect, probe),
                                 again=again)
            if group is not None:
                break
            # The try failed on every member (its probe sees to that) and nobody is to blame yet: they meet again (a
            # member that died meanwhile is named there, by its heartbeat), then try with the longer timeout.
            self.agree(next_key, spec.ranks, f"{description} (set up again)", label)
        if tries[-1] != spec.timeout:
            _torch.set_group_timeout(group, spec.timeout)
        return group

    def set_up(self, spec: GroupSpec, axes: tuple[str, ...], attempt: int, connect: timedelta,
               probe: timedelta | None) -> dist.ProcessGroup:
        """Torch's set-up of the group of ``spec``, its ``attempt``-th try (each under a name of its own: a failed
        try's keys stay in the store), with the connect timeout ``connect``. A try made again where it fails is
        probed with a barrier that waits up to ``probe`` (the last try's timeout: a member slow to come is waited for
        as long as that try would wait for it): it passes on a member only where every member's set-up passed, so
        the members all keep the group, or all try again (a member whose set-up failed aborts it, and its peers'
        barrier fails on the broken connections)."""
        group = _torch.create_group(
            spec.ranks,
            f"{self.world.namespace}:{spec.digest()}" + (f"~{attempt}" if attempt else ""),
            rank=self.world.rank,
            backend=spec.backend,
            timeout=connect,
            options=spec.options,
            description=f"fmesh_{'_'.join(axes)}",
            store=None if self.board is None else self.board.store,
        )
        if probe is not None:
            try:
                _torch.set_group_timeout(group, probe)
                dist.barrier(group=group)
            except Exception:
                with contextlib.suppress(Exception):
                    _torch.abort_group(group)
                raise
        return group

    def split(self, mesh: Mesh, axes: tuple[str, ...], spec: GroupSpec, description: str) -> Any:
        """The groups along ``axes`` of ``mesh`` for the whole world at once (one ``split_group``, after the whole
        world agreed on ``description``); this rank's group, or ``None``."""
        world = tuple(range(self.world.world_size))
        what = f"the split of axes {axes} of {mesh!r}"
        self.agree(digest(description), world, description, what)
        return self.connect(world, what, lambda: _torch.split_groups(
            mesh.groups(axes), rank=self.world.rank, timeout=spec.timeout, options=spec.options))

    def connect_tries(self, spec: GroupSpec) -> tuple[timedelta, ...]:
        """The connect timeouts of the tries at connecting the group of ``spec``: gloo's rendezvous waits for every
        member with the group's timeout (the collectives', 10 min by default), so a member that died after agreeing
        would be waited for that long; it connects within the creation timeout and
        :func:`~fmesh.context.set_up.connect_bound` instead, in :func:`~fmesh.context.set_up.connect_tries`, then
        gets its own."""
        if spec.backend == "gloo" and self.board is not None and len(spec.ranks) > 1:
            # The members agreed just before (every one came): connecting takes milliseconds, and one that dies
            # inside a try costs the others five of its timeout (set_up.set_up_bound; its heartbeat then names it).
            return connect_tries(min(spec.timeout, self.settings.creation_timeout, connect_bound(len(spec.ranks))))
        return (spec.timeout,)

    def connect(self, members: tuple[int, ...], what: str, create: Callable[[], Any],
                again: Callable[[], bool] | None = None) -> Any:
        """``create()`` a group the members agreed on, noting its sockets; a failure is explained (a member
        that failed meanwhile is named) and posted in its status, so peers waiting for us learn it; a failure nobody
        is named for (the backend timed out, or its connections broke) where the members can try ``again`` (asked
        then) is ``None`` instead, and posts nothing. A context aborted meanwhile aborts the new group and raises
        ``ContextClosedError``."""
        board = self.board
        if board is None:
            return create()
        before = open_sockets()
        try:
            group = create()
        except Exception as error:
            explained = connect_failed(board, members, what, error, settle=again is None)
            if again is not None and isinstance(error, RuntimeError) and (
                    explained is error or isinstance(explained, GroupTimeoutError)) and again():
                return None
            board.failed(explained)
            if explained is error:
                raise
            raise explained from error
        if group is not None:
            address = tcp_address(board.store)
            board.connections.note(group.group_name, apart_from_store(open_sockets() - before,
                                                                      None if address is None else address[1]))
        # Set up: a peer waiting for this rank no longer reads it as inside torch's set-up (Board.current).
        board.post_quietly(RUNNING, after=what)
        if board.connections.halted.is_set():
            if group is not None:
                board.connections.sever(group.group_name)
                with contextlib.suppress(Exception):
                    _torch.abort_group(group)
            board.waiter.check_halted(f"connecting {what}")
        return group

    def all_waiting(self, members: tuple[int, ...], keys: tuple[str, ...]) -> bool:
        """Whether every other of the ``members`` still waits at one of the agreements ``keys``: the one before a try
        (so inside its set-up, or dead there) or the one after it (its try failed). A member that passed a try's
        probe posts ``running`` at once, before it can break the group for the others (a failure it posts first):
        then a broken probe is a loss, not a try to make again."""
        board = self.board
        if board is None:  # nothing marks where the members stand
            return False
        statuses = board.statuses([member for member in members if member != board.rank])
        return all(any(status.waits_at(key) for key in keys) for status in statuses.values())

    def agree(self, key: str, members: tuple[int, ...], description: str, what: str) -> None:
        """The members' agreement on the group at ``key`` (none for a group of one, or without a store)."""
        if self.board is not None and len(members) > 1:
            agree(self.board, key, members, description, what)

    def failing_as_posted(self, step: Callable[[], Any]) -> Any:
        """``step()``; a failure is posted in its status first, so peers waiting for us learn it."""
        try:
            return step()
        except Exception as error:
            if self.board is not None:
                self.board.failed(error)
            raise
