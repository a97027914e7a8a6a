"""The world a mesh lives in: how many ranks, in which order, on which device type."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from typing import Any

import attrs

from fmesh.layout.int_tuple import is_int
from fmesh.mesh.lineage import Lineage


def _positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not is_int(value) or value < 1:
        raise ValueError(f"{attribute.name} must be a positive integer, got {value!r}")


def _device_type(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise TypeError(f"device_type must be a non-empty string such as 'cpu' or 'cuda', got {value!r}")
    if ":" in value:  # 'cuda:{rank}' would make every rank's mesh a different value: a mismatch at the first group
        raise ValueError(
            f"device_type must be a device type without an index, such as 'cpu' or 'cuda', but got {value!r}: a mesh "
            "is the same value on every rank, while each rank's device differs; give the device to the Context "
            f"(Context(device={value!r}), or cuda:LOCAL_RANK as Context.from_env chooses) and "
            f"device_type={value.split(':')[0]!r} to the mesh")


def canonical_rank_map(world_size: int, rank_map: Any) -> tuple[int, ...] | None:
    """Validate a rank map for ``world_size`` ranks; ``None`` stands for the identity.

    >>> canonical_rank_map(3, [0, 1, 2]), canonical_rank_map(3, [2, 0, 1])
    (None, (2, 0, 1))
    """
    if rank_map is None:
        return None
    if hasattr(rank_map, "tolist"):  # a tensor or an array, read row-major
        rank_map = rank_map.reshape(-1).tolist() if hasattr(rank_map, "reshape") else rank_map.tolist()
    if isinstance(rank_map, (str, bytes)) or not isinstance(rank_map, Sequence):
        raise TypeError(f"rank_map must be a sequence of ints, got {type(rank_map).__name__}")
    ranks = tuple(rank_map)
    if len(ranks) != world_size:
        raise ValueError(
            f"rank_map has {len(ranks)} entries, but world_size is {world_size}; it needs one rank per slot"
        )
    if set(map(type, ranks)) == {int} and sorted(ranks) == list(range(world_size)):
        # A permutation of plain ints, checked at C speed (a million ranks in ~0.1 s); the loop below
        # is what explains a bad map.
        return None if ranks == tuple(range(world_size)) else ranks
    seen = bytearray(world_size)
    for rank in ranks:
        if not is_int(rank):
            raise TypeError(f"rank_map entries must be ints, got {rank!r}")
        if not 0 <= rank < world_size:
            raise ValueError(
                f"rank_map entry {rank} is outside the world: ranks must lie in range(0, {world_size})"
            )
        if seen[rank]:
            raise ValueError(
                f"rank_map lists rank {rank} twice; it must be a permutation of range(0, {world_size})"
            )
        seen[rank] = 1
    return None if ranks == tuple(range(world_size)) else ranks


def _inverse(universe: Universe) -> tuple[int, ...] | None:
    ranks = universe._rank_map
    if ranks is None:
        return None
    slots = [0] * len(ranks)
    for slot, rank in enumerate(ranks):
        slots[rank] = slot
    return tuple(slots)


def _stable_id(universe: Universe) -> str:
    # The same bytes in every process: no Python hash(), which is salted per process.
    digest = hashlib.blake2b(digest_size=8)
    digest.update(f"fmesh-universe-v1|{universe.world_size}|{universe.device_type}|".encode())
    digest.update(b"identity" if universe._rank_map is None else array("q", universe._rank_map).tobytes())
    return digest.hexdigest()


@attrs.frozen(repr=False, init=False)
class Universe:
    """``world_size`` ranks on ``device_type``; slot ``i`` holds global rank ``rank_map[i]``.

    Meshes lay out slots; the rank map says which process sits in each slot.
    A universe made by :func:`fmesh.without` or :func:`fmesh.resize` has a ``lineage``: which
    slot of the universe before it each slot was (not part of equality, like the rank map,
    which the id covers).
    ``id`` is a digest of the inputs: the same in every process, kept by pickling,
    and shared by every mesh derived from one another. Equality and hashing use
    it, so comparing universes of a million ranks costs nothing.

    >>> u = Universe(4, rank_map=[3, 2, 1, 0])
    >>> u.rank_of(0), u.slot_of(0), u == Universe(4, rank_map=(3, 2, 1, 0))
    (3, 3, True)
    """

    world_size: int = attrs.field(validator=_positive_int)
    _rank_map: tuple[int, ...] | None = attrs.field(eq=False, alias="rank_map")
    device_type: str = attrs.field(default="cpu", validator=_device_type)
    lineage: Lineage | None = attrs.field(default=None, eq=False)
    _slots: tuple[int, ...] | None = attrs.field(
        init=False, default=attrs.Factory(_inverse, takes_self=True), eq=False
    )
    id: str = attrs.field(init=False, default=attrs.Factory(_stable_id, takes_self=True))

    def __init__(
        self, world_size: int, rank_map: Any = None, device_type: str = "cpu", *, lineage: Lineage | None = None
    ) -> None:
        _positive_int(self, attrs.fields(Universe).world_size, world_size)
        if lineage is not None:
            if not isinstance(lineage, Lineage):
                raise TypeError(f"lineage must be an fmesh.mesh.Lineage or None, got {lineage!r}")
            if lineage.world_size != world_size:
                raise ValueError(f"the lineage describes {lineage.world_size} slots, but world_size is {world_size}")
        self.__attrs_init__(world_size, canonical_rank_map(world_size, rank_map), device_type, lineage)

    @property
    def rank_map(self) -> Sequence[int]:
        """Global rank of each slot (a ``range`` when it is the identity).

        >>> Universe(3).rank_map
        range(0, 3)
        """
        return range(self.world_size) if self._rank_map is None else self._rank_map

    @property
    def is_identity(self) -> bool:
        """True when slot ``i`` holds rank ``i``.

        >>> Universe(3).is_identity, Universe(2, rank_map=[1, 0]).is_identity
        (True, False)
        """
        return self._rank_map is None

    def check_rank(self, rank: object) -> int:
        """``rank`` if it is a rank of this world, else a ``ValueError``/``TypeError``.

        >>> Universe(4).check_rank(3)
        3
        """
        if not is_int(rank):
            raise TypeError(f"rank must be an int, got {rank!r}")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the universe: valid ranks are 0..{self.world_size - 1}")
        return rank

    def rank_of(self, slot: int) -> int:
        """The global rank in ``slot``.

        >>> Universe(2, rank_map=[1, 0]).rank_of(0)
        1
        """
        return slot if self._rank_map is None else self._rank_map[slot]

    def slot_of(self, rank: int) -> int:
        """The slot that holds global ``rank`` (validated).

        >>> Universe(3, rank_map=[2, 0, 1]).slot_of(2)
        0
        """
        rank = self.check_rank(rank)
        return rank if self._slots is None else self._slots[rank]

    def __repr__(self) -> str:
        order = "" if self._rank_map is None else ", permuted"
        return f"Universe(world={self.world_size}, {self.device_type!r}{order}, id={self.id})"
