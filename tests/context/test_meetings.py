"""A mesh's groups agreed on in one meeting: as the ranks start (``Context(meshes=...)``: the start rendezvous
carries it) or at ``ctx.materialize(mesh)``; then each group is made without meeting again. The failure semantics of
the per-group agreement hold: a mesh that differs between ranks is a ``MeshMismatchError`` naming both ranks'
meshes on every rank, a rank that never comes a ``GroupTimeoutError`` naming it.

The start's meeting is checked on an in-process store, ranks as threads (its cost beside the plain start's is in
``bench/scale.py``); the Context's, on real gloo processes."""

from __future__ import annotations

import functools
import pathlib
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support import in_threads, launch, patience

import fmesh
from fmesh import Context
from fmesh.context.group_plan import Agenda
from fmesh.context.options import GroupSettings
from fmesh.context.store.rendezvous import meet

MESH = fmesh.make_mesh((2, 2), ("dp", "tp"))
OTHER = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[0, 2, 1, 3])  # the same sizes and names, other groups
SETTINGS = GroupSettings.of(None, 60, backend="gloo")


def agendas_meet(agendas: dict[int, str], world_size: int, seconds: float = 20) -> dict[int, Any]:
    """Each rank (a thread) starts meaning its agenda; rank -> None or the exception it raised."""
    store, outcome = dist.HashStore(), {}

    def rank_of(rank: int) -> None:
        try:
            meet(store, rank=rank, world_size=world_size, timeout=timedelta(seconds=seconds), agenda=agendas[rank])
            outcome[rank] = None
        except Exception as error:
            outcome[rank] = error

    in_threads(rank_of, list(agendas), timeout=patience(60))
    return outcome


def test_ranks_that_start_with_the_same_meshes_meet() -> None:
    agenda = Agenda.of([MESH], SETTINGS).description
    assert agendas_meet(dict.fromkeys(range(4), agenda), 4) == dict.fromkeys(range(4))


def test_ranks_that_start_with_different_meshes_each_get_a_mismatch_naming_both() -> None:
    ours, theirs = (Agenda.of([mesh], SETTINGS).description for mesh in (MESH, OTHER))
    outcome = agendas_meet({0: ours, 1: ours, 2: ours, 3: theirs}, 4)
    for rank, error in outcome.items():
        assert isinstance(error, fmesh.MeshMismatchError), (rank, error)
        assert "ranks disagree about the meshes they start with" in str(error), error
        assert ours in str(error) and theirs in str(error), error  # both ranks' meshes, whoever came first


def test_a_rank_that_never_starts_is_a_timeout_naming_it() -> None:
    agenda = Agenda.of([MESH], SETTINGS).description
    outcome = agendas_meet(dict.fromkeys(range(3), agenda), 4, seconds=1)  # rank 3 never comes
    for error in outcome.values():
        assert isinstance(error, fmesh.GroupTimeoutError) and "(ranks [3] never came)" in str(error), error


def test_an_agenda_names_every_group_once_whatever_the_items() -> None:
    agenda = Agenda.of([MESH, (MESH, "tp"), (MESH, ("dp", "tp"))], SETTINGS)
    assert len(agenda.layouts) == 3 and agenda.description.count("Mesh(dp=2, tp=2; world=4)") == 1
    assert agenda.participants(4) == (0, 1, 2, 3)
    assert Agenda.of([fmesh.select(MESH, dp=1)], SETTINGS).participants(4) == (2, 3)
    with pytest.raises(TypeError):
        Agenda.of(["dp"], SETTINGS)


def groups_met_once(ctx: Context) -> tuple[list[float], list[bool]]:
    """Collectives along both axes of a mesh the context started with (or materialized): their sums, and whether
    each group held an agreement of its own (its verdict key is in the store)."""
    sums = [ctx.all_reduce(torch.ones(1) * (ctx.rank + 1), MESH, axis).item() for axis in ("dp", "tp")]
    board = ctx._board
    assert board is not None
    own = [bool(board.store.check([board.keys.agreement(ctx._groups.target(MESH, axis).spec.digest()).verdict]))
           for axis in ("dp", "tp")]
    return sums, own


@pytest.mark.slow
def test_a_context_started_with_a_mesh_makes_its_groups_without_meeting_again() -> None:
    results = launch(groups_met_once, 4, timeout=60, meshes=[MESH])
    assert [sums for sums, _ in results] == [[4.0, 3.0], [6.0, 3.0], [4.0, 7.0], [6.0, 7.0]], results
    assert all(own == [False, False] for _, own in results), results


def what_the_start_wrote(ctx: Context) -> tuple[bool, bool, bool, float]:
    """Whether the context's options were agreed on in the start's meeting, and whether the options' own key and this
    rank's status are in the store (neither is written: the start carried both), and a sum over the world."""
    board = ctx._board
    assert board is not None
    return (bool(ctx._world.options_at_start), bool(board.store.check([board.keys.options])),
            bool(board.store.check([board.keys.status(ctx.rank)])),
            ctx.all_reduce(torch.ones(1), fmesh.make_mesh((4,), ("dp",)), "dp").item())


@pytest.mark.slow
def test_a_context_start_carries_its_options_and_every_ranks_presence_in_its_one_meeting() -> None:
    # Issue 37: no meeting of the options' own, no status posted as the ranks start; the ranks still work together.
    assert launch(what_the_start_wrote, 4, timeout=60, meshes=[MESH]) == [(True, False, False, 4.0)] * 4


def materialized(ctx: Context) -> tuple[list[float], list[bool]]:
    ctx.materialize(MESH)
    return groups_met_once(ctx)


def materialize_another_mesh_on_rank_3(ctx: Context) -> tuple[str, str]:
    mesh = OTHER if ctx.rank == 3 else MESH
    try:
        ctx.materialize(mesh)
    except Exception as error:
        return type(error).__name__, str(error)
    return "ok", ""


def rank_3_elsewhere(gave_up: pathlib.Path, ctx: Context) -> tuple[str, str, float]:
    started = time.monotonic()
    if ctx.rank == 3:  # alive, but busy elsewhere until the others gave up (each says so with a file: an event)
        while len(list(gave_up.iterdir())) < 3:
            time.sleep(0.05)
        return "elsewhere", "", 0.0
    try:
        ctx.materialize(MESH)
    except Exception as error:
        return type(error).__name__, str(error), time.monotonic() - started
    finally:
        (gave_up / str(ctx.rank)).touch()
    return "ok", "", time.monotonic() - started


@pytest.mark.slow
def test_materialize_meets_once_for_every_group_of_the_mesh() -> None:
    results = launch(materialized, 4, timeout=60)
    assert [sums for sums, _ in results] == [[4.0, 3.0], [6.0, 3.0], [4.0, 7.0], [6.0, 7.0]], results
    assert all(own == [False, False] for _, own in results), results


@pytest.mark.slow
def test_ranks_that_materialize_different_meshes_each_get_a_mismatch_naming_both() -> None:
    results = launch(materialize_another_mesh_on_rank_3, 4, timeout=60)
    for rank, (kind, message) in enumerate(results):
        assert kind == "MeshMismatchError", (rank, kind, message)
        assert repr(MESH.universe) in message and repr(OTHER.universe) in message, message  # both ranks' meshes


@pytest.mark.slow
def test_a_rank_that_never_comes_to_materialize_is_a_timeout_naming_it(tmp_path: pathlib.Path) -> None:
    # The creation timeout stretches with the load: ranks 0-2 leave the start together, but on a busy machine one of
    # them may reach materialize a second after the others (it was named beside rank 3 under a load of 40).
    results = launch(functools.partial(rank_3_elsewhere, tmp_path), 4, timeout=60, creation_timeout=patience(1.0, 4))
    assert results[3][0] == "elsewhere", results
    for rank, (kind, message, _) in enumerate(results[:3]):
        assert kind == "GroupTimeoutError", (rank, kind, message)
        assert "ranks [3] never came" in message, message


def test_meshes_to_start_with_are_checked() -> None:
    with pytest.raises(TypeError, match=r"meshes or \(mesh, axes\) pairs, but got 'dp'"):
        Context.fake(4, meshes=["dp"])  # before the default group is touched
    with pytest.raises(ValueError, match="built for 8 ranks, but this context has 4"):
        Context.fake(4, meshes=[fmesh.make_mesh((2, 4), ("dp", "tp"))])
    with Context.fake(4, meshes=[MESH]) as ctx:  # the fake backend has no store: nothing to agree, nothing refused
        assert ctx.all_reduce(torch.ones(1), MESH, "dp").shape == (1,)
