"""What makes two groups the same: options normalised at the door, described exactly or refused."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch.distributed as dist

import fmesh
from fmesh.context import failures
from fmesh.context.groups import Target
from fmesh.context.options import AxisOptions, GroupSettings, describe_options


def gloo_options(threads: int = 2) -> object:
    options = dist.ProcessGroupGloo._Options()
    options._threads = threads
    return options


def test_options_are_described_exactly_and_per_group_fields_ignored() -> None:
    two, four = gloo_options(2), gloo_options(4)
    assert describe_options(two) != describe_options(four)
    before = describe_options(two)
    # Fields torch writes into an options object for each group it creates are not the user's choice.
    two.group_name, two.global_ranks_in_group, two._timeout = "some:group", [0, 1], timedelta(seconds=5)
    assert describe_options(two) == before
    settings = GroupSettings.of(two, 60, {"dp": AxisOptions(options=four)}, backend="gloo")
    assert settings.spec(("tp",), (0, 1)) != settings.spec(("dp",), (0, 1))
    assert settings.spec(("tp",), (0, 1)).digest() != settings.spec(("dp",), (0, 1)).digest()
    assert settings.spec(("tp",), (0, 1)) == GroupSettings.of(gloo_options(2), 60, backend="gloo").spec(("x",), (0, 1))


def test_options_that_cannot_be_described_are_refused_before_any_group() -> None:
    opaque = gloo_options()
    opaque._devices = [dist.ProcessGroupGloo.create_device(interface="lo")]
    with pytest.raises(ValueError, match=r"options\._devices\[0\].*cannot describe exactly"):
        AxisOptions(options=opaque)
    with pytest.raises(ValueError, match=r"options\._devices\[0\]"):
        fmesh.Context(backend="gloo", rank=0, world_size=1, options=opaque)
    assert not dist.is_initialized()


def test_axis_options_are_normalised_where_they_enter() -> None:
    assert AxisOptions(backend="GLOO", timeout=30) == AxisOptions(backend="gloo", timeout=timedelta(seconds=30))
    with pytest.raises(ValueError, match="unknown backend 'ncl'"):
        AxisOptions(backend="ncl")
    with pytest.raises(ValueError, match=r"timeout must be between 0\.001 s .* but got -1"):
        AxisOptions(timeout=-1)
    with pytest.raises(TypeError, match=r"timeout must be seconds or a datetime\.timedelta, got '5'"):
        AxisOptions(timeout="5")


def test_an_empty_axis_name_is_refused_in_axis_options() -> None:
    with pytest.raises(ValueError, match=r"got the empty name ''.*axis_options=\{'tp'"):
        fmesh.Context.fake(2, axis_options={"": AxisOptions(timeout=5)})


def test_axes_are_normalised_once_and_cached_once() -> None:
    import torch

    with fmesh.Context.fake(4) as ctx:
        mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
        for axes in ("tp", ("tp",), ["tp"]):
            ctx.all_reduce(torch.ones(1), mesh, axes)
        line = fmesh.make_mesh((4,), ("w",))
        for every in (None, "w", ["w"], ("w",)):
            ctx.all_gather(torch.ones(1), line, every)
        stats = ctx.stats()
        assert stats["meshes_seen"] == 2 and stats["groups_created"] == 2
        assert stats["cache_hits"] == 5
        with pytest.raises(TypeError, match=r"expected axes as an axis name.*but got 3"):
            ctx.all_reduce(torch.ones(1), mesh, 3)  # type: ignore[arg-type]


def test_a_timeout_is_told_by_its_type_or_by_the_time_waited() -> None:
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
    target = Target(mesh, ("tp",), (0, 1), GroupSettings.of(None, 60, backend="gloo").spec(("tp",), (0, 1)), member=0)
    minute, now = timedelta(seconds=60), time.monotonic()
    with pytest.raises(fmesh.GroupTimeoutError, match=r"all_reduce along the group \[0, 1\] along axes \('tp',\)"):
        failures.failed("all_reduce", target, target.ranks, minute, now, dist.DistStoreError("wait"), None)
    with pytest.raises(fmesh.GroupTimeoutError, match="timed out after 60s"):
        failures.failed("all_reduce", target, target.ranks, minute, now - 60, RuntimeError("peer closed"), None)
    quick = RuntimeError("Timed out? No: an error that merely mentions a timeout, raised at once")
    with pytest.raises(RuntimeError) as caught:
        failures.failed("all_reduce", target, target.ranks, minute, now, quick, None)
    assert caught.value is quick


def test_the_context_parameters_are_one_list() -> None:
    """Context(...) is World.start's parameters plus the group settings; from_env and fake take the same
    names with the same defaults (a parameter added to one and not the others fails here)."""
    import inspect
    from collections.abc import Callable

    from fmesh.context.world import World

    def parameters(fn: Callable[..., object]) -> dict[str, object]:
        return {name: p.default for name, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}

    context = parameters(fmesh.Context.__init__)
    world = parameters(World.start)
    del world["generation"]  # how many recoveries made this world: Context.recover sets it, never a user
    del world["agenda"]  # what the ranks compare as they start: the Context makes it of its ``meshes``
    del world["connect_timeout"]  # the settings' creation timeout, which the Context passes
    del world["gone"]  # the ranks whose processes ended: the launcher's marks, or a recovery's
    del world["met_before"]  # the meeting a recovery held just before: the ranks count their connections after it
    settings = set(inspect.signature(GroupSettings.of).parameters) - {"cls", "backend"}
    assert set(context) == set(world) | settings | {"simulated", "check_tensors", "meshes"}, sorted(context)
    assert {name: context[name] for name in world if name != "timeout"} == {
        name: default for name, default in world.items() if name != "timeout"}
    from_env = parameters(fmesh.Context.from_env)
    assert from_env.items() <= context.items(), sorted(from_env.items() - context.items())
    assert set(context) - set(from_env) == {"rank", "world_size", "store", "init_method", "device", "simulated"}
