"""fmesh: a JAX-style, functional device-mesh API for PyTorch.

Mesh values are pure and cheap at any world size; a Context (the only part
with side effects) turns them into process groups when a collective needs one.

>>> import fmesh
>>> mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
>>> fmesh.flatten(mesh, ("dp", "cp"), "dp_cp").group(0, "dp_cp")
(0, 4, 8, 12)
"""

from typing import TYPE_CHECKING, Any

from fmesh import parallel, rendering, topology
from fmesh.layout import Layout
from fmesh.mesh import Mesh, Universe, concat, flatten, make_mesh, rename, select, slice, unflatten
from fmesh.parallel import ParallelDims
from fmesh.rendering import render
from fmesh.topology import Topology

if TYPE_CHECKING:
    from fmesh.context import (
        AxisOptions,
        Context,
        GroupPlan,
        GroupTimeoutError,
        LaunchError,
        MeshMismatchError,
        PlannedGroup,
        RemoteTraceback,
        Simulation,
        from_device_mesh,
        launch,
        simulate,
    )

# The Context needs torch.distributed; importing it lazily keeps `import fmesh` light
# for planning meshes in a notebook.
_CONTEXT_NAMES = frozenset(
    {
        "AxisOptions",
        "Context",
        "GroupPlan",
        "GroupTimeoutError",
        "LaunchError",
        "MeshMismatchError",
        "PlannedGroup",
        "RemoteTraceback",
        "Simulation",
        "from_device_mesh",
        "launch",
        "simulate",
    }
)


def __getattr__(name: str) -> Any:
    if name in _CONTEXT_NAMES:
        from fmesh import context

        return getattr(context, name)
    raise AttributeError(f"module 'fmesh' has no attribute {name!r}")


__all__ = [
    "AxisOptions",
    "Context",
    "GroupPlan",
    "GroupTimeoutError",
    "LaunchError",
    "Layout",
    "Mesh",
    "MeshMismatchError",
    "ParallelDims",
    "PlannedGroup",
    "RemoteTraceback",
    "Simulation",
    "Topology",
    "Universe",
    "concat",
    "flatten",
    "from_device_mesh",
    "launch",
    "make_mesh",
    "parallel",
    "rename",
    "render",
    "rendering",
    "select",
    "simulate",
    "slice",
    "topology",
    "unflatten",
]
