"""Training-mesh recipes: the meshes of a job from its parallelism degrees, as pure values.

:class:`ParallelDims` takes the degrees that people launch large jobs with
(``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``, and for mixture-of-experts
``ep``, ``etp``) and answers with the world mesh and the derived meshes that
training code asks for. Nothing here creates a process group; every answer is
layout arithmetic, so a million ranks cost the same as eight.

Axis order and group semantics follow torchtitan's ``ParallelDims`` (which OLMo-core's
``build_world_mesh`` shares for dense models): the world mesh is
``(pp, dp_replicate, dp_shard, cp, tp)``, row-major, ``tp`` innermost.

>>> import fmesh
>>> dims = fmesh.ParallelDims(16, dp_replicate=2, cp=2, tp=2)   # dp_shard=-1 -> 2
>>> dims.world_mesh
Mesh(pp=1, dp_replicate=2, dp_shard=2, cp=2, tp=2; world=16)
>>> dims.mesh("dp_shard_cp").group(0), dims.mesh("dp").group(0)
((0, 2, 4, 6), (0, 4, 8, 12))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs

from fmesh.layout.int_tuple import is_int
from fmesh.mesh import Lineage, Mesh, flatten, make_mesh, rename, unflatten

__all__ = ["DEGREE_NAMES", "DERIVED_MESHES", "MESH_ALIASES", "MESH_NAMES", "WORLD_AXES", "ParallelDims"]

WORLD_AXES: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The axes of the world mesh, outermost first (torchtitan's order)."""

DEGREE_NAMES: tuple[str, ...] = (*WORLD_AXES, "ep", "etp")
"""Every degree :class:`ParallelDims` takes; ``ep`` and ``etp`` re-use the world's ranks."""

MESH_NAMES: tuple[str, ...] = (
    *WORLD_AXES,
    "dp",
    "dp_shard_cp",
    "dp_cp",
    "ep",
    "efsdp",
    "etp",
)
"""The 1-D meshes :meth:`ParallelDims.mesh` serves, in the order :meth:`ParallelDims.meshes` lists them."""

MESH_ALIASES: Mapping[str, str] = MappingProxyType({"batch": "dp", "fsdp": "dp_shard_cp", "loss": "dp_cp"})
"""torchtitan's newer names for the same groups: ``batch`` = ``dp``, ``fsdp`` = ``dp_shard_cp``,
``loss`` = ``dp_cp``."""

DERIVED_MESHES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "dp": ("dp_replicate", "dp_shard"),
        "dp_shard_cp": ("dp_shard", "cp"),
        "dp_cp": ("dp_replicate", "dp_shard", "cp"),
    }
)
"""The world axes each derived mesh of :meth:`ParallelDims.mesh` flattens, in order."""


def _check_degree(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not is_int(value):
        raise TypeError(f"{attribute.name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 1 and value != -1:
        raise ValueError(
            f"{attribute.name}={value} is invalid: a degree is a positive int, "
            f"or -1 for the one degree inferred from world_size"
        )


def _check_world_size(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not is_int(value):
        raise TypeError(f"world_size must be an int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"world_size must be a positive int, got {value}")


def _check_device_type(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise TypeError(f"device_type must be a non-empty string such as 'cpu' or 'cuda', got {value!r}")


def _to_rank_map(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.reshape(-1).tolist() if hasattr(value, "reshape") else value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"rank_map must be a sequence of ints (a permutation of the ranks), got {value!r}")
    return tuple(value)


def _divisors(n: int) -> list[int]:
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def _choices(n: int) -> str:
    divisors = _divisors(n)
    shown = ", ".join(map(str, divisors[:12]))
    return shown + (f", ... ({len(divisors)} divisors of {n})" if len(divisors) > 12 else "")


def _product_text(dims: Any, names: Sequence[str]) -> str:
    return " * ".join(f"{n}({getattr(dims, n)})" for n in names)


@attrs.frozen(repr=False)
class ParallelDims:
    """The degrees of a training job and the meshes they imply; validated at construction.

    ``pp * dp_replicate * dp_shard * cp * tp`` must equal ``world_size``; one of these
    five may be ``-1`` and is then inferred (``dp_shard`` defaults to ``-1``, as in
    torchtitan, so set it explicitly to infer another). ``ep`` and ``etp`` do not
    multiply into the world size: expert parallelism re-uses the ranks of
    ``dp_shard * cp * tp`` inside one ``(pp, dp_replicate)`` block, taking the
    innermost factors:

    - ``etp == 1`` (default; torchtitan's only mode since etp was removed): ``ep`` is
      carved from ``tp``, then ``cp``, then the inner part of ``dp_shard``, and must
      divide ``dp_shard * cp * tp``;
    - ``etp == tp``: experts keep the ``tp`` axis as ``etp``, and ``ep`` is carved from
      ``cp``, then ``dp_shard``; it must divide ``dp_shard * cp``.

    The rest of that region is ``efsdp = dp_shard * cp * tp // (ep * etp)``, over which
    expert weights are sharded.

    **Degree-1 axes are kept**, always: the world mesh has all five axes and the
    expert mesh all of ``(pp, dp_replicate, efsdp, ep, etp)``, whatever their sizes,
    so the same code indexes the same names for every job (a size-1 axis has
    singleton groups). Use the ``*_enabled`` properties to ask whether an axis is
    really parallel.

    ``lineage`` (not part of equality) is set on the degrees of a job made smaller or larger by
    :mod:`fmesh.plan.rescale`: every mesh of the job then converts ranks to and from the old job's.

    Deliberate differences, with the same rank groups in every case:

    - torchtitan before late 2025 dropped degree-1 dims from the world mesh
      (and always kept ``dp_shard_mod_ep``); its newer versions keep every dim
      (with fake groups), as here.
    - torchtitan V1 also required ``ep % cp == 0`` (``ep % (cp*tp) == 0`` with ``etp=1``),
      i.e. EP had to take all of cp; the unflatten-based versions, and this one, only
      require that ``ep`` divides its region, so EP may sit inside a cp group.
    - ``etp`` must be 1 or ``tp`` even when ``ep == 1`` (torchtitan checks it only for ``ep > 1``).
    - OLMo-core lays the dense axes out the same way (pp, dp_replicate, dp_shard, cp,
      tp), so its groups agree; it calls our ``dp_shard_cp`` "dp_cp" in its HSDP model
      mesh, defaults HSDP to one replica per node (here ``dp_replicate`` is explicit),
      and allows EP only with HSDP, without TP, and with ``ep == dp_shard`` -- a
      special case of the rule above.

    >>> dims = ParallelDims(8, dp_shard=4, tp=2, ep=4)
    >>> dims.expert_mesh
    Mesh(pp=1, dp_replicate=1, efsdp=2, ep=4, etp=1; world=8)
    >>> dims.mesh("ep").groups(), dims.mesh("efsdp").group(0)
    (((0, 1, 2, 3), (4, 5, 6, 7)), (0, 4))
    >>> ParallelDims(8, dp_shard=3, tp=2)
    Traceback (most recent call last):
    ...
    ValueError: the degrees do not multiply to world_size 8: ... = 6; give one degree as -1 to infer it ...
    """

    world_size: int = attrs.field(validator=_check_world_size)
    pp: int = attrs.field(default=1, kw_only=True, validator=_check_degree)
    dp_replicate: int = attrs.field(default=1, kw_only=True, validator=_check_degree)
    dp_shard: int = attrs.field(default=-1, kw_only=True, validator=_check_degree)
    cp: int = attrs.field(default=1, kw_only=True, validator=_check_degree)
    tp: int = attrs.field(default=1, kw_only=True, validator=_check_degree)
    ep: int = attrs.field(default=1, kw_only=True, validator=_check_degree)
    etp: int = attrs.field(default=1, kw_only=True, validator=_check_degree)
    device_type: str = attrs.field(default="cpu", kw_only=True, validator=_check_device_type)
    rank_map: tuple[int, ...] | None = attrs.field(default=None, kw_only=True, converter=_to_rank_map)
    lineage: Lineage | None = attrs.field(default=None, kw_only=True, eq=False, repr=False)
    _world: Mesh = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._infer()
        self._check_expert()
        world = make_mesh(
            tuple(getattr(self, n) for n in WORLD_AXES),
            WORLD_AXES,
            device_type=self.device_type,
            rank_map=self.rank_map,
            lineage=self.lineage,
        )
        object.__setattr__(self, "_world", world)

    def _infer(self) -> None:
        for name in ("ep", "etp"):
            if getattr(self, name) == -1:
                raise ValueError(
                    f"{name}=-1 is not supported: {name} does not multiply into world_size, so it cannot be "
                    f"inferred; give it explicitly (only {', '.join(WORLD_AXES)} may be -1)"
                )
        inferred = [n for n in WORLD_AXES if getattr(self, n) == -1]
        if len(inferred) > 1:
            hint = ""
            if "dp_shard" in inferred:
                hint = " (dp_shard defaults to -1: set it explicitly to infer another degree)"
            raise ValueError(
                f"only one degree may be -1, got -1 for {' and '.join(inferred)}{hint}"
            )
        if inferred:
            name = inferred[0]
            others = [n for n in WORLD_AXES if n != name]
            known = 1
            for other in others:
                known *= getattr(self, other)
            if self.world_size % known != 0:
                raise ValueError(
                    f"cannot infer {name}=-1: world_size {self.world_size} is not divisible by "
                    f"{_product_text(self, others)} = {known}"
                )
            object.__setattr__(self, name, self.world_size // known)
        total = 1
        for name in WORLD_AXES:
            total *= getattr(self, name)
        if total != self.world_size:
            raise ValueError(
                f"the degrees do not multiply to world_size {self.world_size}: "
                f"{_product_text(self, WORLD_AXES)} = {total}; give one degree as -1 to infer it "
                f"(dp_shard=-1 is world_size // the others)"
            )

    def _check_expert(self) -> None:
        if self.etp not in (1, self.tp):
            raise ValueError(
                f"etp={self.etp} is not supported: etp must be 1 (experts are not tensor-parallel, "
                f"ep may borrow tp) or equal to tp={self.tp} (experts re-use the tp axis)"
            )
        names: tuple[str, ...]
        if self.etp == 1:
            region, names = self.dp_shard * self.cp * self.tp, ("dp_shard", "cp", "tp")
            why = "with etp=1, ep is carved from dp_shard * cp * tp inside one dp_replicate group"
        else:
            region, names = self.dp_shard * self.cp, ("dp_shard", "cp")
            why = f"with etp=tp={self.tp}, ep is carved from dp_shard * cp inside one dp_replicate group"
        if region % self.ep != 0:
            raise ValueError(
                f"ep={self.ep} does not divide {_product_text(self, names)} = {region}: {why}; "
                f"valid ep: {_choices(region)}"
            )

    # ------------------------------------------------------------- degrees

    @property
    def efsdp(self) -> int:
        """Degree of expert-weight sharding: ``dp_shard * cp * tp // (ep * etp)``.

        >>> ParallelDims(16, dp_shard=4, cp=2, tp=2, ep=4).efsdp
        4
        """
        return self.dp_shard * self.cp * self.tp // (self.ep * self.etp)

    @property
    def degrees(self) -> dict[str, int]:
        """Size of every mesh in :data:`MESH_NAMES`, by name.

        >>> ParallelDims(8, dp_replicate=2, tp=2).degrees
        {'pp': 1, 'dp_replicate': 2, 'dp_shard': 2, 'cp': 1, 'tp': 2, 'dp': 4, 'dp_shard_cp': 2, \
'dp_cp': 4, 'ep': 1, 'efsdp': 4, 'etp': 1}
        """
        sizes = {name: getattr(self, name) for name in WORLD_AXES}
        for name, parts in DERIVED_MESHES.items():
            sizes[name] = 1
            for part in parts:
                sizes[name] *= getattr(self, part)
        sizes.update(ep=self.ep, efsdp=self.efsdp, etp=self.etp)
        return sizes

    @property
    def pp_enabled(self) -> bool:
        """``pp > 1``.

        >>> ParallelDims(8, pp=2).pp_enabled
        True
        """
        return self.pp > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        """``dp_replicate > 1``.

        >>> ParallelDims(8).dp_replicate_enabled
        False
        """
        return self.dp_replicate > 1

    @property
    def dp_shard_enabled(self) -> bool:
        """``dp_shard > 1``.

        >>> ParallelDims(8).dp_shard_enabled
        True
        """
        return self.dp_shard > 1

    @property
    def cp_enabled(self) -> bool:
        """``cp > 1``.

        >>> ParallelDims(8, cp=2).cp_enabled
        True
        """
        return self.cp > 1

    @property
    def tp_enabled(self) -> bool:
        """``tp > 1``.

        >>> ParallelDims(8, tp=8).tp_enabled
        True
        """
        return self.tp > 1

    @property
    def ep_enabled(self) -> bool:
        """``ep > 1``.

        >>> ParallelDims(8, ep=2).ep_enabled
        True
        """
        return self.ep > 1

    @property
    def etp_enabled(self) -> bool:
        """``etp > 1``.

        >>> ParallelDims(8, tp=2, ep=2, etp=2).etp_enabled
        True
        """
        return self.etp > 1

    @property
    def dp_enabled(self) -> bool:
        """Any data parallelism: ``dp_replicate > 1 or dp_shard > 1``.

        >>> ParallelDims(8, tp=8).dp_enabled
        False
        """
        return self.dp_replicate > 1 or self.dp_shard > 1

    @property
    def fsdp_enabled(self) -> bool:
        """Parameters are sharded: ``dp_shard * cp > 1`` (cp ranks shard parameters too).

        >>> ParallelDims(8, dp_shard=1, cp=2, tp=4).fsdp_enabled
        True
        """
        return self.dp_shard > 1 or self.cp > 1

    @property
    def data_parallel(self) -> str:
        """How to wrap the model, torchtitan's choice: ``"hsdp"``, ``"fsdp"``, ``"ddp"`` or ``"none"``.

        >>> ParallelDims(8, dp_replicate=2).data_parallel, ParallelDims(8, dp_shard=1, dp_replicate=8).data_parallel
        ('hsdp', 'ddp')
        """
        if self.fsdp_enabled:
            return "hsdp" if self.dp_replicate_enabled else "fsdp"
        return "ddp" if self.dp_replicate_enabled else "none"

    # --------------------------------------------------------------- meshes

    @property
    def world_mesh(self) -> Mesh:
        """The world mesh ``(pp, dp_replicate, dp_shard, cp, tp)``, every axis kept.

        >>> ParallelDims(8, tp=2).world_mesh
        Mesh(pp=1, dp_replicate=1, dp_shard=4, cp=1, tp=2; world=8)
        """
        return self._world

    @property
    def dense_mesh(self) -> Mesh:
        """``(pp, dp_replicate, dp_shard_cp, tp)``: the axes dense model parallelisation uses.

        >>> ParallelDims(16, dp_shard=2, cp=2, tp=4).dense_mesh
        Mesh(pp=1, dp_replicate=1, dp_shard_cp=4, tp=4; world=16)
        """
        return flatten(self._world, ("dp_shard", "cp"), "dp_shard_cp")

    @property
    def expert_mesh(self) -> Mesh:
        """``(pp, dp_replicate, efsdp, ep, etp)``: the same ranks, unflattened for MoE layers.

        >>> ParallelDims(8, dp_shard=2, tp=4, ep=2, etp=4).expert_mesh
        Mesh(pp=1, dp_replicate=1, efsdp=1, ep=2, etp=4; world=8)
        """
        region = flatten(self._world, ("dp_shard", "cp", "tp"), "_expert_region")
        return unflatten(region, "_expert_region", {"efsdp": self.efsdp, "ep": self.ep, "etp": self.etp})

    def mesh(self, name: str) -> Mesh:
        """The 1-D mesh ``name`` (one of :data:`MESH_NAMES`, or an alias in :data:`MESH_ALIASES`).

        Its single axis is called ``name``; its groups are the groups of that axis.

        >>> dims = ParallelDims(8, dp_replicate=2, dp_shard=2, tp=2)
        >>> dims.mesh("loss").groups()
        ((0, 2, 4, 6), (1, 3, 5, 7))
        """
        if not isinstance(name, str):
            raise TypeError(f"mesh names are strings, got {name!r}; valid names: {MESH_NAMES + tuple(MESH_ALIASES)}")
        canonical = MESH_ALIASES.get(name, name)
        if canonical in WORLD_AXES:
            mesh = self._world[canonical]
        elif canonical in DERIVED_MESHES:
            parts = DERIVED_MESHES[canonical]
            mesh = flatten(self._world[parts], parts, canonical)
        elif canonical in ("ep", "efsdp", "etp"):
            mesh = self.expert_mesh[canonical]
        else:
            raise KeyError(f"unknown mesh {name!r}: valid names are {MESH_NAMES + tuple(MESH_ALIASES)}")
        return mesh if canonical == name else rename(mesh, {canonical: name})

    def meshes(self) -> dict[str, Mesh]:
        """Every 1-D mesh of :data:`MESH_NAMES`, by name, size-1 ones included.

        >>> list(ParallelDims(4).meshes())[:6]
        ['pp', 'dp_replicate', 'dp_shard', 'cp', 'tp', 'dp']
        """
        return {name: self.mesh(name) for name in MESH_NAMES}

    def fsdp_mesh(self) -> Mesh:
        """The mesh to give ``fully_shard``: 1-D ``(dp_shard_cp,)`` for FSDP, or 2-D
        ``(dp_replicate, dp_shard_cp)`` for HSDP when ``dp_replicate > 1``.

        ``fully_shard`` reads a 2-D mesh as (replicate, shard), so this never returns
        any other 2-D mesh. With ``dp_shard * cp == 1`` and ``dp_replicate > 1`` it is
        ``(dp_replicate, 1)``: HSDP with nothing to shard, i.e. plain replication
        (torchtitan would use DDP there; see :attr:`data_parallel`).

        >>> ParallelDims(8, tp=2).fsdp_mesh()
        Mesh(dp_shard_cp=4; world=8)
        >>> hsdp = ParallelDims(16, dp_replicate=2, cp=2, tp=2).fsdp_mesh()
        >>> hsdp, hsdp.group(0, "dp_replicate"), hsdp.group(0, "dp_shard_cp")
        (Mesh(dp_replicate=2, dp_shard_cp=4; world=16), (0, 8), (0, 2, 4, 6))
        """
        dense = self.dense_mesh
        if self.dp_replicate_enabled:
            return dense["dp_replicate", "dp_shard_cp"]
        return dense["dp_shard_cp"]

    def expert_fsdp_mesh(self) -> Mesh:
        """The mesh to give ``fully_shard`` for expert weights: ``(efsdp,)``, or
        ``(dp_replicate, efsdp)`` when ``dp_replicate > 1``.

        >>> ParallelDims(8, dp_replicate=2, tp=2, ep=2).expert_fsdp_mesh()
        Mesh(dp_replicate=2, efsdp=2; world=8)
        """
        expert = self.expert_mesh
        if self.dp_replicate_enabled:
            return expert["dp_replicate", "efsdp"]
        return expert["efsdp"]

    def __repr__(self) -> str:
        degrees = ", ".join(f"{n}={getattr(self, n)}" for n in DEGREE_NAMES)
        return f"ParallelDims(world_size={self.world_size}, {degrees})"
