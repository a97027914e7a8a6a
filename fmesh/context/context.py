"""The Context: the one object with side effects. It owns fmesh's process groups.

A :class:`Context` turns pure :class:`~fmesh.Mesh` values into communication. It is a thin owner of five rooms,
each the only owner of its state: :class:`~fmesh.context.world.World` (this process, its device and the default
group), :class:`~fmesh.context.options.GroupSettings` (backend, options and timeout, per axis),
:class:`~fmesh.context.groups.GroupRegistry` (which groups exist, and how each is created),
:class:`~fmesh.context.call_checks.CallChecks` (the members' check of their calls) and
:class:`~fmesh.context.export.Exporter` (the torch ``DeviceMesh`` objects built on them).

What every rank must do to create groups is in :mod:`fmesh.context.groups`; what a recovery does with them, in
:mod:`fmesh.context.renewal`.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal

import attrs
import torch
import torch.distributed as dist

from fmesh.context import _torch, autograd, collectives, failures, objects, permute, recovery, renewal
from fmesh.context.call_checks import CallChecks, CheckArg
from fmesh.context.collectives import ReduceOp
from fmesh.context.export import Exporter
from fmesh.context.group_plan import GroupPlan, PlanItem, agree_at_start, materialize, plan_groups, starting_with
from fmesh.context.groups import GroupRegistry, Target
from fmesh.context.options import AxisOptions, GroupSettings, wire_options
from fmesh.context.recovery_tries import RecoveryTries
from fmesh.context.tensors import check_tensor
from fmesh.context.world import World
from fmesh.layout.int_tuple import is_int
from fmesh.mesh import Mesh
from fmesh.mesh.mesh import AxesArg

Ending = Literal["close", "abort", "hand_over"]  # how a context ends (Context._end)


class Context:
    """Owns process groups for fmesh meshes; the only fmesh object that communicates.

    Build it with :meth:`from_env` under ``torchrun``, :meth:`fake` for a dry run, or explicitly. Use it as a
    context manager (or call :meth:`close`) to destroy the groups it made. ``meshes``: the meshes (or ``(mesh,
    axes)`` pairs) whose groups every rank agrees on as it starts, in the start's own meeting (fmesh's ``env://``
    rendezvous) or one meeting right after; their groups are then made without meeting again. ``check_tensors``:
    the members' check of their calls (True, False or ``"every-call"``: ``fmesh.context.call_checks``).

    >>> import fmesh
    >>> with fmesh.Context.fake(8, rank=3) as ctx:
    ...     mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
    ...     ctx.all_reduce(torch.ones(2), mesh, "tp").shape, ctx.stats()["groups_created"]
    (torch.Size([2]), 1)
    """

    def __init__(self, *, backend: str | None = None, rank: int | None = None, world_size: int | None = None,
                 store: dist.Store | None = None, init_method: str | None = None,
                 timeout: timedelta | float | None = None, options: Any = None,
                 axis_options: Mapping[str, AxisOptions] | None = None, device: torch.device | str | None = None,
                 gpus_per_node: int | None = None, name: str = "fmesh", simulated: bool = False,
                 creation_timeout: timedelta | float | None = None, check_tensors: CheckArg = None,
                 meshes: Sequence[PlanItem] = ()) -> None:
        # Every argument is checked before any group is touched.
        settings = GroupSettings.of(options, timeout, axis_options, creation_timeout=creation_timeout)
        tensors = CallChecks.of(check_tensors)
        agenda = starting_with(meshes, settings, tensors.mode)  # its meshes' groups and options, agreed at start
        world = World.start(backend=backend, rank=rank, world_size=world_size, store=store, init_method=init_method,
                            timeout=settings.timeout, device=device, gpus_per_node=gpus_per_node, name=name,
                            agenda=agenda, connect_timeout=settings.creation_timeout)
        self._own(world, settings, tensors, simulated, meshes)

    @classmethod
    def _made(cls, world: World, settings: GroupSettings, tensors: CallChecks, simulated: bool = False,
              meshes: Sequence[PlanItem] = ()) -> Context:
        """The rooms on a world whose arguments are checked already (``from_env``, ``recover``)."""
        context = cls.__new__(cls)
        context._own(world, settings, tensors, simulated, meshes)
        return context

    def _own(self, world: World, settings: GroupSettings, tensors: CallChecks, simulated: bool = False,
             meshes: Sequence[PlanItem] = ()) -> None:
        self._world = world
        self._simulated = simulated
        self._tensors = tensors  # the members' check of their calls before each collective (fmesh.context.call_checks)
        self._settings = attrs.evolve(settings, backend=world.backend)
        # The ranks' status board (none on the fake backend), once they agree on every option that goes over the wire.
        self._board = world.board(self._settings.creation_timeout, wire_options(self._settings, tensors.mode))
        # fmesh.simulate: torch's LocalTensorMode runs collectives only over groups whose ranks ascend.
        self._groups = GroupRegistry(world, self._settings, board=self._board, ascending_only=simulated)
        self._recoveries = RecoveryTries()  # this context's recoveries, which may be tried again
        self._exports = Exporter(world.device.type)
        try:
            agree_at_start(meshes, self._groups, world)
        except BaseException as error:  # the meshes it starts with are refused: it ends here, its peers told why
            self._end("abort", error)
            raise

    # -------------------------------------------------------------- builders

    @classmethod
    def from_env(cls, *, backend: str | None = None, timeout: timedelta | float | None = None, options: Any = None,
                 axis_options: Mapping[str, AxisOptions] | None = None, gpus_per_node: int | None = None,
                 name: str = "fmesh", creation_timeout: timedelta | float | None = None,
                 check_tensors: CheckArg = None, meshes: Sequence[PlanItem] = ()) -> Context:
        """Under ``torchrun`` (any ``env://`` launch): init the default group if needed, NCCL with CUDA else gloo,
        and bind ``cuda:LOCAL_RANK``. With none of the launcher's variables (``RANK``, ``WORLD_SIZE``,
        ``MASTER_ADDR``, ``MASTER_PORT``): a world of one in this process, said in one line on stderr, so the same
        script runs under ``python`` and under ``torchrun``.

        >>> import os
        >>> launcher = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        ...             if k in os.environ}  # a plain ``python`` run: no launcher's variables
        >>> with Context.from_env(backend="gloo") as ctx:
        ...     ctx.rank, ctx.world_size
        (0, 1)
        >>> os.environ.update(launcher)
        """
        settings = GroupSettings.of(options, timeout, axis_options, creation_timeout=creation_timeout)
        tensors = CallChecks.of(check_tensors)  # every argument checked before the default group is made
        world = World.from_env(backend=backend, timeout=settings.timeout, gpus_per_node=gpus_per_node, name=name,
                               agenda=starting_with(meshes, settings, tensors.mode),
                               connect_timeout=settings.creation_timeout)
        return cls._made(world, settings, tensors, meshes=meshes)

    @classmethod
    def fake(cls, world_size: int, rank: int = 0, **kwargs: Any) -> Context:
        """A dry run on torch's ``fake`` backend: no communication, no devices; shapes only.

        >>> with Context.fake(4, rank=1) as ctx:
        ...     ctx.rank, ctx.world_size
        (1, 4)
        """
        if not is_int(world_size) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        if not is_int(rank) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank!r}")
        return cls(backend="fake", rank=rank, world_size=world_size, **kwargs)

    # ------------------------------------------------------------- this rank

    @property
    def rank(self) -> int:
        """This process's global rank.

        >>> with Context.fake(4, rank=3) as ctx:
        ...     ctx.rank
        3
        """
        return self._world.rank

    @property
    def world_size(self) -> int:
        """Number of processes in the default group.

        >>> with Context.fake(4) as ctx:
        ...     ctx.world_size
        4
        """
        return self._world.world_size

    @property
    def device(self) -> torch.device:
        """The device collectives' tensors live on (``cuda:LOCAL_RANK`` under NCCL).

        >>> with Context.fake(2) as ctx:
        ...     ctx.device
        device(type='cpu')
        """
        return self._world.device

    @property
    def backend(self) -> str:
        """The context-wide backend.

        >>> with Context.fake(2) as ctx:
        ...     ctx.backend
        'fake'
        """
        return self._settings.backend

    # ---------------------------------------------------------------- groups

    def group(self, mesh: Mesh, axes: AxesArg = None) -> dist.ProcessGroup:
        """This rank's ``ProcessGroup`` along ``axes`` of ``mesh`` (group rank = mesh coordinate), created on first
        use and shared by every mesh with the same ranks in the same order.

        >>> import fmesh
        >>> with fmesh.Context.fake(4, rank=2) as ctx:
        ...     dist.get_process_group_ranks(ctx.group(fmesh.make_mesh((2, 2), ("dp", "tp")), "dp"))
        [0, 2]
        """
        route = self._groups.resolve(mesh, axes)
        return route.group if route.group is not None else self._groups.process_group(route.target)

    def index(self, mesh: Mesh, axes: AxesArg = None) -> int:
        """This rank's index in its group along ``axes`` (its group rank; ``dp_rank``, ``tp_rank``), from the mesh
        alone: no group is created.

        >>> import fmesh
        >>> with fmesh.Context.fake(8, rank=6) as ctx:
        ...     mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
        ...     ctx.index(mesh, "dp"), ctx.index(mesh, "tp"), ctx.index(mesh), ctx.stats()["groups_created"]
        (1, 2, 6, 0)
        """
        return self._groups.target(mesh, axes).member

    # ----------------------------------------------------------- collectives

    def all_reduce(self, tensor: torch.Tensor, mesh: Mesh, axes: AxesArg = None, op: ReduceOp = "sum") -> torch.Tensor:
        """Reduce ``tensor`` over the group along ``axes``; returns a new tensor.

        >>> import fmesh
        >>> with fmesh.Context.fake(4) as ctx:
        ...     ctx.all_reduce(torch.ones(3), fmesh.make_mesh((4,), ("dp",)), "dp", op="max").shape
        torch.Size([3])
        """
        collectives.reduce_op(op)  # raises, naming the choices
        return self._collective("all_reduce", tensor, mesh, axes, op, op=op)

    def all_gather(self, tensor: torch.Tensor, mesh: Mesh, axes: AxesArg = None, dim: int = 0) -> torch.Tensor:
        """Concatenate every member's ``tensor`` along ``dim``, in group (coordinate) order.

        >>> import fmesh
        >>> with fmesh.Context.fake(4) as ctx:
        ...     ctx.all_gather(torch.ones(2, 3), fmesh.make_mesh((2, 2), ("dp", "tp")), "tp", dim=1).shape
        torch.Size([2, 6])
        """
        return self._collective("all_gather", tensor, mesh, axes, dim, dims={"dim": dim})

    def reduce_scatter(self, tensor: torch.Tensor, mesh: Mesh, axes: AxesArg = None, dim: int = 0,
                       op: ReduceOp = "sum") -> torch.Tensor:
        """Reduce over the group, then keep this member's chunk of ``dim`` (its coordinate's).

        >>> import fmesh
        >>> with fmesh.Context.fake(4) as ctx:
        ...     ctx.reduce_scatter(torch.ones(8), fmesh.make_mesh((4,), ("dp",)), "dp").shape
        torch.Size([2])
        """
        collectives.reduce_op(op)
        return self._collective("reduce_scatter", tensor, mesh, axes, dim, op, op=op, check=lambda t, target:
                                collectives.check_divisible("reduce_scatter", "dim", t, dim, target.size))

    def broadcast(self, tensor: torch.Tensor, mesh: Mesh, axes: AxesArg = None, src: int = 0) -> torch.Tensor:
        """Every member gets the ``tensor`` of member ``src`` (an index within the group).

        >>> import fmesh
        >>> with fmesh.Context.fake(4) as ctx:
        ...     ctx.broadcast(torch.ones(2), fmesh.make_mesh((4,), ("dp",)), "dp", src=3).shape
        torch.Size([2])
        """
        return self._collective("broadcast", tensor, mesh, axes, src,
                                check=lambda t, target: collectives.check_index("broadcast", "src", src, target.size))

    def all_to_all(self, tensor: torch.Tensor, mesh: Mesh, axes: AxesArg = None, split_dim: int = 0,
                   concat_dim: int = 0) -> torch.Tensor:
        """Split ``tensor`` into group-size chunks along ``split_dim``; chunk i goes to member i; the chunks
        received are concatenated along ``concat_dim`` in member order.

        >>> import fmesh
        >>> with fmesh.Context.fake(2) as ctx:
        ...     ctx.all_to_all(torch.ones(4, 3), fmesh.make_mesh((2,), ("ep",)), "ep", 0, 1).shape
        torch.Size([2, 6])
        """
        return self._collective(
            "all_to_all", tensor, mesh, axes, split_dim, concat_dim, dims={"concat_dim": concat_dim},
            check=lambda t, target: collectives.check_divisible("all_to_all", "split_dim", t, split_dim, target.size))

    def sum_gradients(self, tensor: torch.Tensor, mesh: Mesh, axes: AxesArg = None) -> torch.Tensor:
        """``tensor`` itself forward; its gradient is summed over the group along ``axes`` backward.

        The first half of the tensor-parallel pair (Megatron's "f"): put it on the input of a column-parallel linear
        layer, whose members each use the whole (replicated) input for their own shard of the output, so the
        input's gradient is the sum of the members' gradients. The other half is :meth:`sum_partials`. Not a
        collective in the forward: nothing is sent without autograd.

        >>> import fmesh
        >>> with fmesh.Context.fake(2) as ctx:
        ...     x = torch.ones(3, requires_grad=True)
        ...     ctx.sum_gradients(x, fmesh.make_mesh((2,), ("tp",)), "tp").sum().backward()
        ...     x.grad.shape
        torch.Size([3])
        """
        return self._collective("sum_gradients", tensor, mesh, axes, agree=False)

    def sum_partials(self, tensor: torch.Tensor, mesh: Mesh, axes: AxesArg = None) -> torch.Tensor:
        """The sum over the group along ``axes`` forward (an all_reduce); the gradient passes unchanged backward.

        The second half of the tensor-parallel pair (Megatron's "g"): put it on the output of a row-parallel linear
        layer, whose members each hold a partial sum of the output. The gradient is passed through, not summed,
        because every member computes the same loss from the same summed output: that loss counts once.
        (:meth:`all_reduce` instead differentiates the sum of every member's loss, and sums the gradient.) The
        other half is :meth:`sum_gradients`.

        >>> import fmesh
        >>> with fmesh.Context.fake(2) as ctx:
        ...     ctx.sum_partials(torch.ones(3), fmesh.make_mesh((2,), ("tp",)), "tp").shape
        torch.Size([3])
        """
        return self._collective("sum_partials", tensor, mesh, axes)

    def _collective(self, kind: autograd.Kind, tensor: object, mesh: Mesh, axes: AxesArg, *args: Any,
                    what: str | None = None, op: str | None = None, dims: Mapping[str, int] | None = None,
                    check: Callable[[torch.Tensor, Target], object] | None = None, agree: bool = True) -> torch.Tensor:
        """The one door of the tensor collectives, in order: the tensor and the arguments (its ``dims``, then what
        ``check`` asks of the target) before any group is touched; the route (the group made on first use); the
        members' tensors compared, if asked; then the collective ``kind`` with ``args``: eager, recorded by autograd
        (:class:`~fmesh.context.autograd.Collective`), or with no gradient (max, min, product). ``what`` names the
        call in errors (``ppermute`` and ``shift`` are permutes)."""
        checked = check_tensor(what := what or kind, tensor, self._world.device, op)
        if dims:
            for label, dim in dims.items():
                collectives.check_dim(what, label, checked, dim)
        if check is not None:
            check(checked, self._groups.target(mesh, axes))
        route = self._groups.resolve(mesh, axes)
        if agree:  # the members compare their calls (a permute's peers differ by rank: not compared)
            self._tensors.check(what, route, checked, () if kind == "permute" else args)
        try:
            if not autograd.records(checked):
                return autograd.forward(kind, route, checked, args)
            if op not in (None, "sum", "avg"):
                return autograd.NoGradient.apply(checked, autograd.forward(kind, route, checked.detach(), args),
                                                 f"{what} op={op!r} along {route.target.label()}")
            return autograd.Collective.apply(checked, route, kind, args)
        finally:  # out of the collective: the check's watch no longer takes this rank for blocked in it
            self._tensors.entered = None

    def barrier(self, mesh: Mesh | None = None, axes: AxesArg = None) -> None:
        """Wait until every member of the group along ``axes`` (default: the whole world) arrives.

        >>> import fmesh
        >>> with fmesh.Context.fake(2) as ctx:
        ...     ctx.barrier()
        """
        if mesh is None:
            self._groups.enter("a barrier")
            collectives.world_barrier(self.world_size, self._settings.timeout, self._board)
            return
        collectives.barrier(self._groups.resolve(mesh, axes))

    @contextlib.contextmanager
    def guard(self, what: str = "a training step") -> Iterator[None]:
        """Explain a lost rank in collectives fmesh did not run (FSDP2's, DTensor's, raw ``torch.distributed`` calls
        on this context's groups) as fmesh's own collectives do: inside ``with ctx.guard():``, a backend error saying
        a peer is gone becomes, after a roll call of the world, :class:`~fmesh.RankLostError` naming the ranks that
        did not answer (the backend's error is its ``__cause__``), on every survivor whose block failed; any other
        error passes unchanged. ``what`` names the block in the error.

        >>> import fmesh
        >>> with Context.fake(2) as ctx, ctx.guard("step 3"):
        ...     total = ctx.all_reduce(torch.ones(1), fmesh.make_mesh((2,), ("dp",)), "dp")
        """
        with failures.guarded(what, self.world_size, self._settings.timeout, self._board):
            yield

    def all_gather_object(self, obj: object, mesh: Mesh, axes: AxesArg = None) -> list[Any]:
        """Every member's picklable ``obj``, in group (coordinate) order.

        The objects travel as byte tensors on the context's device (NCCL too). An object that cannot be pickled
        raises :class:`~fmesh.errors.UnpicklableObjectError` on every member, naming the member. On the fake backend
        (a dry run, :func:`fmesh.simulate`) every member's object is this process's ``obj``.

        >>> import fmesh
        >>> with fmesh.Context.fake(4, rank=1) as ctx:
        ...     ctx.all_gather_object({"step": 3}, fmesh.make_mesh((2, 2), ("dp", "tp")), "tp")
        [{'step': 3}, {'step': 3}]
        """
        route = self._groups.resolve(mesh, axes)
        if route.group is None or self._world.fake:
            return [objects.alone("all_gather_object", route.target, obj) for _ in range(route.target.size)]
        return objects.all_gather_object(route, obj, self.device)

    def broadcast_object(self, obj: object, mesh: Mesh, axes: AxesArg = None, src: int = 0) -> Any:
        """Member ``src``'s picklable ``obj`` (``src`` an index within the group) on every member; the others'
        ``obj`` is not read. ``src`` gets its own ``obj`` back, the others a copy. An object that cannot be pickled
        raises :class:`~fmesh.errors.UnpicklableObjectError` on every member. On the fake backend every member gets
        this process's ``obj``.

        >>> import fmesh
        >>> with fmesh.Context.fake(4) as ctx:
        ...     ctx.broadcast_object(["config", 1], fmesh.make_mesh((4,), ("dp",)), "dp", src=2)
        ['config', 1]
        """
        collectives.check_index("broadcast_object", "src", src, self._groups.target(mesh, axes).size)
        route = self._groups.resolve(mesh, axes)
        if route.group is None or self._world.fake:
            return obj if route.target.member == src else objects.alone("broadcast_object", route.target, obj)
        return objects.broadcast_object(route, obj, src, self.device)

    def ppermute(self, tensor: torch.Tensor, mesh: Mesh, axis: str, perm: Sequence[tuple[int, int]]) -> torch.Tensor:
        """JAX's collective permute along one ``axis``: for each ``(source, destination)`` pair of coordinates along
        it, the member at ``source`` sends ``tensor`` to the member at ``destination``. Returns what this member
        received; a member that receives nothing gets zeros.

        Sends and receives are posted together (``dist.batch_isend_irecv``), so they cannot deadlock. A
        repeated source or destination, or a coordinate outside the axis, is an error naming the pair.

        >>> import fmesh
        >>> with fmesh.Context.fake(4) as ctx:
        ...     ctx.ppermute(torch.ones(2), fmesh.make_mesh((4,), ("pp",)), "pp", [(0, 1), (1, 2), (2, 3)]).shape
        torch.Size([2])
        """
        target = self._groups.target(mesh, permute.check_axis("ppermute", axis))
        send_to, receive_from = permute.peers(permute.check_perm(perm, target.size, axis), target.member)
        return self._permute("ppermute", tensor, mesh, axis, send_to, receive_from)

    def shift(self, tensor: torch.Tensor, mesh: Mesh, axis: str, offset: int = 1, wrap: bool = False) -> torch.Tensor:
        """:meth:`ppermute` to the member ``offset`` steps along ``axis`` (the next pipeline stage, for ``offset=1``;
        the previous, for ``-1``). Without ``wrap`` the members within ``offset`` of the start receive zeros (and
        the last ones send nothing); with it the axis is a ring.

        >>> import fmesh
        >>> with fmesh.Context.fake(4) as ctx:
        ...     ctx.shift(torch.ones(2), fmesh.make_mesh((4,), ("pp",)), "pp", offset=-1, wrap=True).shape
        torch.Size([2])
        """
        target = self._groups.target(mesh, permute.check_axis("shift", axis))
        send_to, receive_from = permute.shift_peers(target.member, target.size, offset, bool(wrap))
        return self._permute("shift", tensor, mesh, axis, send_to, receive_from)

    def _permute(self, what: str, tensor: torch.Tensor, mesh: Mesh, axis: str, send_to: int | None,
                 receive_from: int | None) -> torch.Tensor:
        if self._simulated:
            raise ValueError(
                "simulate() cannot run point-to-point operations (ppermute, shift): torch's LocalTensorMode has "
                "no send or receive; run them on real processes with fmesh.launch(...)")
        return self._collective("permute", tensor, mesh, axis, send_to, receive_from, what=what)

    # --------------------------------------------------------- plan, create

    def plan(self, *items: PlanItem) -> GroupPlan:
        """Which groups these meshes (every axis) and ``(mesh, axes)`` pairs need; creates nothing.

        >>> import fmesh
        >>> with fmesh.Context.fake(8) as ctx:
        ...     mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
        ...     print(ctx.plan(mesh, (mesh, ("dp", "tp"))).to_create)
        3
        """
        return plan_groups(items, self._groups, self._world)

    def materialize(self, *items: PlanItem) -> GroupPlan:
        """Create every group :meth:`plan` lists, now, in the plan's order.

        With a device-bound default group this makes one ``split_group`` per layout (every rank must call it, in
        the same order); otherwise each rank creates its own groups, members only, after one meeting.

        >>> import fmesh
        >>> with fmesh.Context.fake(8) as ctx:
        ...     _ = ctx.materialize(fmesh.make_mesh((2, 4), ("dp", "tp")))
        ...     ctx.stats()["groups_created"]
        2
        """
        return materialize(items, self._groups, self._world)

    # ------------------------------------------------------------- torch mesh

    def device_mesh(self, mesh: Mesh) -> Any:
        """A ``torch.distributed.device_mesh.DeviceMesh`` on this context's groups.

        Usable by ``fully_shard`` (FSDP, HSDP, with TP) and DTensor. It is on this context's device (CUDA under
        NCCL), whatever device type the mesh names. Meshes exported from one universe share one torch root, so torch
        can concatenate them; the same mesh value always gives the same object.

        >>> import fmesh
        >>> with fmesh.Context.fake(8) as ctx:
        ...     ctx.device_mesh(fmesh.make_mesh((2, 4), ("dp", "tp")))["tp"].size()
        4
        """
        _torch.require(_torch.EXPORT)
        self._groups.check_open()
        self._groups.check_mesh(mesh)
        return self._exports.export(mesh, self.rank, lambda: [self.group(mesh, name) for name in mesh.axis_names])

    # ------------------------------------------------------------- lifecycle

    def stats(self) -> dict[str, Any]:
        """What this context built: ``groups_created``, ``cache_hits``, the groups a recovery kept or shrunk
        (``groups_kept``, ``groups_shrunk``; :meth:`recover`), and more.

        >>> with Context.fake(4) as ctx:
        ...     sorted(ctx.stats())  # doctest: +NORMALIZE_WHITESPACE
        ['cache_hits', 'creation_seconds', 'device_meshes', 'groups', 'groups_created', 'groups_kept', 'groups_shrunk',
         'meshes_seen']
        """
        return {**self._groups.stats(), "device_meshes": len(self._exports)}

    def close(self) -> None:
        """Destroy the groups this context made (and the default group, if it made that too).

        Idempotent. Every reference fmesh holds to a group (the exported ``DeviceMesh`` roots too) is dropped while
        the interpreter is alive, so no gloo group is left for interpreter shutdown.

        >>> ctx = Context.fake(2)
        >>> ctx.close(); ctx.close(); ctx
        Context(rank=0, world=2, fake, closed)
        """
        self._end("close")

    def abort(self) -> None:
        """Tear down every group this context made at once, without waiting for peers or for any lock (a rank died,
        or this one failed); the context is closed afterwards. ``with ctx:`` does this when an exception leaves it.
        Safe from any thread and from a signal handler: a collective or a group creation this rank is blocked in
        ends with :class:`~fmesh.ContextClosedError` (within 0.1 s), and peers blocked with it fail and name it.

        >>> ctx = Context.fake(2)
        >>> ctx.abort(); ctx
        Context(rank=0, world=2, fake, closed)
        """
        self._end("abort")

    def recover(self, lost: Sequence[int], mesh: Mesh | None = None) -> Context | None:
        """The Context of the world without the ``lost`` ranks, for every survivor to call after a
        :class:`~fmesh.RankLostError` (with the same ``lost``); this context is closed afterwards.

        The new world is the survivors, renumbered ``0, 1, ...`` in ascending order of their old rank, as
        :func:`fmesh.without` and :func:`fmesh.plan.rescale.scale_down` number the meshes to use in it; given ``mesh``
        (made from this world by :func:`fmesh.without`), the ranks it covers, and a survivor outside it gets
        ``None``: it leaves the job. :func:`fmesh.old_rank` on the new meshes gives each rank's old number.

        The survivors first agree, through the store, on ``lost`` (:class:`~fmesh.RecoveryError` naming both
        sets if they disagree, or naming the survivors that never came, after the creation timeout: never a
        hang); a survivor still blocked in a collective is freed. After any :class:`~fmesh.RecoveryError` (a
        second death during the vote, or while the new world starts, torch's own set-up included) ``recover`` may be
        called again on this context, with the ranks the error names added to ``lost``
        (``fmesh.context.recovery_tries``). Then each group is kept, shrunk or made again by the rule ``python -m
        fmesh plan --lose`` prints by (:func:`fmesh.plan.communicators.renewal`). The default group is made again
        over the new world, in a namespace of the store of its own. A kept group must be idle: recover after the
        collective that failed, not while another runs.

        A whole job is in the guide (*Elastic meshes*). The lost ranks are checked first, before anything is touched:

        >>> with Context.fake(4, rank=0) as ctx:
        ...     ctx.recover([0])
        Traceback (most recent call last):
        ...
        ValueError: recover: rank 0 is calling recover, so it is not lost; expected the ranks that are gone, but got [0]
        """
        if not self._recoveries.failed_to_start:  # tried again after its new world failed to start: handed over already
            self._groups.enter("recover")
        gone = recovery.check_lost(lost, self.world_size, self.rank)
        _torch.require(_torch.RECOVERY)
        world = recovery.new_world(self.world_size, gone, mesh)
        if self._board is None:
            raise ValueError("recover: a dry run (the fake backend) loses no rank; recover on real processes")
        held = self._groups.held()
        renewal.cut_broken(held, gone, self._board)
        survivors = tuple(r for r in range(self.world_size) if r not in gone)
        holding = self._recoveries.vote(self._world, self._board, survivors, gone, renewal.held_groups(held))
        taken = renewal.take_renewed(held, self.rank, {old: new for new, old in enumerate(world)}, holding,
                                     set(survivors), self._board)
        old = self._world
        self._end("hand_over")
        started = self._recoveries.start(old, self._board, world, gone, self._settings)
        self._board = None  # its store connection goes with it (this context holds none once recovered)
        if started is None:  # this rank is not in the new world: it leaves
            return None
        renewed = Context._made(started, self._settings, CallChecks(self._tensors.mode), self._simulated)
        renewed._groups.adopt_all(taken)
        return renewed

    def _end(self, how: Ending, error: BaseException | None = None) -> None:
        """The one way a context ends, every step in every mode: ``close`` (destroy the groups), ``abort`` (tear them
        down without waiting), ``hand_over`` (a recovery took the groups it keeps; the default group and every
        other group are aborted at once, and the new world is another context's)."""
        if self._groups.closed:
            return
        if how == "abort":  # first, before any store operation: ends this rank's waits and frees the peers blocked
            self._groups.halt()
        self._tensors.close()
        if self._board is not None and how != "hand_over":  # the exit hook withdrawn, peers waiting told why (a
            self._board.leave(aborted=how != "close", error=error)  # recovery leaves its board once it started)
        self._exports.clear()
        if how == "hand_over":
            self._groups.hand_over()
            self._world, released = self._world.hand_over(), True
        else:
            released = self._groups.abort() if how == "abort" else self._groups.close()
            released = self._world.close(abort=how == "abort") or released
        if released and not self._world.fake:
            # One collection for both rooms: the C++ groups (and their worker threads) end here, not at
            # interpreter exit. A full collection costs ~80 ms with torch loaded: a dry run (no threads, no
            # sockets) and a context that made nothing pay none.
            gc.collect()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        # After an exception peers may still be inside collectives: destroying groups in the orderly way
        # could wait for them forever, so abort instead (torchtitan learned the same).
        self._end("close" if error is None else "abort", error)

    def __repr__(self) -> str:
        state = "closed" if self._groups.closed else f"{len(self._groups)} groups"
        return f"Context(rank={self.rank}, world={self.world_size}, {self.backend}, {state})"
