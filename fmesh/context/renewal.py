"""What a recovery (:meth:`fmesh.Context.recover`) does with the process groups a rank holds (:func:`renew`).

It cuts at once the groups that lost a member, so a survivor still blocked in one is released. The survivors then
agree, through the store, on the ranks lost (:func:`fmesh.context.store.recovery_vote.agree_on_loss`). A survivor
still running (blocked in a collective with a survivor that came, say) is freed: past a second, the survivors that
came cut the groups they share with it, so its collective raises :class:`~fmesh.RankLostError` saying which ranks
are lost and to call ``recover`` too; those groups are made anew, even where the printed plan, which assumes every
survivor comes at once, keeps them. Then each group is kept, shrunk or made again by the rule ``python -m fmesh plan
--lose`` prints by (:func:`fmesh.plan.communicators.renewals`): a group whose members all go on keeps its
communicator (renumbered, no new rendezvous: :class:`Taken`); an NCCL group some of whose members do not (lost, or
dropped by the new world's mesh) is shrunk in place where torch has ``shrink_group`` and NCCL is >= 2.27; every
other group, and the default group, is aborted, all in one torch call, and the groups not kept are created in the
new world when first needed.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from typing import Any

import attrs
import torch.distributed as dist

from fmesh.context import _torch
from fmesh.context.options import GroupSpec
from fmesh.context.store.board import Board
from fmesh.context.store.recovery_vote import HeldGroup
from fmesh.plan.communicators import CREATE, SHRINK, Action, renewals

Held = Mapping[GroupSpec, dist.ProcessGroup]  # the groups a rank holds that torch still knows


@attrs.frozen
class Taken:
    """A group a recovery takes into the new world: its ``spec`` under the new ranks, the torch group detached
    from the old world's registry, whether it was kept or shrunk (``action``), and its sockets."""

    spec: GroupSpec
    detached: Any
    action: Action
    sockets: frozenset[Any]


def held_groups(held: Held) -> list[HeldGroup]:
    """The groups ``held``, as a recovery's vote counts and cuts them (digest, members, torch name)."""
    return [HeldGroup(spec.digest(), spec.ranks, group.group_name) for spec, group in held.items()]


def cut_broken(held: Held, lost: Iterable[int], board: Board | None) -> None:
    """Cut the connections of every group of ``held`` that lost a member, so a survivor still blocked in one (a
    collective fmesh did not run, FSDP's say, fails with the backend's error and no roll call) is released now."""
    gone = set(lost)
    if board is not None:
        for spec, group in held.items():
            if gone.intersection(spec.ranks):
                board.connections.sever(group.group_name)


def take_renewed(held: Held, rank: int, renumber: Mapping[int, int], holders: Mapping[str, int],
                 survivors: Container[int], board: Board | None) -> tuple[Taken, ...]:
    """The groups of ``held`` that go on into the new world (old rank -> new rank: ``renumber``), kept or shrunk by
    the planner's one rule (:func:`fmesh.plan.communicators.renewals`), detached from torch and renumbered;
    ``holders`` (how many of the ``survivors`` hold each group, by digest) says whether every surviving member
    can keep one. ``rank``: this rank, in the old world."""
    if rank not in renumber:  # this rank leaves: it takes nothing, and never calls a shrink (torch refuses one from
        return ()             # an excluded member; the others shrink without it)
    specs = sorted(held, key=lambda s: (len(s.ranks), s.digest()))  # one order on every rank; smallest first
    choices = renewals([spec.ranks for spec in specs], renumber,
                       shrinkable=[_torch.can_shrink(spec.backend) for spec in specs],
                       held_everywhere=[holders.get(spec.digest(), 0) == sum(m in survivors for m in spec.ranks)
                                        for spec in specs])
    taken = []
    for spec, action in zip(specs, choices, strict=True):
        group, members = held[spec], spec.ranks
        if action == CREATE:
            continue
        if action == SHRINK:  # the members that do not go on, lost or dropped by the new world, are excluded
            group = _torch.shrink_group(group, [i for i, r in enumerate(spec.ranks) if r not in renumber])
            members = tuple(r for r in spec.ranks if r in renumber)
        sockets = frozenset() if board is None else board.connections.take(group.group_name)
        taken.append(Taken(attrs.evolve(spec, ranks=tuple(renumber[m] for m in members)),
                           _torch.detach_group(group), action, sockets))
    return tuple(taken)
