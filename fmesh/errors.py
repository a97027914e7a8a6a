"""Every exception and warning fmesh raises of its own, with the situation that raises it.

Importing this module needs nothing (no torch), so a program can catch fmesh's errors wherever
it runs. Bad arguments are plain ``TypeError``/``ValueError``/``KeyError`` naming the value and the
valid choices; the classes here are for what arguments alone cannot show.

>>> import fmesh.plan.manifest
>>> try:  # a ManifestError is a ValueError: code that catches bad input catches it
...     fmesh.plan.manifest.check_manifest([], "job.json")
... except ValueError as error:
...     print(type(error).__name__, error)
ManifestError job.json: expected a JSON object with schema 'fmesh.manifest/1', but got list
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CommandLineError",
    "ContextClosedError",
    "FileDescriptorLimitError",
    "FileDescriptorWarning",
    "GroupTimeoutError",
    "LaunchError",
    "ManifestError",
    "MeshMismatchError",
    "NoGradientError",
    "PlacementWarning",
    "RankLostError",
    "RecoveryError",
    "RemoteTraceback",
    "SpmdTypeError",
    "StoreUnresponsiveError",
    "TensorMismatchError",
    "UnpicklableObjectError",
    "UnsupportedTorchError",
    "UntestedTorchWarning",
]


class MeshMismatchError(ValueError):
    """Ranks disagree about a mesh: a different rank map, axis sizes or axis order.

    Raised by the Context on every member of a group it is about to create, when the members'
    descriptions of that group differ (``Mesh(a=2, b=1)`` on rank 0, ``Mesh(a=1, b=2)`` on rank 1).

    >>> from datetime import timedelta
    >>> import torch.distributed as dist
    >>> from fmesh.context.store.agreement import agree, arrive
    >>> from fmesh.context.store.board import Board
    >>> store = dist.HashStore()
    >>> _ = arrive(Board(store, "doc", 1, timedelta(seconds=5)), "g", [0, 1], "Mesh(tp=2)", "the dp group")
    >>> agree(Board(store, "doc", 0, timedelta(seconds=5)), "g", [0, 1], "Mesh(dp=2)", "the dp group")
    Traceback (most recent call last):
    ...
    fmesh.MeshMismatchError: on rank 0: ranks disagree about the dp group. Rank 0 means: Mesh(dp=2); the first ...
    """


class GroupTimeoutError(TimeoutError):
    """A rank did not arrive in time to create a group or to run a collective.

    Raised by the Context when a member of a group never comes (it crashed, or its program took
    another path); the message names the axes, the mesh and the ranks waited for.

    >>> from datetime import timedelta
    >>> import torch.distributed as dist
    >>> from fmesh.context.store.agreement import agree
    >>> from fmesh.context.store.board import Board
    >>> agree(Board(dist.HashStore(), "doc", 0, timedelta(seconds=0.2)), "g", [0, 1], "Mesh(dp=2)", "the dp group")
    Traceback (most recent call last):
    ...
    fmesh.GroupTimeoutError: on rank 0: the members of the dp group waited 0s, but ranks [1] never came: ...
    """


class RankLostError(RuntimeError):
    """A collective failed because members of its group are gone (a process exited or crashed).

    Raised by the Context on the surviving members, in the time the backend takes to notice (seconds
    on gloo), naming the mesh, the axes and the members that did not answer a roll call through the
    store; the backend's own error is its ``__cause__``.

    >>> from datetime import timedelta
    >>> import torch.distributed as dist
    >>> from fmesh.context.store.agreement import agree
    >>> from fmesh.context.store.board import Board
    >>> store = dist.HashStore()
    >>> Board(store, "doc", 1, timedelta(seconds=5)).failed(ValueError("bad batch"))
    >>> agree(Board(store, "doc", 0, timedelta(seconds=5)), "g", [0, 1], "Mesh(dp=2)", "the dp group")
    Traceback (most recent call last):
    ...
    fmesh.RankLostError: on rank 0: rank 1 failed: ValueError: bad batch, instead of creating this group ...
    """


class StoreUnresponsiveError(RankLostError):
    """The job's store stopped answering: its host (rank 0's process, or torchrun's agent) is frozen (SIGSTOP, a
    debugger), starved, or its machine unreachable, past the bound a rank waits for an answer.

    Raised on every rank whose heartbeat's store operation went unanswered for 15 s
    (``fmesh.context.store.pulse.ANSWER_SECONDS``, and a fresh connection's for 3 s), in place of a wait as long as
    the freeze: its connections to the store are cut then, so no wait of fmesh's (nor torch's) blocks on it longer.
    It names the store's address and who hosts it. No group can be made or recovered without the store: restart the
    job (a store hosted outside the ranks survives a rank's freeze).

    >>> raise StoreUnresponsiveError("on rank 1: the store at node0:29500 (rank 0 hosts it) stopped answering")
    Traceback (most recent call last):
    ...
    fmesh.errors.StoreUnresponsiveError: on rank 1: the store at node0:29500 (rank 0 hosts it) stopped answering
    """


class RecoveryError(RuntimeError):
    """The survivors of a lost rank could not recover together (:meth:`fmesh.Context.recover`): they
    disagree about which ranks were lost, or one of them never came to recover.

    Raised on every survivor that sees it, before any process group is touched, naming both sets of
    lost ranks (or the survivors that did not come), never a hang.

    >>> from datetime import timedelta
    >>> import torch.distributed as dist
    >>> from fmesh.context.store.board import Board
    >>> from fmesh.context.store.recovery_vote import agree_on_loss, post_loss
    >>> store = dist.HashStore()
    >>> post_loss(Board(store, "doc", 1, timedelta(seconds=5)), [3], [])
    1
    >>> agree_on_loss(Board(store, "doc", 0, timedelta(seconds=5)), [0, 1], [2], [])
    Traceback (most recent call last):
    ...
    fmesh.RecoveryError: on rank 0: the survivors disagree about the ranks lost: rank 0 says [2], rank 1 says [3]. ...
    """


class ContextClosedError(RuntimeError):
    """A closed :class:`~fmesh.Context` was asked for a group or a collective.

    >>> import fmesh
    >>> ctx = fmesh.Context.fake(2)
    >>> ctx.close()
    >>> ctx.barrier(fmesh.make_mesh((2,), ("dp",)), "dp")
    Traceback (most recent call last):
    ...
    fmesh.ContextClosedError: this fmesh Context is closed; create a new one (its groups were destroyed)
    """


class FileDescriptorLimitError(OSError):
    """Creating another process group would exhaust this process's file descriptors (``ulimit -n``).

    Raised by the Context before the group is created (each gloo group holds a socket per peer), on the
    rank that has no room; the other members learn it through the store and raise
    :class:`RankLostError` naming it. :class:`FileDescriptorWarning` comes first, past 80% of the limit.

    >>> from fmesh.context.store.connections import Connections
    >>> Connections().check_room(2**40, held=0, what="a group of 2**40 ranks")
    Traceback (most recent call last):
    ...
    fmesh.errors.FileDescriptorLimitError: creating a group of 2**40 ranks needs about 2199023255554 more file ...
    """


class FileDescriptorWarning(UserWarning):
    """This process's open file descriptors passed 80% of its limit while the Context created groups.

    >>> import warnings
    >>> from fmesh.context.store.connections import RESERVE, WARN_SHARE, Connections, descriptor_budget
    >>> used, limit = descriptor_budget()
    >>> size = int(WARN_SHARE * (limit - RESERVE) - used) // 2 + 1  # a group that takes the process past 80%
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     Connections().check_room(size, held=3, what="the dp group")
    >>> [w.category.__name__ for w in caught]
    ['FileDescriptorWarning']
    """


class LaunchError(RuntimeError):
    """A rank started by :func:`fmesh.launch` failed in a way that cannot be re-raised as itself:
    its exception could not be pickled, or the process died without one. Also an environment from the launcher that
    cannot start a job: two processes started with one ``RANK``, or a ``MASTER_PORT`` another program holds.

    >>> import fmesh, os
    >>> fmesh.launch(lambda ctx: os._exit(3), world_size=1)
    Traceback (most recent call last):
    ...
    fmesh.LaunchError: rank 0 died with exit code 3
    """


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a launched rank; the ``__cause__`` of what
    :func:`fmesh.launch` re-raises.

    >>> import fmesh
    >>> try:
    ...     fmesh.launch(lambda ctx: 1 / ctx.rank, world_size=1)
    ... except ZeroDivisionError as error:
    ...     print(type(error.__cause__).__name__, str(error.__cause__).splitlines()[0])
    RemoteTraceback on rank 0:
    """


class UnpicklableObjectError(TypeError):
    """An object given to ``ctx.all_gather_object`` or ``ctx.broadcast_object`` could not be pickled.

    Raised on every member of the group, not only on the rank whose object failed: the members learn
    of it through the same collective that would have carried the objects, so none is left waiting.
    The message names the members (index in the group and global rank) whose objects failed, and why.

    >>> import fmesh
    >>> with fmesh.Context.fake(2) as ctx:
    ...     ctx.all_gather_object(lambda: 0, fmesh.make_mesh((2,), ("dp",)), "dp")
    Traceback (most recent call last):
    ...
    fmesh.errors.UnpicklableObjectError: all_gather_object along the group [0, 1] ...: expected a picklable ...
    """


class UnsupportedTorchError(ImportError):
    """The installed torch is outside the releases fmesh's Context supports.

    Raised once, by ``import fmesh.context`` (or the first use of ``fmesh.Context``), naming the
    installed version and the supported range; the mesh values, recipes and plans work with any
    torch, or none.

    >>> from fmesh.context import _torch
    >>> _torch.check_supported("2.9.0")
    Traceback (most recent call last):
    ...
    fmesh.UnsupportedTorchError: fmesh's Context supports torch 2.10 to 2.15, but torch 2.9.0 is installed; ...
    """


class UntestedTorchWarning(UserWarning):
    """The installed torch is newer than the releases fmesh's Context is tested with: it runs, each private part
    of torch it uses probed at import; a feature whose probe failed raises :class:`UnsupportedTorchError` at its
    use. Warned once, at ``import fmesh.context``; ``FMESH_REFUSE_UNTESTED_TORCH=1`` refuses such a torch instead.

    >>> import warnings
    >>> warnings.simplefilter("ignore", UntestedTorchWarning)  # a job that has checked its torch
    """


class CommandLineError(ValueError):
    """Bad flags to ``python -m fmesh``; the command prints it as one line and exits with status 2.

    >>> import io
    >>> from fmesh.cli import main
    >>> err = io.StringIO()
    >>> main(["plan", "--world-size", "8", "--gpus-per-node", "8", "--absorb", "dp_shard"], stderr=err)
    2
    >>> print(err.getvalue(), end="")
    fmesh plan: error: --absorb says which axes absorb a loss, so it goes with --lose RANKS
    """


class ManifestError(ValueError):
    """A communicator manifest cannot be read, or does not say what its schema says it must.

    Raised by :func:`fmesh.plan.manifest.load_manifest` and :func:`fmesh.plan.manifest.check_manifest` with one line
    naming the file and the first field that is wrong (an unknown schema version, a missing field, a layout
    that does not tile its world, counts that do not add up); ``python -m fmesh diff`` prints it and exits 2.

    >>> from fmesh.plan.manifest import check_manifest
    >>> check_manifest({"schema": "fmesh.manifest/1"}, "job.json")
    Traceback (most recent call last):
    ...
    fmesh.errors.ManifestError: job.json: manifest has no field 'universe'
    """


class PlacementWarning(UserWarning):
    """A bandwidth-hungry mesh axis (tp, cp, ep) crosses hosts while a cheaper one stays inside.

    Emitted by :func:`fmesh.plan.topology.warn_placement`.

    >>> import warnings, fmesh
    >>> from fmesh.plan.topology import Topology, warn_placement
    >>> mesh = fmesh.make_mesh((4, 4), ("tp", "dp"))  # tp outermost: across hosts, dp inside one
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = warn_placement(Topology(2, 8).spans({"tp": mesh["tp"], "dp": mesh["dp"]}))
    >>> [w.category.__name__ for w in caught]
    ['PlacementWarning']
    """


class NoGradientError(RuntimeError):
    """The backward of a collective that has no gradient in fmesh was asked for.

    Raised by ``backward()`` through ``ctx.all_reduce(t, mesh, axes, op=...)`` with op ``max``, ``min`` or
    ``product`` on a tensor that requires grad, naming the op and the axes; fmesh never returns a
    silently wrong gradient. Reduce a detached tensor, or write the selection with a sum all_reduce.

    >>> import fmesh, torch
    >>> with fmesh.Context.fake(2) as ctx:
    ...     best = ctx.all_reduce(torch.ones(2, requires_grad=True), fmesh.make_mesh((2,), ("dp",)), "dp", op="max")
    ...     best.sum().backward()
    Traceback (most recent call last):
    ...
    fmesh.NoGradientError: all_reduce op='max' along the group [0, 1] along axes ('dp',) of Mesh(dp=2; world=2) has ...
    """


class TensorMismatchError(ValueError):
    """The members of a collective's group made different calls: tensors of different shapes or dtypes, another
    collective, or another number of calls.

    Raised on every member by the members' check of their calls (``Context(check_tensors=True)``, the default;
    ``fmesh.context.call_checks``), naming the calls that differ. A call that differs in a way the program never
    showed before is found before any of it is sent: the group stays healthy, unless a member was already blocked
    in the collective (then the group is cut to free it). Any other difference is found within 64 calls, after it
    ran, and the group is cut; ``check_tensors="every-call"`` finds every one before it is sent. Without the check
    such a call aborts gloo, hangs NCCL, or returns another rank's bytes.

    >>> import fmesh, torch
    >>> def odd(ctx):  # rank 1's tensor is longer
    ...     return ctx.all_reduce(torch.ones(ctx.rank + 1), fmesh.make_mesh((2,), ("dp",)), "dp")
    >>> fmesh.launch(odd, world_size=2)
    Traceback (most recent call last):
    ...
    fmesh.TensorMismatchError: on rank ...: all_reduce along the group [0, 1] ...: members hold different tensors: ...
    """


class SpmdTypeError(ValueError):
    """A manual region's program whose gradient or result would be wrong, caught in the forward pass.

    Raised by :func:`fmesh.spmd.region.shard_map` (with ``check=True``, when the region is checked: its first call
    with new shapes) at the operation that breaks a per-axis type rule, naming the value (its name or shape), its
    type along the axis, the axis and the fix: a non-linear operation on a pending sum, a reduction, scan or
    normalisation along a split dimension, a reduction of an already-reduced value, an invariant value that wants
    a gradient meeting a varying one, an aten op with no rule on a pending sum or a split dimension, an out spec
    that does not match the value.

    >>> import fmesh, torch
    >>> from fmesh.spmd import P, shard_map
    >>> with fmesh.Context.fake(2) as ctx:  # each member's mean summed and returned: twice the mean of the whole
    ...     loss = shard_map(lambda ax, x: ax.psum(x.mean(), "dp"), mesh=fmesh.make_mesh((2,), ("dp",)),
    ...                      in_specs=P("dp"), out_specs=P(), ctx=ctx)
    ...     loss.local(torch.arange(2.0))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fmesh.SpmdTypeError: out_specs[0] = P(), output 0: ... psum(mean(input 0), 'dp')... 2 times the mean of the whole...

    ``fix`` is the fix as a value (:class:`fmesh.spmd.fix.Fix`: which edit, where, with which code), the message's
    ``fix: ...`` its rendering.
    """

    def __init__(self, message: str, fix: Any = None) -> None:
        super().__init__(message)
        self.fix = fix

    @classmethod
    def refused(cls, what: str, fix: Any) -> SpmdTypeError:
        """``what``, then ``fix: <fix>``, with ``fix`` (a :class:`fmesh.spmd.fix.Fix`) kept on the error."""
        return cls(f"{what}; fix: {fix}", fix)
