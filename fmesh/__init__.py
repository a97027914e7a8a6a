"""fmesh: a JAX-style, functional device-mesh API for PyTorch.

Mesh values are pure and cheap at any world size; a Context (the only part
with side effects) turns them into process groups when a collective needs one.

The package is layered, each layer importing only from those below it:

* :mod:`fmesh.errors`: every exception and warning fmesh raises;
* :mod:`fmesh.layout`: the CuTe-style layout algebra over tuples of ints;
* :mod:`fmesh.mesh`: ``Universe``, ``Mesh`` and the pure transforms;
* recipes: :mod:`fmesh.parallel`, :mod:`fmesh.topology`, :mod:`fmesh.costs`, :mod:`fmesh.planning`,
  :mod:`fmesh.manifest`, :mod:`fmesh.rendering`;
* :mod:`fmesh.context`: the only code that touches ``torch.distributed``;
* :mod:`fmesh.cli`: ``python -m fmesh``.

Only the context needs torch; it is imported on first use of one of its names.

>>> import fmesh
>>> mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
>>> fmesh.flatten(mesh, ("dp", "cp"), "dp_cp").group(0, "dp_cp")
(0, 4, 8, 12)
"""

from typing import TYPE_CHECKING, Any

from fmesh import costs, manifest, parallel, planning, rendering, topology
from fmesh.costs import Links, cost
from fmesh.errors import (
    CommandLineError,
    ContextClosedError,
    FileDescriptorLimitError,
    FileDescriptorWarning,
    GroupTimeoutError,
    LaunchError,
    ManifestError,
    MeshMismatchError,
    PlacementWarning,
    RankLostError,
    RemoteTraceback,
    UnpicklableObjectError,
    UnsupportedTorchError,
)
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
        PlannedGroup,
        Simulation,
        device_mesh_groups,
        from_device_mesh,
        launch,
        simulate,
    )

# The Context needs torch.distributed; importing it lazily keeps `import fmesh` light
# for planning meshes in a notebook.
_CONTEXT_NAMES = frozenset(
    {"AxisOptions", "Context", "GroupPlan", "PlannedGroup", "Simulation", "device_mesh_groups", "from_device_mesh",
     "launch", "simulate"}
)


def __getattr__(name: str) -> Any:
    if name in _CONTEXT_NAMES:
        from fmesh import context

        return getattr(context, name)
    raise AttributeError(f"module 'fmesh' has no attribute {name!r}")


rendering.show_in_notebooks()

__all__ = [
    "AxisOptions",
    "CommandLineError",
    "Context",
    "ContextClosedError",
    "FileDescriptorLimitError",
    "FileDescriptorWarning",
    "GroupPlan",
    "GroupTimeoutError",
    "LaunchError",
    "Layout",
    "Links",
    "ManifestError",
    "Mesh",
    "MeshMismatchError",
    "ParallelDims",
    "PlacementWarning",
    "PlannedGroup",
    "RankLostError",
    "RemoteTraceback",
    "Simulation",
    "Topology",
    "Universe",
    "UnpicklableObjectError",
    "UnsupportedTorchError",
    "concat",
    "cost",
    "costs",
    "device_mesh_groups",
    "flatten",
    "from_device_mesh",
    "launch",
    "make_mesh",
    "manifest",
    "parallel",
    "planning",
    "rename",
    "render",
    "rendering",
    "select",
    "simulate",
    "slice",
    "topology",
    "unflatten",
]
