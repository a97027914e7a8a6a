"""What training code asks a communicator for, beyond the tensor collectives, on real gloo processes:
object collectives, ppermute and shift, group indices, host-local meshes, and a script without a launcher.

Every check compares against brute force from ``mesh.group`` on 2- and 3-axis meshes with permuted rank
maps; many checks share one launch, so the suite stays fast on a small machine.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import threading
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import MESHES, axis_sets, launch, one_axis_views, patience, random_perm, shift_perm, succeeded

import fmesh
from fmesh import Context
from fmesh.context.permute import check_perm


def obj_of(rank: int) -> dict[str, Any]:
    """Rank ``rank``'s object: its size differs from rank to rank."""
    return {"rank": rank, "words": ["w" * (7 * rank + 1)] * (rank % 3 + 1), "nested": (rank, {rank: [rank] * rank})}


def expected_permute(rank: int, group: tuple[int, ...], perm: list[tuple[int, int]]) -> torch.Tensor:
    """What ``rank`` receives under ``perm`` along ``group``, by brute force: its sender's payload, or zeros."""
    me = group.index(rank)
    senders = [group[source] for source, destination in perm if destination == me]
    return payload(senders[0]) if senders else torch.zeros(2, 3)


def payload(rank: int) -> torch.Tensor:
    return torch.arange(6, dtype=torch.float).reshape(2, 3) + 100 * rank


def check_new_calls(ctx: Context) -> dict[str, Any]:
    """index, all_gather_object, broadcast_object, ppermute and shift along every axis and pair of axes."""
    rank, world = ctx.rank, ctx.world_size
    problems: list[str] = []
    counts = {"index": 0, "all_gather_object": 0, "broadcast_object": 0, "ppermute": 0, "shift": 0}

    def expect(label: str, got: Any, want: Any) -> None:
        same = torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want
        if not same:
            problems.append(f"{label}: got {got!r} want {want!r}")
        counts[label.split(" ")[0]] += 1

    for sizes, names, rank_map in MESHES[world]:
        mesh = fmesh.make_mesh(sizes, names, rank_map=rank_map)
        for axes in axis_sets(mesh):
            group = mesh.group(rank, axes)
            where = f"{axes} of {sizes} {rank_map}"
            expect(f"index {where}", ctx.index(mesh, axes), group.index(rank))
            expect(f"all_gather_object {where}", ctx.all_gather_object(obj_of(rank), mesh, axes),
                   [obj_of(r) for r in group])
            for src in range(len(group)):
                expect(f"broadcast_object {where} src={src}", ctx.broadcast_object(obj_of(rank), mesh, axes, src=src),
                       obj_of(group[src]))
        for view, axis, axes in one_axis_views(mesh):
            group = mesh.group(rank, axes)
            n = len(group)
            where = f"{axes} of {sizes} {rank_map}"
            # The same seed on every rank: every member draws the same permutations.
            rng = random.Random(f"{sizes}{rank_map}{axes}")
            for perm in [random_perm(rng, n) for _ in range(4)] + [[(i, (i + 1) % n) for i in range(n)]]:
                expect(f"ppermute {where} {perm}", ctx.ppermute(payload(rank), view, axis, perm),
                       expected_permute(rank, group, perm))
            for offset in sorted({1, -1, 2, n}):
                for wrap in (False, True):
                    expect(f"shift {where} offset={offset} wrap={wrap}", ctx.shift(payload(rank), view, axis,
                                                                                   offset=offset, wrap=wrap),
                           expected_permute(rank, group, shift_perm(n, offset, wrap)))
    # Input left alone; a non-contiguous integer tensor travels as itself.
    mesh = fmesh.make_mesh((world,), ("pp",))
    sent = torch.arange(6).reshape(3, 2).t()
    got = ctx.shift(sent, mesh, "pp", wrap=True)
    expect("shift non-contiguous", got, torch.arange(6).reshape(3, 2).t())
    expect("shift input unchanged", sent, torch.arange(6).reshape(3, 2).t())
    ctx.barrier()
    return {"problems": problems, "counts": counts}


@pytest.mark.slow
@pytest.mark.parametrize("world", [4, 8])
def test_new_calls_along_every_axis_and_pair_against_brute_force(world: int) -> None:
    for result in succeeded(launch(check_new_calls, world, timeout=300)):
        assert result["problems"] == []
        # Every kind of call ran on every rank: a test that checks nothing fails here.
        assert all(count >= 10 for count in result["counts"].values()), result["counts"]


def host_local(ctx: Context) -> dict[str, Any]:
    """A host-local all_reduce on ``Topology(...).mesh()`` for each rank order, against ``ranks_on``."""
    problems = []
    for order in ("block", "cyclic", [3, 1, 0, 2]):
        topology = fmesh.Topology(hosts=2, ranks_per_host=2, rank_order=order)
        mesh = topology.mesh()
        host = topology.host_of(ctx.rank)
        local = topology.ranks_on(host)
        total = ctx.all_reduce(torch.tensor([float(ctx.rank)]), mesh, "local").item()
        if total != sum(local) or ctx.index(mesh, "local") != local.index(ctx.rank) or ctx.index(mesh, "host") != host:
            problems.append(f"{order}: sum {total} index {ctx.index(mesh, 'local')} for host ranks {local}")
        gathered = ctx.all_gather_object(ctx.rank, mesh, "host")
        if gathered != [topology.ranks_on(h)[local.index(ctx.rank)] for h in range(topology.hosts)]:
            problems.append(f"{order}: one local rank of every host {gathered}")
    return {"problems": problems}


@pytest.mark.slow
def test_topology_mesh_gives_host_local_collectives() -> None:
    assert [r["problems"] for r in succeeded(launch(host_local, 4, timeout=120))] == [[]] * 4


def bad_inputs(ctx: Context) -> dict[str, Any]:
    """Each bad call, caught on this rank: its error type and message; then a collective that must still work."""
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[3, 0, 2, 1])
    seen: dict[str, Any] = {}

    def attempt(label: str, call: Any) -> None:
        try:
            call()
        except Exception as error:
            seen[label] = (type(error).__name__, str(error))
        else:
            seen[label] = ("no error", "")

    groups_before = ctx.stats()["groups_created"]
    attempt("bad src", lambda: ctx.broadcast_object("x", mesh, "dp", src=2))
    attempt("src not an int", lambda: ctx.broadcast_object("x", mesh, "dp", src="0"))
    attempt("repeated source", lambda: ctx.ppermute(torch.ones(1), mesh, "tp", [(0, 1), (0, 0)]))
    attempt("repeated destination", lambda: ctx.ppermute(torch.ones(1), mesh, "tp", [(0, 1), (1, 1)]))
    attempt("out of range", lambda: ctx.ppermute(torch.ones(1), mesh, "tp", [(0, 2)]))
    attempt("not pairs", lambda: ctx.ppermute(torch.ones(1), mesh, "tp", [0, 1]))
    attempt("two axes", lambda: ctx.ppermute(torch.ones(1), mesh, ("dp", "tp"), [(0, 1)]))
    attempt("shift offset", lambda: ctx.shift(torch.ones(1), mesh, "tp", offset=1.0))
    attempt("unknown axis", lambda: ctx.shift(torch.ones(1), mesh, "pp"))
    seen["groups created by bad calls"] = ctx.stats()["groups_created"] - groups_before
    # Unpicklable objects: only rank 0's along tp (group [3, 0]); then rank 2's as the src of a broadcast.
    attempt("unpicklable gather", lambda: ctx.all_gather_object(threading.Lock() if ctx.rank == 0 else ctx.rank,
                                                                 mesh, "tp"))
    attempt("unpicklable broadcast", lambda: ctx.broadcast_object(threading.Lock() if ctx.rank == 2 else "fine",
                                                                   mesh, ("dp", "tp"), src=2))
    attempt("unpicklable elsewhere", lambda: ctx.broadcast_object(lambda: 0, mesh, "dp", src=0))
    seen["after"] = ctx.all_gather_object(ctx.rank, mesh)  # the group is still in step
    return seen


@pytest.mark.slow
def test_bad_inputs_give_typed_errors_on_every_rank_and_no_hang() -> None:
    # The launch's own timeout is the bound: a hang would be a TimeoutError here.
    results = succeeded(launch(bad_inputs, 4, timeout=60, context_timeout=30))
    for rank, seen in enumerate(results):
        assert seen["bad src"] == ("ValueError", "broadcast_object src=2 is an index within the group: valid 0..1")
        assert seen["src not an int"][0] == "ValueError" and "'0'" in seen["src not an int"][1]
        assert seen["repeated source"][0] == "ValueError" and "pair (0, 0) repeats source 0" in seen[
            "repeated source"][1]
        assert seen["repeated destination"][0] == "ValueError"
        assert "pair (1, 1) repeats destination 1 (pair (0, 1)" in seen["repeated destination"][1]
        assert seen["out of range"] == ("ValueError", "ppermute perm pair (0, 2): destination 2 is outside axis "
                                                      "'tp' of size 2: valid coordinates are 0..1")
        assert seen["not pairs"][0] == "TypeError" and "pairs of ints, but got 0" in seen["not pairs"][1]
        assert seen["two axes"][0] == "TypeError" and "flatten" in seen["two axes"][1]
        assert seen["shift offset"][0] == "TypeError" and "1.0" in seen["shift offset"][1]
        assert seen["unknown axis"][0] == "KeyError" and "'pp'" in seen["unknown axis"][1]
        assert seen["groups created by bad calls"] == 0
        # Rank 0's lock fails the gather of its tp group [3, 0] on both members, naming rank 0; the other
        # group [2, 1] is not affected.
        kind, message = seen["unpicklable gather"]
        if rank in (3, 0):
            assert kind == "UnpicklableObjectError", seen
            assert "member 1 (rank 0): TypeError: cannot pickle '_thread.lock' object" in message
        else:
            assert kind == "no error"
        kind, message = seen["unpicklable broadcast"]
        assert kind == "UnpicklableObjectError" and "member 2 (rank 2)" in message, seen
        kind, message = seen["unpicklable elsewhere"]  # the lambda of src 0 in each dp group
        assert kind == "UnpicklableObjectError" and "member 0" in message and "lambda" in message, seen
        assert seen["after"] == [3, 0, 2, 1]
    assert issubclass(fmesh.errors.UnpicklableObjectError, TypeError)


def unloadable_on_rank_1(ctx: Context) -> dict[str, tuple[str, str]]:
    """Rank 0 sends an object of a class from a module only rank 0 has (rank 1 cannot unpickle it), in a broadcast
    and in an all_gather: what each collective raises on this rank."""
    import sys
    import types

    if ctx.rank == 0:
        module = types.ModuleType("only_on_rank_0")
        exec("class Config:\n    pass\n", module.__dict__)
        module.Config.__module__ = "only_on_rank_0"
        sys.modules["only_on_rank_0"] = module
        obj: object = module.Config()
    else:
        obj = "plain"
    mesh = fmesh.make_mesh((2,), ("dp",))
    seen: dict[str, tuple[str, str]] = {}
    for what, call in (("broadcast_object", lambda: ctx.broadcast_object(obj, mesh, "dp", src=0)),
                       ("all_gather_object", lambda: ctx.all_gather_object(obj, mesh, "dp"))):
        try:
            call()
            seen[what] = ("no error", "")
        except Exception as error:
            seen[what] = (type(error).__name__, str(error))
    seen["after"] = ("ok", str(ctx.all_gather_object(ctx.rank, mesh, "dp")))  # the group is healthy
    return seen


@pytest.mark.slow
@pytest.mark.usefixtures("nothing_left_behind")  # a scenario of docs/guides/failures.md: nothing left behind
def test_an_object_one_member_cannot_unpickle_is_one_error_on_every_member() -> None:
    results = launch(unloadable_on_rank_1, 2, timeout=60)
    for rank, seen in enumerate(results):
        for what in ("broadcast_object", "all_gather_object"):
            kind, message = seen[what]
            assert kind == "UnpicklableObjectError", (rank, seen)
            assert "member 1 (rank 1): ModuleNotFoundError" in message and "could not unpickle" in message, message
        assert seen["after"] == ("ok", "[0, 1]"), seen


def test_dry_runs_and_simulations() -> None:
    with Context.fake(8, rank=5) as ctx:
        mesh = fmesh.make_mesh((2, 2, 2), ("pp", "dp", "tp"), rank_map=[5, 2, 7, 0, 3, 6, 1, 4])
        assert ctx.index(mesh, "tp") == mesh.group(5, "tp").index(5)
        assert ctx.index(mesh, ("tp", "pp")) == mesh.group(5, ("tp", "pp")).index(5)
        assert ctx.all_gather_object([5], mesh, "dp") == [[5], [5]]  # a dry run: this process's object
        assert ctx.broadcast_object({"a": 1}, mesh, "dp", src=1) == {"a": 1}
        assert ctx.shift(torch.ones(3), mesh, "pp").shape == (3,)
        with pytest.raises(fmesh.errors.UnpicklableObjectError, match="member"):
            ctx.all_gather_object(threading.Lock(), mesh, "dp")
        before = ctx.stats()["groups_created"]
        with pytest.raises(ValueError, match=r"src=3 is an index within the group: valid 0\.\.1"):
            ctx.broadcast_object(1, mesh, "pp", src=3)
        with pytest.raises(ValueError, match=r"perm pair \(2, 0\): source 2 is outside axis 'pp' of size 2"):
            ctx.ppermute(torch.ones(1), mesh, "pp", [(2, 0)])
        assert ctx.stats()["groups_created"] == before
    with fmesh.simulate(4) as sim:
        mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
        assert sim.ctx.all_gather_object("same", mesh, "tp") == ["same", "same"]
        with pytest.raises(ValueError, match=r"simulate\(\) cannot run point-to-point .* fmesh.launch"):
            sim.ctx.shift(sim.per_rank(lambda r: torch.tensor([float(r)])), mesh, "tp")


ONE = """
import fmesh, torch
with fmesh.Context.from_env() as ctx:
    mesh = fmesh.make_mesh((1, 1), ("dp", "tp"))
    print(ctx.rank, ctx.world_size, ctx.all_reduce(torch.ones(1), mesh, "dp").item(), ctx.index(mesh, "tp"),
          ctx.all_gather_object("me", mesh), ctx.broadcast_object(7, mesh), ctx.shift(torch.ones(1), mesh, "dp").item())
"""


@pytest.mark.slow
def test_from_env_without_a_launcher_is_a_world_of_one() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                                              "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # gloo on the CPU, on a GPU machine too
    result = subprocess.run([sys.executable, "-c", ONE], capture_output=True, text=True, timeout=patience(120),
                            env=env)
    assert result.returncode == 0, result.stderr
    # The last line: torch 2.10's gloo prints "[Gloo] Rank 0 is connected to 0 peer ranks..." before it.
    assert result.stdout.splitlines()[-1].split() == ["0", "1", "1.0", "0", "['me']", "7", "0.0"], result.stdout
    said = [line for line in result.stderr.splitlines() if line.startswith("fmesh:")]
    assert len(said) == 1 and "a world of one process" in said[0] and "torchrun" in said[0], result.stderr
    partial = subprocess.run([sys.executable, "-c", ONE], capture_output=True, text=True, timeout=patience(120),
                             env={**env, "RANK": "0"})
    assert partial.returncode != 0
    assert "needs the launcher's environment variables ['WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT']" in partial.stderr


@st.composite
def partial_perms(draw: st.DrawFn, least: int = 0) -> tuple[int, list[Any]]:
    """An axis size and a partial permutation of it, valid by construction: ``k`` distinct sources zipped with
    ``k`` distinct destinations, each pair a tuple or a list."""
    size = draw(st.integers(max(1, least), 6))
    sources = draw(st.permutations(range(size)))
    destinations = draw(st.permutations(range(size)))
    k = draw(st.integers(least, size))
    kinds = draw(st.lists(st.sampled_from([tuple, list]), min_size=k, max_size=k))
    return size, [kind(pair) for kind, pair in zip(kinds, zip(sources[:k], destinations[:k], strict=True),
                                                   strict=True)]


# Each way to break a valid perm: (the error it must raise, a word its message must contain).
BREAKS = {
    "repeated source": (ValueError, "repeats source"),
    "repeated destination": (ValueError, "repeats destination"),
    "source outside": (ValueError, "outside axis"),
    "destination outside": (ValueError, "outside axis"),
    "coordinate not an int": (TypeError, "pairs of ints"),
    "not a pair": (TypeError, "pairs of ints"),
    "not a sequence": (TypeError, "sequence of (source, destination) pairs"),
}


def broken(perm: list[Any], size: int, kind: str, data: st.DataObject) -> tuple[object, str]:
    """``perm`` made invalid in the way ``kind`` names (one new pair, at any position, or another type), and a
    word the error must say."""
    words = BREAKS[kind][1]
    free = [c for c in range(size) if c not in {d for _, d in perm}]
    unused = [c for c in range(size) if c not in {s for s, _ in perm}]
    if kind == "repeated source":
        source = data.draw(st.sampled_from([s for s, _ in perm]))
        pair: object = (source, data.draw(st.sampled_from(free))) if free else None
    elif kind == "repeated destination":
        destination = data.draw(st.sampled_from([d for _, d in perm]))
        pair = (data.draw(st.sampled_from(unused)), destination) if unused else None
    elif kind == "source outside":
        pair = (data.draw(st.sampled_from([-1, size, size + 3])), data.draw(st.integers(0, size - 1)))
    elif kind == "destination outside":
        pair = (data.draw(st.integers(0, size - 1)), data.draw(st.sampled_from([-1, size, size + 3])))
    elif kind == "coordinate not an int":
        odd = data.draw(st.sampled_from([True, 1.0, "1", None]))
        pair = data.draw(st.sampled_from([(odd, 0), (0, odd)]))
    elif kind == "not a pair":
        pair = data.draw(st.sampled_from([(0,), (0, 0, 0), [], "01", 0]))
    else:
        return data.draw(st.sampled_from([None, 0, "0110", {(0, 0)}])), words
    if pair is None:  # every coordinate is taken: repeat a whole pair, which repeats its source and destination
        pair, words = tuple(data.draw(st.sampled_from(perm))), "repeats"
    at = data.draw(st.integers(0, len(perm)))
    return [*perm[:at], pair, *perm[at:]], words


def test_check_perm_takes_numpy_and_torch_integers_as_ints() -> None:
    import numpy as np

    perm = [(np.int64(0), torch.tensor(1).item()), (np.int32(1), np.int64(0))]
    assert check_perm(perm, 2, "pp") == ((0, 1), (1, 0))
    assert all(type(c) is int for pair in check_perm(perm, 2, "pp") for c in pair)
    with pytest.raises(TypeError, match="pairs of ints"):
        check_perm([(np.float64(0.0), 1)], 2, "pp")


def test_check_perm_accepts_the_partial_permutations_and_names_each_way_to_break_one() -> None:
    """Law: every partial permutation comes back as tuples, unchanged; each kind of broken one raises its own
    error, whose message names what is wrong. Both branches counted: valid non-empty perms >= 30% of draws,
    each kind of break >= 10 times."""
    seen = dict.fromkeys(["draws", "valid", "valid non-empty", *BREAKS], 0)

    @given(st.sampled_from([*[None] * (2 * len(BREAKS)), *BREAKS]), st.data())  # two thirds valid
    def check(kind: str | None, data: st.DataObject) -> None:
        size, perm = data.draw(partial_perms(least=1 if kind and kind.startswith("repeated") else 0))
        seen["draws"] += 1
        if kind is None:
            assert check_perm(perm, size, "pp") == tuple((s, d) for s, d in perm)
            seen["valid"] += 1
            seen["valid non-empty"] += bool(perm)
            return
        bad, words = broken(perm, size, kind, data)
        with pytest.raises(BREAKS[kind][0], match=re.escape(words)):
            check_perm(bad, size, "pp")
        seen[kind] += 1

    settings(max_examples=600, derandomize=True)(check)()  # the counts are the strategy's: the same every run
    print(f"\ncheck_perm draws: {seen}")
    assert seen["valid non-empty"] >= 0.3 * seen["draws"], seen
    assert all(seen[kind] >= 10 for kind in BREAKS), seen
