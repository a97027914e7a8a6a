"""fmesh: a JAX-style, functional device-mesh API for PyTorch.

Mesh values are pure and cheap at any world size; a Context (the only part
with side effects) turns them into process groups when a collective needs one.

The package is layered, each layer importing only from those below it:

* :mod:`fmesh.errors`: every exception and warning fmesh raises;
* :mod:`fmesh.layout`: the CuTe-style layout algebra over tuples of ints;
* :mod:`fmesh.mesh`: ``Universe``, ``Mesh`` and the pure transforms;
* recipes: :mod:`fmesh.parallel`, :mod:`fmesh.elastic`, :mod:`fmesh.topology`, :mod:`fmesh.costs`,
  :mod:`fmesh.planning`, :mod:`fmesh.manifest`, :mod:`fmesh.recovery`, :mod:`fmesh.rendering`;
* :mod:`fmesh.context`: the only code that touches ``torch.distributed``;
* :mod:`fmesh.cli`: ``python -m fmesh``.

Only the context needs torch; it is imported on first use of one of its names.

>>> import fmesh
>>> mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
>>> fmesh.flatten(mesh, ("dp", "cp"), "dp_cp").group(0, "dp_cp")
(0, 4, 8, 12)
"""

from typing import TYPE_CHECKING, Any

from fmesh import costs, elastic, manifest, parallel, planning, recovery, rendering, topology
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
    NoGradientError,
    PlacementWarning,
    RankLostError,
    RecoveryError,
    RemoteTraceback,
    SpmdTypeError,
    TensorMismatchError,
    UnpicklableObjectError,
    UnsupportedTorchError,
)
from fmesh.layout import Layout
from fmesh.mesh import (
    Lineage,
    Mesh,
    Universe,
    concat,
    flatten,
    make_mesh,
    new_rank,
    old_rank,
    rename,
    resize,
    select,
    slice,
    unflatten,
    without,
)
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


def _publish(value: Any) -> Any:
    """Say ``fmesh`` in ``value.__module__`` (a class's or function's), so that docs, reprs and tracebacks show the
    public path (``fmesh.Context``) rather than the module that happens to define it; ``value`` is returned."""
    if isinstance(value, type) or callable(value):
        value.__module__ = __name__
    return value


def __getattr__(name: str) -> Any:
    if name in _CONTEXT_NAMES:
        from fmesh import context

        return _publish(getattr(context, name))
    raise AttributeError(f"module 'fmesh' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names and the lazily imported ones, so that ``dir(fmesh)`` and tab completion list them."""
    return sorted(set(globals()) | _CONTEXT_NAMES)


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
    "Lineage",
    "Links",
    "ManifestError",
    "Mesh",
    "MeshMismatchError",
    "NoGradientError",
    "ParallelDims",
    "PlacementWarning",
    "PlannedGroup",
    "RankLostError",
    "RecoveryError",
    "RemoteTraceback",
    "SpmdTypeError",
    "Simulation",
    "TensorMismatchError",
    "Topology",
    "Universe",
    "UnpicklableObjectError",
    "UnsupportedTorchError",
    "concat",
    "cost",
    "costs",
    "device_mesh_groups",
    "elastic",
    "flatten",
    "from_device_mesh",
    "launch",
    "make_mesh",
    "manifest",
    "new_rank",
    "old_rank",
    "parallel",
    "planning",
    "recovery",
    "rename",
    "render",
    "rendering",
    "resize",
    "select",
    "simulate",
    "slice",
    "topology",
    "unflatten",
    "without",
]

for _name in __all__:
    if _name not in _CONTEXT_NAMES and not isinstance(globals()[_name], type(rendering)):
        _publish(globals()[_name])
del _name
