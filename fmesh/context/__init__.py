"""The Context: the only part of fmesh that touches ``torch.distributed``."""

from fmesh.context._torch import from_device_mesh
from fmesh.context.agreement import GroupTimeoutError, MeshMismatchError
from fmesh.context.context import AxisOptions, Context, GroupPlan, PlannedGroup
from fmesh.context.launch import LaunchError, RemoteTraceback, Simulation, launch, simulate

__all__ = [
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
]
