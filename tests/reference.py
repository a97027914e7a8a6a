"""Brute-force reference meshes: explicit numpy arrays of slots, no layout algebra.

A reference mesh is an array of shape ``(instances, *axis_sizes)`` whose
entries are universe slots. Every operation is a transpose, reshape or index of
that array, so it is obviously right and independent of fmesh's layouts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fmesh import Mesh, Universe


class RefMesh:
    def __init__(self, names: Sequence[str], slots: np.ndarray, rank_map: Sequence[int]) -> None:
        assert slots.ndim == len(names) + 1
        self.names = tuple(names)
        self.slots = slots
        self.rank_map = np.asarray(rank_map)

    @classmethod
    def root(cls, sizes: Sequence[int], names: Sequence[str], rank_map: Sequence[int] | None = None) -> RefMesh:
        world = math.prod(sizes)
        ranks = np.arange(world) if rank_map is None else np.asarray(rank_map)
        return cls(names, np.arange(world).reshape(1, *sizes), ranks)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(self.slots.shape[1:])

    def _axis(self, name: str) -> int:
        return 1 + self.names.index(name)

    def _with(self, names: Sequence[str], slots: np.ndarray) -> RefMesh:
        return RefMesh(names, slots, self.rank_map)

    def slice(self, *names: str) -> RefMesh:
        dropped = [self._axis(n) for n in self.names if n not in names]
        kept = [self._axis(n) for n in names]
        moved = self.slots.transpose([0, *dropped, *kept])
        return self._with(names, moved.reshape(-1, *[self.slots.shape[a] for a in kept]))

    def flatten(self, names: Sequence[str], name: str) -> RefMesh:
        first = self.names.index(names[0])
        order, new_names = [], []
        for i, n in enumerate(self.names):
            if i == first:
                order.extend(self._axis(m) for m in names)
                new_names.append(name)
            elif n not in names:
                order.append(self._axis(n))
                new_names.append(n)
        moved = self.slots.transpose([0, *order])
        shape = [moved.shape[0]]
        for n in new_names:
            shape.append(math.prod(self.sizes[self.names.index(m)] for m in names) if n == name else
                         self.sizes[self.names.index(n)])
        return self._with(new_names, moved.reshape(shape))

    def unflatten(self, name: str, sizes: dict[str, int]) -> RefMesh:
        i = self.names.index(name)
        shape = [self.slots.shape[0], *self.sizes[:i], *sizes.values(), *self.sizes[i + 1 :]]
        return self._with([*self.names[:i], *sizes, *self.names[i + 1 :]], self.slots.reshape(shape))

    def rename(self, mapping: dict[str, str]) -> RefMesh:
        return self._with([mapping.get(n, n) for n in self.names], self.slots)

    def select(self, **coordinates: int) -> RefMesh:
        slots = self.slots
        names = list(self.names)
        for name, c in coordinates.items():
            axis = 1 + names.index(name)
            slots = np.take(slots, c, axis=axis)
            names.remove(name)
        return self._with(names, slots)

    # ----------------------------------------------------------------- queries

    def covered(self) -> set[int]:
        return {int(self.rank_map[s]) for s in self.slots.reshape(-1)}

    def lines(self, names: Sequence[str]) -> np.ndarray:
        """Slot groups along ``names`` (row-major in that order), one per row."""
        axes = [self._axis(n) for n in names]
        others = [a for a in range(self.slots.ndim) if a not in axes]
        moved = self.slots.transpose([*others, *axes])
        return moved.reshape(-1, math.prod(self.slots.shape[a] for a in axes))

    def groups(self, names: Sequence[str]) -> set[tuple[int, ...]]:
        return {tuple(int(self.rank_map[s]) for s in row) for row in self.lines(names)}

    def coordinates(self) -> dict[int, tuple[int, ...]]:
        """Rank -> coordinate in its instance."""
        result = {}
        for index in np.ndindex(*self.slots.shape):
            result[int(self.rank_map[self.slots[index]])] = tuple(int(c) for c in index[1:])
        return result

    def instance_of(self, rank: int) -> np.ndarray:
        slot = int(np.nonzero(self.rank_map == rank)[0][0])
        for instance in self.slots:
            if (instance == slot).any():
                return self.rank_map[instance]
        raise KeyError(rank)


def concat(*meshes: RefMesh) -> RefMesh:
    """Concatenate independent axes by walking: from a base slot, move along each axis in turn."""
    axes = [(m, n) for m in meshes for n in m.names]
    names = [n for _, n in axes]
    sizes = [m.sizes[m.names.index(n)] for m, n in axes]
    # For every axis: slot -> (its coordinate along that axis, the ordered line through it).
    walks = []
    for m, n in axes:
        line_of, coordinate_of = {}, {}
        for row in m.lines([n]):
            for c, s in enumerate(row):
                line_of[int(s)], coordinate_of[int(s)] = row, c
        walks.append((line_of, coordinate_of))
    covered = sorted(int(s) for s in meshes[0].slots.reshape(-1))
    bases = [s for s in covered if all(coord[s] == 0 for _, coord in walks)]
    instances = []
    for base in bases:
        grid = np.empty(sizes, dtype=np.int64)
        for index in np.ndindex(*sizes):
            slot = base
            for (line_of, _), c in zip(walks, index, strict=True):
                slot = int(line_of[slot][c])
            grid[index] = slot
        instances.append(grid)
    return RefMesh(names, np.stack(instances), meshes[0].rank_map)


def dropped_coordinates(mesh: Mesh, lost: Sequence[int], axis: str) -> set[int]:
    position = mesh.axis_index(axis)
    return {coordinate[position] for coordinate in map(mesh.coordinate, lost) if coordinate is not None}


def survivors(mesh: Mesh, lost: Sequence[int], axis: str) -> list[int]:
    """Every rank whose coordinate along ``axis`` holds no lost rank, ascending (a mesh covering its universe)."""
    position, dropped = mesh.axis_index(axis), dropped_coordinates(mesh, lost, axis)
    return [r for r in range(mesh.world_size) if (mesh.coordinate(r) or ())[position] not in dropped]


def renumbered(groups: Sequence[tuple[int, ...]], number: dict[int, int]) -> tuple[tuple[int, ...], ...]:
    """The groups' surviving members in the new numbering, groups with no survivor left out."""
    kept = (tuple(number[r] for r in group if r in number) for group in groups)
    return tuple(group for group in kept if group)


def through_rank_map(groups: Sequence[tuple[int, ...]], universe: Universe) -> tuple[tuple[int, ...], ...]:
    """A restarted job's groups (over slots, its rank map the identity) read through ``universe``'s rank map."""
    return tuple(tuple(universe.rank_of(slot) for slot in group) for group in groups)
