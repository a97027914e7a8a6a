"""Every communicator a job will create, before it runs: the manifest and its schema.

:func:`build_manifest` lists each distinct communicator layout of a training job (the meshes of
:func:`fmesh.plan.jobs.job_meshes`) once, in the order a :class:`~fmesh.Context` creates them when handed
those meshes (``ctx.plan``/``ctx.materialize``: mesh by mesh, axis by axis, a layout seen before is shared,
and a group of one rank needs no communicator). Layouts, not ranks: a million ranks make a few kilobytes.
:func:`check_manifest` validates a document against the schema below and :func:`load_manifest` reads one from a
file. Inside fmesh a manifest is a typed :class:`Manifest` (:func:`plan_manifest`, :meth:`Manifest.from_json`);
the JSON document exists only at the edge (:meth:`Manifest.to_json`, the file). :mod:`fmesh.plan.manifest_diff`
compares two; :mod:`fmesh.plan.manifest_table` prints a manifest and :mod:`fmesh.plan.diff_table` a diff.
Pure: no torch, no process group.

Schema ``fmesh.manifest/1`` (a JSON object; sizes in bytes):

* ``schema``: ``"fmesh.manifest/1"``;
* ``universe``: ``world_size``, ``device_type``, ``rank_map`` (``"identity"``: slot ``i`` is rank ``i``), ``id``;
* ``job``: ``gpus_per_node``, ``hosts``, ``rank_order`` (``"block"`` or ``"cyclic"``), ``degrees`` (every
  :class:`~fmesh.ParallelDims` degree, and ``efsdp``);
* ``backend``: the backend of every communicator (``"nccl"`` or ``"gloo"``);
* ``communicators``: one object per distinct layout, in creation order: ``order`` (its index), ``names`` (every
  mesh and axis that uses it, ``mesh`` or ``mesh.axis``), ``layout`` (``shape`` and ``stride``, flat and
  coalesced, over the universe's slots: rank ``r``'s group is ``r - layout(i_r) + layout(j)`` for every ``j``),
  ``size`` (ranks per group), ``num_groups``, ``hosts_per_group`` and ``hosts_per_group_min`` (most and fewest
  hosts one group touches), ``gpu_memory_bytes`` (estimate per member, below);
* ``trivial``: the names whose groups are single ranks (no communicator);
* ``per_rank``: ``communicators`` (how many each rank joins: one group of each layout, since the job's meshes
  cover every rank) and ``gpu_memory_bytes`` (their sum);
* ``memory_model``: the formula and its parameters.

**Memory per communicator** (NCCL; gloo's buffers live in host memory and count 0):
``channels x peers x (Simple + LL128 + LL buffers)``, where the buffers are NCCL's defaults per connection and
channel (``src/init.cc``: ``DEFAULT_BUFFSIZE`` = 4 MiB, ``NCCL_BUFFSIZE``; ``DEFAULT_LL128_BUFFSIZE`` =
120 x 640 x 8 x 8 B = 4.69 MiB; ``DEFAULT_LL_BUFFSIZE`` = 8 x 512 x 8 x 16 B = 512 KiB), ``peers`` is the ring's
one predecessor plus up to three tree neighbours (``1 + min(size - 1, 3)``), and ``channels`` is 16 (an
assumption: NCCL picks 2 to 32 per communicator from the topology; H100 hosts commonly get 16 or more). It is an
upper bound: since NCCL 2.22 (``NCCL_RUNTIME_CONNECT=1``) only the algorithms a communicator runs get buffers,
so one that only runs rings (FSDP's all_gather and reduce_scatter) holds a quarter of it. Not counted: the
CUDA context and NCCL's few-MiB fixed structures.

>>> m = build_manifest(16, 8, tp=8)
>>> [(c["names"][0], c["size"], c["num_groups"], c["hosts_per_group"]) for c in m["communicators"]]
[('dp_shard', 2, 8, 2), ('tp', 8, 2, 1)]
>>> m["per_rank"]["communicators"], check_manifest(m) is m
(2, True)
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any, Literal, get_args

import attrs

from fmesh.errors import ManifestError
from fmesh.layout import flat
from fmesh.layout.flat import Modes
from fmesh.layout.int_tuple import is_int, product
from fmesh.plan.communicators import Communicator, plan_communicators
from fmesh.plan.jobs import job, job_degrees, job_requests
from fmesh.plan.topology import ORDERS, RankOrder, Topology

__all__ = [
    "BACKENDS",
    "SCHEMA",
    "Backend",
    "Manifest",
    "ManifestCommunicator",
    "NcclMemory",
    "build_manifest",
    "check_manifest",
    "dump_manifest",
    "load_manifest",
    "plan_manifest",
]

SCHEMA = "fmesh.manifest/1"
"""The schema this module writes and reads."""

Backend = Literal["nccl", "gloo"]
"""A backend a manifest may name."""

BACKENDS: tuple[Backend, ...] = get_args(Backend)
"""The backends a manifest may name."""


@attrs.frozen
class NcclMemory:
    """NCCL's GPU memory for one communicator, per member (the module docstring says where the figures come from).

    >>> NcclMemory().communicator_bytes(8) // 2**20, NcclMemory().communicator_bytes(2) // 2**20
    (588, 294)
    """

    channels: int = 16
    simple_bytes: int = 1 << 22
    ll128_bytes: int = 120 * 640 * 8 * 8
    ll_bytes: int = 8 * 512 * 8 * 16

    def peers(self, size: int) -> int:
        """Connections with buffers per channel: the ring's predecessor and up to three tree neighbours."""
        return 0 if size <= 1 else 1 + min(size - 1, 3)

    def communicator_bytes(self, size: int) -> int:
        """``channels x peers x (Simple + LL128 + LL)`` bytes on each member of a group of ``size`` ranks."""
        return self.channels * self.peers(size) * (self.simple_bytes + self.ll128_bytes + self.ll_bytes)

    def describe(self) -> Mapping[str, object]:
        """The formula and its parameters, as the manifest records them (``memory_model``)."""
        return {
            "formula": "channels * (1 + min(size - 1, 3)) * (simple_bytes + ll128_bytes + ll_bytes); 0 for gloo",
            "channels": self.channels,
            "simple_bytes": self.simple_bytes,
            "ll128_bytes": self.ll128_bytes,
            "ll_bytes": self.ll_bytes,
            "source": "NCCL src/init.cc DEFAULT_BUFFSIZE, DEFAULT_LL128_BUFFSIZE, DEFAULT_LL_BUFFSIZE; "
                      "channels assumed; an upper bound (ring and tree connected)",
        }


@attrs.frozen
class ManifestCommunicator:
    """One distinct communicator layout of a :class:`Manifest` (schema: ``communicators[i]``)."""

    order: int
    names: tuple[str, ...]
    modes: Modes
    size: int
    num_groups: int
    hosts_per_group: int
    hosts_per_group_min: int
    gpu_memory_bytes: int

    def to_json(self) -> dict[str, Any]:
        """The entry as the manifest writes it."""
        return {
            "order": self.order,
            "names": list(self.names),
            "layout": {"shape": [s for s, _ in self.modes], "stride": [d for _, d in self.modes]},
            "size": self.size,
            "num_groups": self.num_groups,
            "hosts_per_group": self.hosts_per_group,
            "hosts_per_group_min": self.hosts_per_group_min,
            "gpu_memory_bytes": self.gpu_memory_bytes,
        }

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> ManifestCommunicator:
        """The record of an entry :func:`check_manifest` accepted."""
        layout = entry["layout"]
        return cls(order=entry["order"], names=tuple(entry["names"]),
                   modes=tuple(zip(layout["shape"], layout["stride"], strict=True)), size=entry["size"],
                   num_groups=entry["num_groups"], hosts_per_group=entry["hosts_per_group"],
                   hosts_per_group_min=entry["hosts_per_group_min"], gpu_memory_bytes=entry["gpu_memory_bytes"])


@attrs.frozen
class Manifest:
    """Every communicator a job creates (the schema in the module docstring, as typed fields).

    ``degrees`` and ``memory_model`` are kept as written; ``per_rank`` is derived from the communicators.

    >>> m = plan_manifest(16, 8, tp=8)
    >>> [(c.names[0], c.size) for c in m.communicators], m.per_rank_communicators
    ([('dp_shard', 2), ('tp', 8)], 2)
    >>> Manifest.from_json(m.to_json()) == m
    True
    """

    world_size: int
    device_type: str
    universe_id: str
    gpus_per_node: int
    hosts: int
    rank_order: RankOrder
    degrees: Mapping[str, int]
    backend: Backend
    communicators: tuple[ManifestCommunicator, ...]
    trivial: tuple[str, ...]
    memory_model: Mapping[str, object]

    @property
    def per_rank_communicators(self) -> int:
        """Communicators each rank joins: one group of each layout."""
        return len(self.communicators)

    @property
    def per_rank_gpu_memory_bytes(self) -> int:
        """GPU memory each rank holds for its communicators' buffers."""
        return sum(c.gpu_memory_bytes for c in self.communicators)

    def summary(self) -> str:
        """The job in one line: world, hosts, order, backend and the degrees that are not 1.

        >>> plan_manifest(16, 8, tp=8).summary()
        'world 16 = 2 hosts x 8 (block order), nccl; dp_shard=2 tp=8'
        """
        degrees = self.degrees
        shown = {n: v for n, v in degrees.items() if n != "efsdp" or degrees.get("ep", 1) > 1}
        text = " ".join(f"{n}={v}" for n, v in shown.items() if v != 1 or n in ("dp_shard", "tp"))
        return (f"world {self.world_size} = {self.hosts} hosts x {self.gpus_per_node} ({self.rank_order} order), "
                f"{self.backend}; {text}")

    def to_json(self) -> dict[str, Any]:
        """The manifest document (schema ``fmesh.manifest/1``), ready for ``json.dumps``."""
        return {
            "schema": SCHEMA,
            "universe": {"world_size": self.world_size, "device_type": self.device_type, "rank_map": "identity",
                         "id": self.universe_id},
            "job": {"gpus_per_node": self.gpus_per_node, "hosts": self.hosts, "rank_order": self.rank_order,
                    "degrees": dict(self.degrees)},
            "backend": self.backend,
            "communicators": [c.to_json() for c in self.communicators],
            "trivial": list(self.trivial),
            "per_rank": {"communicators": self.per_rank_communicators,
                         "gpu_memory_bytes": self.per_rank_gpu_memory_bytes},
            "memory_model": dict(self.memory_model),
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "manifest") -> Manifest:
        """The record of a manifest document, checked first (:func:`check_manifest`, naming ``source``)."""
        check_manifest(data, source)
        universe, details = data["universe"], data["job"]
        return cls(world_size=universe["world_size"], device_type=universe["device_type"],
                   universe_id=universe.get("id", ""), gpus_per_node=details["gpus_per_node"],
                   hosts=details["hosts"], rank_order=details["rank_order"], degrees=dict(details["degrees"]),
                   backend=data["backend"],
                   communicators=tuple(ManifestCommunicator.from_json(c) for c in data["communicators"]),
                   trivial=tuple(data["trivial"]), memory_model=dict(data["memory_model"]))


def _entry(order: int, communicator: Communicator, topology: Topology, memory: NcclMemory | None
           ) -> ManifestCommunicator:
    """A communicator as the manifest lists it (``memory`` None: gloo, no GPU memory)."""
    first = communicator.first
    span = topology.span(first.mesh, first.axes)
    return ManifestCommunicator(
        order=order, names=tuple(r.label for r in communicator.requests), modes=communicator.layout.modes,
        size=communicator.size, num_groups=span.num_groups, hosts_per_group=span.hosts_max,
        hosts_per_group_min=span.hosts_min,
        gpu_memory_bytes=0 if memory is None else memory.communicator_bytes(communicator.size),
    )


def plan_manifest(
    world_size: int,
    gpus_per_node: int,
    *,
    rank_order: RankOrder = "block",
    backend: Backend = "nccl",
    memory: NcclMemory | None = None,
    **degrees: int,
) -> Manifest:
    """The :class:`Manifest` of a job with these degrees on these hosts.

    >>> m = plan_manifest(1048576, 8, pp=8, cp=2, tp=8, ep=32)
    >>> len(m.communicators), m.hosts
    (7, 131072)
    """
    if backend not in BACKENDS:
        raise ValueError(f"expected a backend among {BACKENDS}, but got {backend!r}")
    model = NcclMemory() if memory is None else memory
    dims, topology = job(world_size, gpus_per_node, rank_order=rank_order, **degrees)
    universe = dims.world_mesh.universe
    requests = job_requests(dims)  # the Context plans a mesh axis by axis, in order
    for request in requests:
        if request.mesh.frame:
            raise ValueError(f"{request.label} re-indexes its universe (an uneven unflatten): a manifest cannot "
                             "list it")
    plan = plan_communicators(requests)
    trivial = tuple(r.label for c in plan.communicators if c.size == 1 for r in c.requests)
    communicators = tuple(_entry(order, c, topology, model if backend == "nccl" else None)
                          for order, c in enumerate(c for c in plan.communicators if c.size > 1))
    return Manifest(world_size=world_size, device_type=universe.device_type, universe_id=universe.id,
                    gpus_per_node=gpus_per_node, hosts=topology.hosts, rank_order=rank_order,
                    degrees=job_degrees(dims), backend=backend, communicators=communicators, trivial=trivial,
                    memory_model=model.describe())


def build_manifest(
    world_size: int,
    gpus_per_node: int,
    *,
    rank_order: RankOrder = "block",
    backend: Backend = "nccl",
    memory: NcclMemory | None = None,
    **degrees: int,
) -> dict[str, Any]:
    """The manifest document (schema in the module docstring) of a job: :func:`plan_manifest` as JSON data.

    >>> m = build_manifest(1048576, 8, pp=8, cp=2, tp=8, ep=32)
    >>> len(m["communicators"]), len(json.dumps(m)) < 2**20
    (7, True)
    """
    return plan_manifest(world_size, gpus_per_node, rank_order=rank_order, backend=backend, memory=memory,
                         **degrees).to_json()


def dump_manifest(manifest: Mapping[str, Any]) -> str:
    """The manifest as the JSON text ``--manifest`` writes (checked first).

    >>> json.loads(dump_manifest(build_manifest(8, 8, tp=8)))["schema"]
    'fmesh.manifest/1'
    """
    return json.dumps(check_manifest(manifest), indent=1) + "\n"


# ------------------------------------------------------------------------------------------ checking


def _fail(source: str, message: str) -> ManifestError:
    return ManifestError(f"{source}: {message}")


def _field(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], source: str, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise _fail(source, f"expected {where} as a JSON object, but got {type(data).__name__}")
    if key not in data:
        raise _fail(source, f"{where} has no field {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and not is_int(value)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _fail(source, f"expected {where}.{key} as {names}, but got {value!r}")
    return value


def _count(data: Mapping[str, Any], key: str, source: str, where: str, least: int = 1) -> int:
    value = _field(data, key, int, source, where)
    if value < least:  # _field took ints only (is_int: no bools)
        raise _fail(source, f"expected {where}.{key} as an int >= {least}, but got {value!r}")
    return int(value)


def _check_communicator(entry: Any, index: int, world: int, backend: str, source: str) -> tuple[tuple[int, int], ...]:
    where = f"communicators[{index}]"
    order = _count(entry, "order", source, where, least=0)
    if order != index:
        raise _fail(source, f"expected {where}.order to be {index} (creation order), but got {order}")
    names = _field(entry, "names", list, source, where)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise _fail(source, f"expected {where}.names as a non-empty list of names, but got {names!r}")
    layout = _field(entry, "layout", dict, source, where)
    shape = _field(layout, "shape", list, source, f"{where}.layout")
    stride = _field(layout, "stride", list, source, f"{where}.layout")
    ints = all(is_int(v) for v in (*shape, *stride))
    if not ints or len(shape) != len(stride) or any(s < 1 for s in shape) or any(d < 0 for d in stride):
        raise _fail(source, f"expected {where}.layout as equally long lists of positive sizes and strides, "
                            f"but got shape {shape!r}, stride {stride!r}")
    modes = tuple(zip(shape, stride, strict=True))
    try:
        flat.complement(modes, world)
    except ValueError as error:
        raise _fail(source, f"{where}.layout does not tile a world of {world} ranks: {error}") from None
    size = _count(entry, "size", source, where, least=2)
    if size != product(tuple(shape)):
        raise _fail(source, f"{where}.size is {size}, but its layout has {product(tuple(shape))} ranks")
    groups = _count(entry, "num_groups", source, where)
    if groups * size != world:
        raise _fail(source, f"{where} has {groups} groups of {size} ranks, but the world has {world}")
    most = _count(entry, "hosts_per_group", source, where)
    fewest = _count(entry, "hosts_per_group_min", source, where)
    if not fewest <= most <= size:
        raise _fail(source, f"expected 1 <= {where}.hosts_per_group_min <= hosts_per_group <= size, but got "
                            f"{fewest}, {most}, {size}")
    memory = _count(entry, "gpu_memory_bytes", source, where, least=0)
    if backend == "gloo" and memory:
        raise _fail(source, f"{where}.gpu_memory_bytes is {memory}, but gloo communicators use no GPU memory")
    return modes


def check_manifest(data: Any, source: str = "manifest") -> Any:
    """``data`` itself if it is a valid manifest, else :class:`~fmesh.errors.ManifestError` in one line.

    >>> check_manifest({"schema": "fmesh.manifest/2"}, "a.json")
    Traceback (most recent call last):
    ...
    fmesh.errors.ManifestError: a.json: expected schema 'fmesh.manifest/1', but got 'fmesh.manifest/2'
    """
    if not isinstance(data, Mapping):
        raise _fail(source, f"expected a JSON object with schema {SCHEMA!r}, but got {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise _fail(source, f"expected schema {SCHEMA!r}, but got {data.get('schema')!r}")
    universe = _field(data, "universe", dict, source, "manifest")
    world = _count(universe, "world_size", source, "universe")
    _field(universe, "device_type", str, source, "universe")
    if _field(universe, "rank_map", str, source, "universe") != "identity":
        raise _fail(source, f"expected universe.rank_map 'identity', but got {universe['rank_map']!r}")
    details = _field(data, "job", dict, source, "manifest")
    per_node = _count(details, "gpus_per_node", source, "job")
    hosts = _count(details, "hosts", source, "job")
    if per_node * hosts != world:
        raise _fail(source, f"job has {hosts} hosts x {per_node} gpus, but the world has {world} ranks")
    if _field(details, "rank_order", str, source, "job") not in ORDERS:
        raise _fail(source, f"expected job.rank_order among {ORDERS}, but got {details['rank_order']!r}")
    _field(details, "degrees", dict, source, "job")
    backend = _field(data, "backend", str, source, "manifest")
    if backend not in BACKENDS:
        raise _fail(source, f"expected backend among {BACKENDS}, but got {backend!r}")
    communicators = _field(data, "communicators", list, source, "manifest")
    seen: dict[tuple[tuple[int, int], ...], int] = {}
    for index, entry in enumerate(communicators):
        modes = _check_communicator(entry, index, world, backend, source)
        if modes in seen:
            raise _fail(source, f"communicators[{index}] repeats the layout of communicators[{seen[modes]}]")
        seen[modes] = index
    trivial = _field(data, "trivial", list, source, "manifest")
    if not all(isinstance(n, str) and n for n in trivial):
        raise _fail(source, f"expected trivial as a list of names, but got {trivial!r}")
    per_rank = _field(data, "per_rank", dict, source, "manifest")
    if _count(per_rank, "communicators", source, "per_rank", least=0) != len(communicators):
        raise _fail(source, f"per_rank.communicators is {per_rank['communicators']}, but {len(communicators)} "
                            "communicators are listed")
    total = sum(c["gpu_memory_bytes"] for c in communicators)
    if _count(per_rank, "gpu_memory_bytes", source, "per_rank", least=0) != total:
        raise _fail(source, f"per_rank.gpu_memory_bytes is {per_rank['gpu_memory_bytes']}, but the "
                            f"communicators add up to {total}")
    _field(data, "memory_model", dict, source, "manifest")
    return data


MANIFEST_LIMIT = 64 << 20  # bytes read at most from a manifest file


def load_manifest(path: str | pathlib.Path) -> dict[str, Any]:
    """Read and check the manifest in ``path``; :class:`~fmesh.errors.ManifestError` in one line if it cannot.

    >>> load_manifest("/nonexistent.json")
    Traceback (most recent call last):
    ...
    fmesh.errors.ManifestError: /nonexistent.json: cannot read it: No such file or directory
    """
    source = str(path)
    try:
        with open(path, "rb") as file:  # at most one byte past the limit: /dev/zero must not fill the memory
            data = file.read(MANIFEST_LIMIT + 1)
        if len(data) > MANIFEST_LIMIT:
            raise _fail(source, f"larger than {MANIFEST_LIMIT >> 20} MiB: not a manifest (a manifest lists layouts, "
                                "not ranks; a million-rank job's is a few kB)")
        text = data.decode()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise _fail(source, f"cannot read it: {reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise _fail(source, f"not JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    except RecursionError:  # the decoder recurses once per level: a hostile file must not become a traceback
        raise _fail(source, "not JSON: nested too deeply") from None
    result: dict[str, Any] = check_manifest(data, source)
    return result
