"""Every tensor collective of the Context inside ``torch.compile(fullgraph=True)``: zero graph breaks, and
the result and the input's gradient equal to eager; an exported DeviceMesh's ``get_group`` traces too.

Meshes and groups are made outside the compiled functions (``ctx.materialize``), as the docs ask.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo
from paths import ROOT
from support import in_a_child, launch, patience, succeeded
from torch._dynamo.testing import CompileCounterWithBackend

import fmesh
from fmesh import Context

Call = Callable[[torch.Tensor], torch.Tensor]


def collectives(ctx: Context) -> dict[str, Call]:
    """Each collective (and the TP pair) along tp, and along the pair (tp, dp), of a permuted 2 x 2 mesh."""
    mesh = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[2, 0, 3, 1])
    ctx.materialize(mesh, (mesh, ("tp", "dp")))
    pair = ("tp", "dp")
    return {
        "all_reduce": lambda x: ctx.all_reduce(x, mesh, "tp"),
        "all_reduce avg pair": lambda x: ctx.all_reduce(x, mesh, pair, op="avg"),
        "all_gather": lambda x: ctx.all_gather(x, mesh, "tp", dim=1),
        "all_gather pair": lambda x: ctx.all_gather(x, mesh, pair),
        "reduce_scatter": lambda x: ctx.reduce_scatter(x, mesh, "tp"),
        "broadcast": lambda x: ctx.broadcast(x, mesh, "tp", src=1),
        "all_to_all": lambda x: ctx.all_to_all(x, mesh, "tp", 0, 1),
        "ppermute": lambda x: ctx.ppermute(x, mesh, "tp", [(0, 1)]),
        "shift": lambda x: ctx.shift(x, mesh, "tp", offset=1, wrap=True),
        "sum_gradients": lambda x: ctx.sum_gradients(x, mesh, "tp"),
        "sum_partials": lambda x: ctx.sum_partials(x, mesh, "tp"),
    }


def run(call: Call, x: torch.Tensor, compiled: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The result of ``(call(x) ** 2).sum()`` and ``x``'s gradient, through ``compiled`` if given."""
    leaf = x.clone().requires_grad_()

    def loss(t: torch.Tensor) -> torch.Tensor:
        return (call(t) ** 2).sum()

    value = (compiled(loss) if compiled is not None else loss)(leaf)
    value.backward()
    assert leaf.grad is not None
    return value.detach(), leaf.grad


def compiled_like_eager(ctx: Context, backend: str, names: list[str] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {}
    x = torch.arange(8.0).reshape(4, 2) + 10 * ctx.rank
    for name, call in collectives(ctx).items():
        if names is not None and name not in names:
            continue
        eager = run(call, x)
        torch._dynamo.reset()
        # One trace, counted: fullgraph=True refuses a graph break (explain would trace each collective again).
        counted = CompileCounterWithBackend(backend)
        try:
            got = run(call, x, lambda f, counted=counted: torch.compile(f, backend=counted, fullgraph=True))
        except torch._dynamo.exc.Unsupported as error:
            found[name] = {"breaks": f"fullgraph refused it: {error}"}
            continue
        found[name] = {"breaks": 0, "graphs": counted.frame_count,
                       "same": all(torch.allclose(a, b) for a, b in zip(got, eager, strict=True)),
                       "grad nonzero": bool(eager[1].abs().sum() > 0)}
    return found


def on_aot_eager(ctx: Context) -> dict[str, Any]:
    return compiled_like_eager(ctx, "aot_eager")


def on_inductor(ctx: Context) -> dict[str, Any]:
    return compiled_like_eager(ctx, "inductor", ["all_reduce", "all_gather"])


def exported_get_group(ctx: Context) -> dict[str, Any]:
    """funcol on an exported DeviceMesh's ``get_group`` inside a compiled function; and a mesh made inside."""
    from torch.distributed import _functional_collectives as funcol

    device_mesh = ctx.device_mesh(fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[2, 0, 3, 1]))

    def total(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x, "sum", device_mesh.get_group("tp")) * 2

    torch._dynamo.reset()
    got = torch.compile(total, backend="aot_eager", fullgraph=True)(torch.ones(2) * ctx.rank)
    return {"get_group": got.tolist()}


@pytest.mark.slow
def test_every_collective_compiles_with_no_graph_break_and_equals_eager() -> None:
    results = succeeded(launch(on_aot_eager, 4, timeout=400))
    for result in results:
        assert len(result) == 11  # every collective ran
        for name, found in result.items():
            assert {**found, "grad nonzero": True} == {"breaks": 0, "graphs": 1, "same": True,
                                                       "grad nonzero": True}, (name, found)
    # A gradient flows on some rank (ppermute [(0, 1)]: only to the sender): equal zeros would prove little.
    assert all(any(result[name]["grad nonzero"] for result in results) for name in results[0])


@pytest.mark.slow
def test_an_exported_device_mesh_get_group_traces() -> None:
    results = succeeded(launch(exported_get_group, 4, timeout=200))
    # tp groups of rank_map [2, 0, 3, 1]: (2, 0) and (3, 1).
    assert [r["get_group"] for r in results] == [[4.0, 4.0], [8.0, 8.0], [4.0, 4.0], [8.0, 8.0]]


@pytest.mark.slow
def test_inductor_compiles_a_collective_and_its_backward_like_eager() -> None:
    for result in succeeded(launch(on_inductor, 4, timeout=600)):
        assert result == {name: {"breaks": 0, "graphs": 1, "same": True, "grad nonzero": True}
                          for name in ("all_reduce", "all_gather")}


def test_a_mesh_built_inside_a_compiled_function_is_one_clear_error() -> None:
    in_a_child(mesh_built_inside)  # Dynamo in this worker would keep it from forking later tests' ranks


def mesh_built_inside() -> None:
    with Context.fake(4) as ctx:
        def step(x: torch.Tensor) -> torch.Tensor:
            return ctx.all_reduce(x, fmesh.make_mesh((2, 2), ("dp", "tp")), "tp")

        torch._dynamo.reset()
        with pytest.raises(Exception, match=r"make_mesh inside torch.compile: build meshes outside the compiled "
                                            r"function .* ctx.materialize\(mesh\)"):
            torch.compile(step, backend="aot_eager", fullgraph=True)(torch.ones(2))
        assert step(torch.ones(2)).shape == (2,)  # the same function runs in eager


def test_materialize_makes_every_axis_traceable_even_axes_that_share_a_group() -> None:
    in_a_child(materialized_axes_trace)


def materialized_axes_trace() -> None:
    # pp and cp are both groups of one: one planned group, two (mesh, axes) lookups in a compiled region.
    with Context.fake(4) as ctx:
        mesh = fmesh.make_mesh((1, 4, 1), ("pp", "tp", "cp"))
        assert len(ctx.materialize(mesh).groups) < len(mesh.axis_names)

        def step(x: torch.Tensor) -> torch.Tensor:
            return ctx.all_reduce(ctx.all_reduce(x, mesh, "pp"), mesh, "cp") * 2

        torch._dynamo.reset()
        assert torch.compile(step, backend="aot_eager", fullgraph=True)(torch.ones(2)).tolist() == [2.0, 2.0]


def test_a_mesh_without_groups_or_made_inside_a_compiled_function_is_fmesh_error_or_eager_fallback() -> None:
    in_a_child(unmaterialized_or_derived_inside)


def step_on(ctx: Context, mesh: fmesh.Mesh, name: str) -> Call:
    """A step that makes a group (``"no group"``) or a mesh (the others) inside the compiled region."""
    return {
        "no group": lambda x: ctx.all_reduce(x, mesh, "tp"),
        "slice": lambda x: ctx.all_reduce(x, fmesh.slice(mesh, "tp"), "tp"),
        "getitem": lambda x: ctx.all_reduce(x, mesh["tp"], "tp"),
        "flatten": lambda x: ctx.all_reduce(x, fmesh.flatten(mesh, ("dp", "tp"), "w"), "w"),
    }[name]


def unmaterialized_or_derived_inside() -> None:
    # fullgraph=True: fmesh's error saying what to do (it was Dynamo's "does not know how to trace
    # _CacheHashWrapper" or "Unsupported method call"); fullgraph=False: Dynamo falls back to eager for what it cannot
    # trace and the call returns the right sum (it crashed with InternalTorchDynamoError tracing group creation).
    fmesh_error = {
        # (torch 2.10's Dynamo shows the message's template, {axes!r} unformatted: the same words)
        "no group": r"no group yet along (?:'tp'|\{axes!r\}) .* call ctx.materialize\(mesh\)",
        "slice": r"fmesh.slice \(or mesh\[...\]\) inside torch.compile: build meshes outside .* ctx.materialize",
        "getitem": r"fmesh.slice \(or mesh\[...\]\) inside torch.compile: build meshes outside .* ctx.materialize",
        "flatten": r"fmesh.flatten inside torch.compile: build meshes outside .* ctx.materialize",
    }
    for name, pattern in fmesh_error.items():
        for fullgraph in (True, False):
            with Context.fake(4) as ctx:
                mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
                if name != "no group":
                    ctx.materialize(mesh)
                torch._dynamo.reset()
                compiled = torch.compile(step_on(ctx, mesh, name), backend="aot_eager", fullgraph=fullgraph)
                if fullgraph:
                    with pytest.raises(Exception, match=pattern):
                        compiled(torch.ones(2))
                else:
                    assert compiled(torch.ones(2)).tolist() == [1.0, 1.0], name  # the fake backend sums nothing


@pytest.mark.slow
def test_an_eager_job_imports_neither_dynamo_nor_dtensor_and_has_torchs_fake_backend() -> None:
    """Group creation stays out of Dynamo's reach (a compiled region's miss runs it eagerly, untraced), and a DTensor
    is refused at a collective's door, without importing either where nothing compiles or makes DTensors: each import
    is half a CPU-second in every process of a job. Torch registers its ``fake`` backend only in a testing module,
    which DTensor's import loaded: fmesh loads it (a gloo world with a fake axis, the collectives benchmark's
    no-communication baseline, was "Unknown c10d backend type FAKE")."""
    code = ("import sys, torch, fmesh\n"
            "from fmesh.context.options import AxisOptions\n"
            "def rank(ctx):\n"
            "    total = ctx.all_reduce(torch.ones(2), fmesh.make_mesh((2,), ('dp',)), 'dp').tolist()\n"
            "    return total, [name in sys.modules for name in ('torch._dynamo', 'torch.distributed.tensor')]\n"
            "print(fmesh.launch(rank, 2, timeout=60))\n"
            "fake = {'axis_options': {'dp': AxisOptions(backend='fake')}}\n"
            "print(fmesh.launch(rank, 2, timeout=60, context_options=fake))\n")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=patience(120), cwd=ROOT)
    assert ran.returncode == 0, ran.stderr[-3000:]
    gloo, fake = [line for line in ran.stdout.splitlines() if line.startswith("[(")]  # torch 2.10's gloo prints too
    assert gloo == "[([2.0, 2.0], [False, False]), ([2.0, 2.0], [False, False])]", ran.stdout
    assert fake == "[([1.0, 1.0], [False, False]), ([1.0, 1.0], [False, False])]", ran.stdout  # fake: no sum
