"""The Context: the one object with side effects. It owns fmesh's process groups.

A :class:`Context` turns pure :class:`~fmesh.Mesh` values into communication.
It creates a process group the first time something needs it, caches it under
what makes two groups the same (the universe, the ordered ranks of the group,
the backend and its options), and so shares one group between every mesh that
puts the same ranks together. It runs collectives along mesh axes and hands
torch real ``DeviceMesh`` objects built on its groups.

Rules for group creation (what every rank must do):

* Only the members of a group take part in creating it, and each group's
  rendezvous is named after its content, so different groups may be created
  in any order on different ranks.
* Members of one group create it in the same program order relative to their
  other groups along the same axis names (the usual SPMD order). Before
  creating it they compare what they mean by it, so a mesh that differs
  between ranks raises :class:`MeshMismatchError` on the members instead of
  hanging, and a member that never comes raises :class:`GroupTimeoutError`
  after the context's timeout, naming the axes and the missing ranks.
* If the default group is bound to a device (``init_process_group(device_id=...)``,
  eager NCCL), a new communicator is split from it and every rank must take
  part: call :meth:`Context.materialize` on every rank, in the same order,
  before the first collective. It makes one ``split_group`` per distinct
  layout, the cheapest way to create many NCCL communicators.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, NoReturn

import attrs
import torch
import torch.distributed as dist

from fmesh.context import _torch
from fmesh.context.agreement import GroupTimeoutError, agree
from fmesh.layout import Layout
from fmesh.mesh import Mesh
from fmesh.mesh.mesh import AxesArg

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}
_BACKENDS = ("gloo", "nccl", "fake", "mpi", "ucc", "xccl")


def _seconds(value: timedelta | float | int | None, default: timedelta) -> timedelta:
    if value is None:
        return default
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"timeout must be seconds or a datetime.timedelta, got {value!r}")
    if seconds <= 0:
        raise ValueError(f"timeout must be positive, got {value!r}")
    return timedelta(seconds=seconds)


def _check_backend(backend: str | None) -> str | None:
    if backend is not None and (not isinstance(backend, str) or backend.lower() not in _BACKENDS):
        raise ValueError(f"unknown backend {backend!r}; choose one of {_BACKENDS}")
    return backend.lower() if backend else None


def describe_options(options: Any) -> str:
    """A description of backend options that is the same in every process (no addresses).

    >>> describe_options(None)
    'none'
    """
    if options is None:
        return "none"
    fields = sorted(
        (name, getattr(options, name))
        for name in dir(options)
        if not name.startswith("__") and not callable(getattr(options, name, None))
    )
    return f"{type(options).__name__}({', '.join(f'{k}={v!r}' for k, v in fields if _plain(v))})"


def _plain(value: object) -> bool:
    return isinstance(value, (bool, int, float, str, timedelta, type(None)))


@attrs.frozen
class AxisOptions:
    """Per-axis overrides: another backend (say gloo for a CPU-side axis), options, or timeout.

    >>> AxisOptions(backend="gloo")
    AxisOptions(backend='gloo', options=None, timeout=None)
    """

    backend: str | None = attrs.field(default=None, converter=_check_backend)
    options: Any = None
    timeout: timedelta | float | None = None


@attrs.frozen
class GroupSpec:
    """What makes two process groups the same: the ordered ranks, backend, options, timeout."""

    ranks: tuple[int, ...]
    backend: str
    options: Any = attrs.field(eq=False, hash=False)
    options_key: str
    timeout: timedelta


@attrs.frozen
class PlannedGroup:
    """One distinct group layout a program needs (see :meth:`Context.plan`)."""

    mesh: Mesh
    axes: tuple[str, ...]
    size: int
    num_groups: int
    backend: str
    ranks: tuple[int, ...] | None
    hosts_per_group: int
    exists: bool

    def __str__(self) -> str:
        state = "exists" if self.exists else "to create"
        mine = "-" if self.ranks is None else list(self.ranks)
        return (
            f"{'x'.join(self.axes):<24} size {self.size:<5} groups {self.num_groups:<6} "
            f"hosts/group {self.hosts_per_group:<4} {self.backend:<5} {state:<9} mine {mine}"
        )


@attrs.frozen
class GroupPlan:
    """The groups a program will need, before any is created (see :meth:`Context.plan`)."""

    groups: tuple[PlannedGroup, ...]

    @property
    def to_create(self) -> int:
        """How many of the planned layouts still need a group on this rank."""
        return sum(1 for g in self.groups if not g.exists and g.ranks is not None)

    def __str__(self) -> str:
        header = f"{len(self.groups)} distinct group layouts, {self.to_create} to create on this rank"
        return "\n".join([header, *(str(g) for g in self.groups)])


class Context:
    """Owns process groups for fmesh meshes; the only fmesh object that communicates.

    Build it with :meth:`from_env` under ``torchrun``, :meth:`fake` for a dry
    run, or explicitly. Use it as a context manager (or call :meth:`close`) to
    destroy the groups it made.

    >>> import fmesh
    >>> with fmesh.Context.fake(8, rank=3) as ctx:
    ...     mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
    ...     ctx.all_reduce(torch.ones(2), mesh, "tp").shape, ctx.stats()["groups_created"]
    (torch.Size([2]), 1)
    """

    def __init__(
        self,
        *,
        backend: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        store: dist.Store | None = None,
        init_method: str | None = None,
        timeout: timedelta | float | None = None,
        options: Any = None,
        axis_options: Mapping[str, AxisOptions] | None = None,
        device: torch.device | str | None = None,
        gpus_per_node: int | None = None,
        name: str = "fmesh",
        simulated: bool = False,
    ) -> None:
        backend = _check_backend(backend)
        self._timeout = _seconds(timeout, timedelta(minutes=10))
        axis_options = dict(axis_options or {})
        for axis, override in axis_options.items():
            if not isinstance(override, AxisOptions):
                raise TypeError(f"axis_options[{axis!r}] must be fmesh.AxisOptions, got {override!r}")
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"name must be a non-empty string without '/', got {name!r}")
        for label, value in (("rank", rank), ("world_size", world_size), ("gpus_per_node", gpus_per_node)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{label} must be a non-negative int, got {value!r}")
        if world_size is not None and rank is not None and rank >= world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}: valid ranks are 0..{world_size - 1}")
        self._owns_world = False
        if dist.is_initialized():
            if world_size is not None and world_size != dist.get_world_size():
                raise ValueError(
                    f"world_size={world_size}, but the default group already has {dist.get_world_size()} ranks"
                )
        else:
            dist.init_process_group(
                backend=backend or ("nccl" if torch.cuda.is_available() else "gloo"),
                init_method=init_method,
                rank=-1 if rank is None else rank,
                world_size=-1 if world_size is None else world_size,
                store=store,
                timeout=self._timeout,
            )
            self._owns_world = True
        self._backend = backend or dist.get_backend()
        self._options = options
        self._axis_options = axis_options
        self._name = name
        self._rank: int = int(dist.get_rank())
        self._world_size: int = int(dist.get_world_size())
        self._device = torch.device(device) if device is not None else _default_device(self._backend)
        self._gpus_per_node = gpus_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", self._world_size))
        self._fake = self._backend == "fake"
        self._simulated = simulated  # set by fmesh.simulate: LocalTensorMode runs every rank here
        # Contexts of one name are numbered alike on every rank, so that a group
        # re-created after close() never meets the stale rendezvous keys of the old one.
        self._epoch = 0
        if not self._fake:
            self._epoch = (_torch.default_store().add(f"fmesh/{name}/contexts", 1) - 1) // self._world_size
        self._by_mesh: dict[tuple[Mesh, Any], tuple[dist.ProcessGroup | None, tuple[int, ...]]] = {}
        self._by_spec: dict[GroupSpec, dist.ProcessGroup] = {}
        self._created_for: dict[str, int] = {}
        self._device_meshes: dict[tuple[Any, ...], Any] = {}
        self._roots: dict[str, Any] = {}
        # Per universe: the layout each exported axis name stands for (None once two exports disagree).
        self._name_layouts: dict[str, dict[str, Layout | None]] = {}
        self._hits = 0
        self._creation_seconds = 0.0
        self._closed = False

    # -------------------------------------------------------------- builders

    @classmethod
    def from_env(
        cls,
        *,
        backend: str | None = None,
        timeout: timedelta | float | None = None,
        **kwargs: Any,
    ) -> Context:
        """Under ``torchrun`` (any ``env://`` launch): init the default group if needed, NCCL with
        CUDA else gloo, and bind ``cuda:LOCAL_RANK``.

        >>> Context.from_env.__name__
        'from_env'
        """
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing and not dist.is_initialized():
            raise ValueError(
                f"Context.from_env needs the launcher's environment variables {missing}; start the program "
                "with torchrun (e.g. torchrun --nproc-per-node 4 train.py) or use Context(...) explicitly"
            )
        backend = _check_backend(backend) or ("nccl" if torch.cuda.is_available() else "gloo")
        device: torch.device | None = None
        if backend == "nccl":
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        return cls(backend=backend, init_method="env://", timeout=timeout, device=device, **kwargs)

    @classmethod
    def fake(cls, world_size: int, rank: int = 0, **kwargs: Any) -> Context:
        """A dry run on torch's ``fake`` backend: no communication, no devices; shapes only.

        >>> with Context.fake(4, rank=1) as ctx:
        ...     ctx.rank, ctx.world_size
        (1, 4)
        """
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank!r}")
        from torch.testing._internal.distributed.fake_pg import FakeStore

        return cls(backend="fake", rank=rank, world_size=world_size, store=FakeStore(), **kwargs)

    # ------------------------------------------------------------- this rank

    @property
    def rank(self) -> int:
        """This process's global rank.

        >>> with Context.fake(4, rank=3) as ctx:
        ...     ctx.rank
        3
        """
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of processes in the default group.

        >>> with Context.fake(4) as ctx:
        ...     ctx.world_size
        4
        """
        return self._world_size

    @property
    def device(self) -> torch.device:
        """The device collectives' tensors live on (``cuda:LOCAL_RANK`` under NCCL).

        >>> with Context.fake(2) as ctx:
        ...     ctx.device
        device(type='cpu')
        """
        return self._device

    @property
    def backend(self) -> str:
        """The context-wide backend.

        >>> with Context.fake(2) as ctx:
        ...     ctx.backend
        'fake'
        """
        return self._backend

    # ---------------------------------------------------------------- groups

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this fmesh Context is closed; create a new one (its groups were destroyed)")

    def _check_mesh(self, mesh: Mesh) -> None:
        if not isinstance(mesh, Mesh):
            raise TypeError(f"expected an fmesh.Mesh, got {type(mesh).__name__}")
        if mesh.world_size != self._world_size:
            raise ValueError(
                f"{mesh!r} is built for {mesh.world_size} ranks, but this context has {self._world_size}"
            )

    def _spec(self, mesh: Mesh, axes: tuple[str, ...], ranks: tuple[int, ...]) -> GroupSpec:
        overrides = {self._axis_options[a] for a in axes if a in self._axis_options}
        if len(overrides) > 1:
            raise ValueError(f"axes {axes} have different axis_options {sorted(map(repr, overrides))}; pick one")
        override = overrides.pop() if overrides else AxisOptions()
        options = override.options if override.options is not None else self._options
        return GroupSpec(
            ranks=ranks,
            backend=override.backend or self._backend,
            options=options,
            options_key=describe_options(options),
            timeout=_seconds(override.timeout, self._timeout),
        )

    def _size(self, mesh: Mesh, axes: AxesArg) -> int:
        """The group size along ``axes``, checked from the mesh alone (before any group exists)."""
        self._check_open()
        self._check_mesh(mesh)
        size = 1
        for name in mesh.resolve_axes(tuple(axes) if isinstance(axes, list) else axes):
            size *= mesh.shape[name]
        return size

    def _lookup(self, mesh: Mesh, axes: AxesArg) -> tuple[dist.ProcessGroup | None, tuple[int, ...]]:
        """This rank's group along ``axes`` (``None`` for a group of one) and its ranks."""
        try:
            found = self._by_mesh.get((mesh, axes))
        except TypeError:  # unhashable axes, e.g. a list
            found, axes = None, tuple(axes)  # type: ignore[arg-type]
        if found is not None:
            self._hits += 1
            return found
        self._check_open()
        self._check_mesh(mesh)
        names = mesh.resolve_axes(axes)
        ranks = mesh.group(self._rank, names)
        if self._simulated:
            unsorted = next((g for g in mesh.groups(names) if list(g) != sorted(g)), None)
            if unsorted is not None:
                raise ValueError(
                    f"simulate() can only run collectives over groups whose ranks ascend, but the group "
                    f"{list(unsorted)} along axes {names} of {mesh!r} does not (a permuted rank map or a "
                    "reversed axis order); run this mesh on real processes with fmesh.launch(...)"
                )
        group = None if len(ranks) == 1 else self._group_for(mesh, names, ranks)
        self._by_mesh[(mesh, axes)] = (group, ranks)
        return group, ranks

    def _group_for(self, mesh: Mesh, names: tuple[str, ...], ranks: tuple[int, ...]) -> dist.ProcessGroup:
        spec = self._spec(mesh, names, ranks)
        group = self._by_spec.get(spec)
        if group is not None:
            self._hits += 1
            return group
        if _torch.bound_device() is not None:
            raise RuntimeError(
                f"no group yet for axes {names} of {mesh!r}: the default group is bound to a device, so "
                "creating one needs every rank; call ctx.materialize(...) on every rank before collectives"
            )
        return self._create(mesh, names, spec)

    def _create(self, mesh: Mesh, names: tuple[str, ...], spec: GroupSpec) -> dist.ProcessGroup:
        label = ",".join(names)
        sequence = self._created_for.get(label, 0)
        self._created_for[label] = sequence + 1
        what = f"creating the group along axes {names} of {mesh!r}"
        started = time.perf_counter()
        if not self._fake:
            description = f"{mesh!r} over {mesh.universe!r}, layouts {_layouts(mesh)}, group {list(spec.ranks)}"
            key = f"fmesh/{self._name}/{self._epoch}/agree/{label}/{sequence}"
            agree(_torch.default_store(), key, self._rank, spec.ranks, description, spec.timeout, what)
        digest = hashlib.blake2b(
            repr((spec.ranks, spec.backend, spec.options_key, spec.timeout.total_seconds())).encode(), digest_size=10
        ).hexdigest()
        group = _torch.create_group(
            spec.ranks,
            f"{self._name}:{self._epoch}:{digest}",
            backend=spec.backend,
            timeout=spec.timeout,
            options=spec.options,
            description=f"fmesh_{'_'.join(names)}",
        )
        self._creation_seconds += time.perf_counter() - started
        self._by_spec[spec] = group
        return group

    def group(self, mesh: Mesh, axes: AxesArg = None) -> dist.ProcessGroup:
        """This rank's ``ProcessGroup`` along ``axes`` of ``mesh`` (group rank = mesh coordinate),
        created on first use and shared by every mesh with the same ranks in the same order.

        >>> import fmesh
        >>> with fmesh.Context.fake(4, rank=2) as ctx:
        ...     dist.get_process_group_ranks(ctx.group(fmesh.make_mesh((2, 2), ("dp", "tp")), "dp"))
        [0, 2]
        """
        group, ranks = self._lookup(mesh, axes)
        if group is None:  # a group of one: made only when somebody asks for the object itself
            self._check_open()
            names = mesh.resolve_axes(axes if not isinstance(axes, list) else tuple(axes))
            spec = self._spec(mesh, names, ranks)
            group = self._by_spec.get(spec) or self._create(mesh, names, spec)
        return group

    # ----------------------------------------------------------- collectives

    def _run(self, name: str, mesh: Mesh, axes: AxesArg, ranks: tuple[int, ...], call: Any) -> None:
        try:
            call()
        except RuntimeError as error:
            self._timed_out(name, mesh, axes, ranks, error)

    def _timed_out(self, name: str, mesh: Mesh, axes: AxesArg, ranks: tuple[int, ...], error: RuntimeError) -> NoReturn:
        """Re-raise ``error``: as :class:`GroupTimeoutError` naming the axes and ranks if it is a timeout."""
        if "timed out" in str(error).lower() or "timeout" in str(error).lower():
            raise GroupTimeoutError(
                f"{name} along axes {axes!r} of {mesh!r} timed out waiting for ranks {list(ranks)}: "
                "a rank never arrived (it crashed, or its program took another path)"
            ) from error
        raise error

    def all_reduce(self, tensor: torch.Tensor, mesh: Mesh, axes: AxesArg = None, op: str = "sum") -> torch.Tensor:
        """Reduce ``tensor`` over the group along ``axes``; returns a new tensor.

        >>> import fmesh
        >>> with fmesh.Context.fake(4) as ctx:
        ...     ctx.all_reduce(torch.ones(3), fmesh.make_mesh((4,), ("dp",)), "dp", op="max").shape
        torch.Size([3])
        """
        reduce_op = _reduce_op(op)
        group, ranks = self._lookup(mesh, axes)
        result = tensor.clone()
        if group is None:
            return result
        # The hot path: no closure, and a string compare rather than ReduceOp's (slower) __eq__.
        try:
            if op == "avg" and dist.get_backend(group) == "gloo":  # gloo has no AVG
                dist.all_reduce(result, group=group)
                result.div_(len(ranks))
            else:
                dist.all_reduce(result, op=reduce_op, group=group)
        except RuntimeError as error:
            self._timed_out("all_reduce", mesh, axes, ranks, error)
        return result

    def all_gather(self, tensor: torch.Tensor, mesh: Mesh, axes: AxesArg = None, dim: int = 0) -> torch.Tensor:
        """Concatenate every member's ``tensor`` along ``dim``, in group (coordinate) order.

        >>> import fmesh
        >>> with fmesh.Context.fake(4) as ctx:
        ...     ctx.all_gather(torch.ones(2, 3), fmesh.make_mesh((2, 2), ("dp", "tp")), "tp", dim=1).shape
        torch.Size([2, 6])
        """
        group, ranks = self._lookup(mesh, axes)
        if group is None:
            return tensor.clone()
        moved = tensor.movedim(dim, 0).contiguous()
        output = torch.empty((len(ranks) * moved.shape[0], *moved.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        self._run("all_gather", mesh, axes, ranks, lambda: dist.all_gather_into_tensor(output, moved, group=group))
        return output.movedim(0, dim)

    def reduce_scatter(
        self, tensor: torch.Tensor, mesh: Mesh, axes: AxesArg = None, dim: int = 0, op: str = "sum"
    ) -> torch.Tensor:
        """Reduce over the group, then keep this member's chunk of ``dim`` (its coordinate's).

        >>> import fmesh
        >>> with fmesh.Context.fake(4) as ctx:
        ...     ctx.reduce_scatter(torch.ones(8), fmesh.make_mesh((4,), ("dp",)), "dp").shape
        torch.Size([2])
        """
        reduce_op = _reduce_op(op)
        size = self._size(mesh, axes)
        if tensor.shape[dim] % size:
            raise ValueError(
                f"reduce_scatter: dim {dim} has size {tensor.shape[dim]}, not divisible by group size {size}"
            )
        group, ranks = self._lookup(mesh, axes)
        if group is None:
            return tensor.clone()
        moved = tensor.movedim(dim, 0).contiguous()
        output = torch.empty((moved.shape[0] // size, *moved.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        gloo_avg = reduce_op == dist.ReduceOp.AVG and dist.get_backend(group) == "gloo"
        op_now = dist.ReduceOp.SUM if gloo_avg else reduce_op
        self._run(
            "reduce_scatter", mesh, axes, ranks,
            lambda: dist.reduce_scatter_tensor(output, moved, op=op_now, group=group),
        )
        if gloo_avg:
            output.div_(size)
        return output.movedim(0, dim)

    def broadcast(self, tensor: torch.Tensor, mesh: Mesh, axes: AxesArg = None, src: int = 0) -> torch.Tensor:
        """Every member gets the ``tensor`` of member ``src`` (an index within the group).

        >>> import fmesh
        >>> with fmesh.Context.fake(4) as ctx:
        ...     ctx.broadcast(torch.ones(2), fmesh.make_mesh((4,), ("dp",)), "dp", src=3).shape
        torch.Size([2])
        """
        size = self._size(mesh, axes)
        if not isinstance(src, int) or isinstance(src, bool) or not 0 <= src < size:
            raise ValueError(f"broadcast src={src!r} is an index within the group: valid 0..{size - 1}")
        group, ranks = self._lookup(mesh, axes)
        result = tensor.clone()
        if group is None:
            return result
        self._run("broadcast", mesh, axes, ranks, lambda: dist.broadcast(result, src=ranks[src], group=group))
        return result

    def all_to_all(
        self, tensor: torch.Tensor, mesh: Mesh, axes: AxesArg = None, split_dim: int = 0, concat_dim: int = 0
    ) -> torch.Tensor:
        """Split ``tensor`` into group-size chunks along ``split_dim``; chunk i goes to member i;
        the chunks received are concatenated along ``concat_dim`` in member order.

        >>> import fmesh
        >>> with fmesh.Context.fake(2) as ctx:
        ...     ctx.all_to_all(torch.ones(4, 3), fmesh.make_mesh((2,), ("ep",)), "ep", 0, 1).shape
        torch.Size([2, 6])
        """
        size = self._size(mesh, axes)
        if tensor.shape[split_dim] % size:
            raise ValueError(
                f"all_to_all: split_dim {split_dim} has size {tensor.shape[split_dim]}, "
                f"not divisible by group size {size}"
            )
        group, ranks = self._lookup(mesh, axes)
        if group is None:
            return tensor.clone()
        moved = tensor.movedim(split_dim, 0).contiguous()
        output = torch.empty_like(moved)
        self._run("all_to_all", mesh, axes, ranks, lambda: dist.all_to_all_single(output, moved, group=group))
        chunks = output.movedim(0, split_dim).chunk(size, dim=split_dim)
        return torch.cat(chunks, dim=concat_dim)

    def barrier(self, mesh: Mesh | None = None, axes: AxesArg = None) -> None:
        """Wait until every member of the group along ``axes`` (default: the whole world) arrives.

        >>> import fmesh
        >>> with fmesh.Context.fake(2) as ctx:
        ...     ctx.barrier()
        """
        self._check_open()
        if mesh is None:
            ranks = tuple(range(self._world_size))
            self._run("barrier", mesh, axes, ranks, lambda: dist.barrier())  # type: ignore[arg-type]
            return
        group, ranks = self._lookup(mesh, axes)
        if group is not None:
            self._run("barrier", mesh, axes, ranks, lambda: dist.barrier(group=group))

    # --------------------------------------------------------- plan, create

    def _items(self, items: Iterable[Mesh | tuple[Mesh, AxesArg]]) -> list[tuple[Mesh, tuple[str, ...]]]:
        pairs: list[tuple[Mesh, tuple[str, ...]]] = []
        for item in items:
            if isinstance(item, Mesh):
                pairs.extend((item, (name,)) for name in item.axis_names)
            elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Mesh):
                pairs.append((item[0], item[0].resolve_axes(item[1])))
            else:
                raise TypeError(f"plan/materialize take meshes or (mesh, axes) pairs, got {item!r}")
        for mesh, _ in pairs:
            self._check_mesh(mesh)
        return pairs

    def plan(self, *items: Mesh | tuple[Mesh, AxesArg]) -> GroupPlan:
        """Which groups these meshes (every axis) and ``(mesh, axes)`` pairs need; creates nothing.

        >>> import fmesh
        >>> with fmesh.Context.fake(8) as ctx:
        ...     mesh = fmesh.make_mesh((2, 4), ("dp", "tp"))
        ...     print(ctx.plan(mesh, (mesh, ("dp", "tp"))).to_create)
        3
        """
        from fmesh.topology import Topology

        self._check_open()
        hosts = max(1, self._world_size // max(1, self._gpus_per_node))
        topology = Topology(hosts, self._world_size // hosts) if self._world_size % hosts == 0 else None
        planned: dict[tuple[Any, ...], PlannedGroup] = {}
        for mesh, names in self._items(items):
            layout = mesh.axes_layout(names)
            ranks = mesh.group(self._rank, names) if mesh.coordinate(self._rank) is not None else None
            spec = self._spec(mesh, names, ranks or ())
            key = (mesh.universe.id, layout.coalesce(), mesh.frame, spec.backend, spec.options_key)
            if key in planned:
                continue
            span = topology.span(mesh, names) if topology is not None else None
            planned[key] = PlannedGroup(
                mesh=mesh,
                axes=names,
                size=layout.size,
                num_groups=mesh.num_covered // layout.size,
                backend=spec.backend,
                ranks=ranks,
                hosts_per_group=span.hosts_max if span is not None else 0,
                exists=ranks is not None and (len(ranks) == 1 or spec in self._by_spec),
            )
        return GroupPlan(tuple(planned.values()))

    def materialize(self, *items: Mesh | tuple[Mesh, AxesArg]) -> GroupPlan:
        """Create every group :meth:`plan` lists, now, in the plan's order.

        With a device-bound default group this makes one ``split_group`` per
        layout (every rank must call it, in the same order); otherwise each
        rank creates its own groups, members only.

        >>> import fmesh
        >>> with fmesh.Context.fake(8) as ctx:
        ...     _ = ctx.materialize(fmesh.make_mesh((2, 4), ("dp", "tp")))
        ...     ctx.stats()["groups_created"]
        2
        """
        plan = self.plan(*items)
        split = _torch.bound_device() is not None and not self._fake
        for planned in plan.groups:
            if planned.exists:
                continue
            mesh, names = planned.mesh, planned.axes
            if split:
                started = time.perf_counter()
                spec = self._spec(mesh, names, planned.ranks or ())
                group = _torch.split_groups(mesh.groups(names), timeout=spec.timeout, options=spec.options)
                self._creation_seconds += time.perf_counter() - started
                if group is not None and planned.ranks is not None:
                    self._by_spec[spec] = group
            elif planned.ranks is not None and len(planned.ranks) > 1:
                self._lookup(mesh, names)
        # Every group this rank is a member of exists now; no need to plan (and walk the topology) again.
        return GroupPlan(tuple(attrs.evolve(g, exists=g.ranks is not None) for g in plan.groups))

    # ------------------------------------------------------------- torch mesh

    def device_mesh(self, mesh: Mesh) -> Any:
        """A ``torch.distributed.device_mesh.DeviceMesh`` on this context's groups.

        Usable by ``fully_shard`` (FSDP, HSDP, with TP) and DTensor. Meshes
        exported from one universe share one torch root, so torch can
        concatenate them; the same mesh value always gives the same object.

        >>> import fmesh
        >>> with fmesh.Context.fake(8) as ctx:
        ...     ctx.device_mesh(fmesh.make_mesh((2, 4), ("dp", "tp")))["tp"].size()
        4
        """
        self._check_open()
        self._check_mesh(mesh)
        if mesh.frame:
            raise ValueError(
                f"{mesh!r} splits a strided axis unevenly; torch's DeviceMesh cannot represent it "
                "(one layout per dim). Export the mesh before that unflatten, or choose sizes that split evenly"
            )
        if mesh.coordinate(self._rank) is None:
            raise ValueError(f"rank {self._rank} is not covered by {mesh!r}; only covered ranks can export it")
        key = (mesh.universe.id, mesh.axis_names, mesh.layouts)
        exported = self._device_meshes.get(key)
        if exported is None:
            root = self._roots.get(mesh.universe.id)
            if root is None:
                root = self._roots[mesh.universe.id] = _torch.export_root(mesh.universe)
            groups = [self.group(mesh, name) for name in mesh.axis_names]
            exported = _torch.export_device_mesh(mesh, root, groups)
            self._register_names(mesh, root, exported)
            self._device_meshes[key] = exported
        return exported

    def _register_names(self, mesh: Mesh, root: Any, exported: Any) -> None:
        """Publish a 1-D export in the shared root's ``_flatten_mapping`` under its axis name.

        That lets ``sub_mesh._flatten(name)`` (FSDP2's ``dp_mesh_dims``) find our group instead of
        creating new ones, and lets DTensor merge collectives over several dims. But torch's
        ``get_group(name)`` consults the root's ``_flatten_mapping`` *before* the mesh's own dims, and
        every export of a universe shares one root: so a name may be published only while every
        export of the universe that uses it means the same layout. Once two exports disagree, the
        name is withdrawn for good, and each mesh resolves it through its own dims.
        """
        known = self._name_layouts.setdefault(mesh.universe.id, {})
        for name, layout in zip(mesh.axis_names, mesh.layouts):
            if name not in known:
                known[name] = layout
            elif known[name] is not None and known[name] != layout:
                known[name] = None
                _torch.unregister_flattened(root, name)
        if mesh.ndim == 1 and known[mesh.axis_names[0]] is not None:
            _torch.register_flattened(root, mesh.axis_names[0], exported)

    # ------------------------------------------------------------- lifecycle

    def stats(self) -> dict[str, Any]:
        """What this context built: ``groups_created``, ``cache_hits``, and more.

        >>> import fmesh
        >>> with fmesh.Context.fake(4) as ctx:
        ...     sorted(ctx.stats())
        ['cache_hits', 'creation_seconds', 'device_meshes', 'groups', 'groups_created', 'meshes_seen']
        """
        return {
            "groups_created": len(self._by_spec),
            "cache_hits": self._hits,
            "meshes_seen": len(self._by_mesh),
            "device_meshes": len(self._device_meshes),
            "creation_seconds": round(self._creation_seconds, 6),
            "groups": [(spec.ranks, spec.backend) for spec in self._by_spec],
        }

    def close(self) -> None:
        """Destroy the groups this context made (and the default group, if it made that too).

        >>> ctx = Context.fake(2)
        >>> ctx.close(); ctx
        Context(rank=0, world=2, fake, closed)
        """
        if self._closed:
            return
        self._closed = True
        if not dist.is_initialized():
            return
        for group in self._by_spec.values():
            dist.destroy_process_group(group)
        self._by_spec.clear()
        self._by_mesh.clear()
        self._device_meshes.clear()
        self._roots.clear()
        self._name_layouts.clear()
        if self._owns_world:
            dist.destroy_process_group()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._by_spec)} groups"
        return f"Context(rank={self._rank}, world={self._world_size}, {self._backend}, {state})"


def _reduce_op(op: str) -> Any:
    try:
        return _OPS[op]
    except (KeyError, TypeError):
        raise ValueError(f"unknown reduction op {op!r}; choose one of {sorted(_OPS)}") from None


def _default_device(backend: str) -> torch.device:
    if backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _layouts(mesh: Mesh) -> str:
    return ";".join(f"{name}={lay.shape}:{lay.stride}" for name, lay in zip(mesh.axis_names, mesh.layouts))
