"""The Context: the only part of fmesh that touches ``torch.distributed``.

Modules, one concept each:

* ``context``: :class:`Context`, the thin owner of the rooms below and the public API; every tensor collective
  goes through its one door (the tensor and arguments checked, the route resolved, then eager, autograd or no
  gradient), and it ends one way in three modes (close, abort, hand over to a recovery);
* ``world``: this process, its device and the default process group;
* ``set_up``: the connect timeout torch's set-up of a group is given, and how long a death inside it holds the
  other members;
* ``options``: what makes two groups the same (:class:`AxisOptions`, group specs);
* ``groups``: the registry of process groups and their creation, and the route of a collective (target, process
  group, status board) it hands out;
* ``store``: what the ranks say to each other through the job's store, one protocol per module: the keys and
  records, the one blocking wait and meeting, the status board, the start rendezvous, the agreement on a group
  (and its diagnosis), the roll call, the recovery's vote, and the sockets of each group (``connections``);
* ``failures``: what a failed collective means, told on every member (a roll call names the ranks gone);
* ``tensors``: the tensors checked at the door of a collective, and the opt-in check across ranks with its state;
* ``collectives``: collectives along mesh axes;
* ``autograd``: the backward of every tensor collective;
* ``objects``: picklable objects along mesh axes, as byte tensors;
* ``permute``: ``ppermute`` and ``shift`` along one axis, on batched point-to-point operations;
* ``export``: torch ``DeviceMesh`` objects on the context's groups;
* ``device_mesh``: fmesh meshes from torch ``DeviceMesh`` objects (:func:`from_device_mesh`);
* ``group_plan``: which groups a program will need (:class:`GroupPlan`), on the communicator planner of
  :mod:`fmesh.plan.communicators`;
* ``recovery``: after ranks are lost, the lost ranks checked and the new world; what becomes of each group is
  the planner's one rule (:func:`fmesh.plan.communicators.renewals`), which the registry applies;
* ``launch``: :func:`launch` and :func:`simulate`, ranks for notebooks and tests;
* ``_torch``: every private torch name fmesh uses, and nothing else.
"""

from fmesh.context._torch import dispatch_mode_base, torch_function_disabled
from fmesh.context.context import Context
from fmesh.context.device_mesh import device_mesh_groups, from_device_mesh
from fmesh.context.group_plan import GroupPlan, PlannedGroup
from fmesh.context.launch import Simulation, launch, simulate
from fmesh.context.options import AxisOptions

__all__ = [
    "AxisOptions",
    "Context",
    "GroupPlan",
    "PlannedGroup",
    "Simulation",
    "device_mesh_groups",
    "dispatch_mode_base",
    "from_device_mesh",
    "launch",
    "simulate",
    "torch_function_disabled",
]
