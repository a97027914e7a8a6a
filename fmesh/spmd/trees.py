"""Pytrees for the manual region: nested tuples, lists and dicts of tensors in and out, and specs given as a
prefix of them (JAX's rule: a spec where a subtree stands applies to every leaf under it). Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Tree = Any


def leaves(tree: Tree, is_leaf: Callable[[Any], bool] = lambda _: False) -> list[Any]:
    """The leaves of ``tree`` in order (tuples, lists and dict values by sorted key).

    >>> leaves({"b": [1, 2], "a": (3,)})
    [3, 1, 2]
    """
    if is_leaf(tree):
        return [tree]
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in leaves(item, is_leaf)]
    if isinstance(tree, dict):
        return [leaf for key in sorted(tree) for leaf in leaves(tree[key], is_leaf)]
    return [tree]


def rebuild(tree: Tree, values: list[Any], is_leaf: Callable[[Any], bool] = lambda _: False) -> Tree:
    """``tree`` with its leaves replaced, in order, by ``values``.

    >>> rebuild({"b": [1, 2], "a": (3,)}, [30, 10, 20])
    {'b': [10, 20], 'a': (30,)}
    """
    found = iter(values)

    def walk(node: Tree) -> Tree:
        if is_leaf(node):
            return next(found)
        if isinstance(node, (tuple, list)):
            return type(node)(walk(item) for item in node)
        if isinstance(node, dict):
            done = {key: walk(node[key]) for key in sorted(node)}
            return {key: done[key] for key in node}
        return next(found)
    return walk(tree)


def broadcast(prefix: Tree, tree: Tree, is_spec: Callable[[Any], bool], what: str) -> list[Any]:
    """One spec per leaf of ``tree``, from ``prefix`` (a spec where a subtree of ``tree`` stands covers it).

    >>> broadcast(("A", {"w": "B", "b": "C"}), ([1, 2], {"w": 3, "b": 4}), lambda s: isinstance(s, str), "in_specs")
    ['A', 'A', 'C', 'B']
    """
    if is_spec(prefix):
        return [prefix] * len(leaves(tree))
    if isinstance(prefix, (tuple, list)) and isinstance(tree, (tuple, list)):
        if len(prefix) != len(tree):
            raise ValueError(f"{what}: expected {len(tree)} specs (one per value), but got {len(prefix)}: {prefix!r}")
        return [s for p, t in zip(prefix, tree, strict=True) for s in broadcast(p, t, is_spec, what)]
    if isinstance(prefix, dict) and isinstance(tree, dict):
        if set(prefix) != set(tree):
            raise ValueError(f"{what}: expected the keys {sorted(tree)}, but got {sorted(prefix)}")
        return [s for key in sorted(tree) for s in broadcast(prefix[key], tree[key], is_spec, what)]
    raise ValueError(f"{what}: expected a spec (fmesh.spmd.P(...)) or a tree shaped like the values, but got "
                     f"{prefix!r} for {type(tree).__name__}")
