"""fmesh: a JAX-style, functional device-mesh API for PyTorch.

Mesh values are pure and cheap at any world size; a Context (the only part
with side effects) turns them into process groups when a collective needs one.

The front door holds what a program uses: the values and their transforms, the elastic mesh functions, the
Context and its launchers, the main recipes, the picture, and the errors a program catches. The rest is one
package away: :mod:`fmesh.plan` (everything that reasons about a job without a process group),
:mod:`fmesh.context` (the Context's other values), :mod:`fmesh.errors` (every exception and warning).

The package is layered, each layer importing only from those below it (``tests/architecture.py``):

* :mod:`fmesh.errors`: every exception and warning fmesh raises;
* :mod:`fmesh.layout`: the CuTe-style layout algebra over tuples of ints;
* :mod:`fmesh.mesh`: ``Universe``, ``Mesh``, the pure transforms and the elastic mesh functions;
* :mod:`fmesh.plan`: the communicator planner, topology, recipes, costs, the job plan, manifests, the
  recovery plan and the tables the command line prints;
* :mod:`fmesh.pictures`: pictures of meshes, a job's traffic and a tensor's sharding, as text and HTML
  (:mod:`fmesh.rendering`, the former name, serves the same functions);
* :mod:`fmesh.context`: the only code that touches ``torch.distributed``;
* :mod:`fmesh.cli`: ``python -m fmesh``.

Only the context needs torch; it is imported on first use of one of its names.

>>> import fmesh
>>> mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
>>> fmesh.flatten(mesh, ("dp", "cp"), "dp_cp").group(0, "dp_cp")
(0, 4, 8, 12)
"""

import importlib
from typing import TYPE_CHECKING, Any

from fmesh import errors as errors  # the modules one package away from the front door
from fmesh import pictures as pictures
from fmesh import plan as plan
from fmesh import rendering as rendering
from fmesh.errors import (
    ContextClosedError,
    GroupTimeoutError,
    LaunchError,
    MeshMismatchError,
    NoGradientError,
    RankLostError,
    RecoveryError,
    SpmdTypeError,
    TensorMismatchError,
    UnsupportedTorchError,
)
from fmesh.layout import Layout
from fmesh.mesh import (
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
from fmesh.pictures import render
from fmesh.plan.costs import cost
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.topology import Topology

if TYPE_CHECKING:
    from fmesh import context as context
    from fmesh.context import Context, from_device_mesh, launch, simulate

# The Context needs torch.distributed; importing it lazily keeps `import fmesh` light
# for planning meshes in a notebook.
_CONTEXT_NAMES = frozenset({"Context", "from_device_mesh", "launch", "simulate"})


def _publish(value: Any) -> Any:
    """Say ``fmesh`` in ``value.__module__`` (a class's or function's), so that docs, reprs and tracebacks show the
    public path (``fmesh.Context``) rather than the module that happens to define it; ``value`` is returned."""
    if isinstance(value, type) or callable(value):
        value.__module__ = __name__
    return value


def __getattr__(name: str) -> Any:
    if name in _CONTEXT_NAMES or name == "context":
        context = importlib.import_module("fmesh.context")  # sets fmesh.context: asked once
        return context if name == "context" else _publish(getattr(context, name))
    raise AttributeError(f"module 'fmesh' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names and the lazily imported ones, so that ``dir(fmesh)`` and tab completion list them."""
    return sorted(set(globals()) | _CONTEXT_NAMES | {"context"})


pictures.show_in_notebooks()

__all__ = [  # noqa: RUF022 (grouped as the API reference groups them)
    # values and their transforms
    "Layout",
    "Mesh",
    "Universe",
    "make_mesh",
    "concat",
    "flatten",
    "rename",
    "select",
    "slice",
    "unflatten",
    # elastic meshes
    "new_rank",
    "old_rank",
    "resize",
    "without",
    # the Context
    "Context",
    "from_device_mesh",
    "launch",
    "simulate",
    # recipes and the picture
    "ParallelDims",
    "Topology",
    "cost",
    "render",
    # the errors a program catches
    "ContextClosedError",
    "GroupTimeoutError",
    "LaunchError",
    "MeshMismatchError",
    "NoGradientError",
    "RankLostError",
    "RecoveryError",
    "SpmdTypeError",
    "TensorMismatchError",
    "UnsupportedTorchError",
]

for _name in __all__:
    if _name not in _CONTEXT_NAMES:
        _publish(globals()[_name])
del _name
