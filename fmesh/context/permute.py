"""Collective permutes along one mesh axis (JAX's ``ppermute``), on batched point-to-point operations.

A permutation is a sequence of ``(source, destination)`` pairs of coordinates along the axis: no
source twice, no destination twice, every coordinate inside the axis. Each member sends to at most
one member and receives from at most one, posted together with ``dist.batch_isend_irecv`` so that
no order of sends and receives can deadlock; a member that receives nothing gets zeros. ``shift``
is the permutation to the neighbour ``offset`` steps along, computed for this member alone.

>>> perm = check_perm([(0, 1), (1, 2), (2, 0)], 3, "pp")
>>> peers(perm, 0), shift_peers(0, 3, 1, wrap=False), shift_peers(0, 3, 1, wrap=True)
((1, 2), (1, None), (1, 2))
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
import torch.distributed as dist

from fmesh.context import _torch
from fmesh.context.collectives import compiling, run
from fmesh.context.groups import Route, Target
from fmesh.layout.int_tuple import is_int

Perm = tuple[tuple[int, int], ...]


def check_axis(what: str, axis: object) -> str:
    """``axis`` if it names one axis; ``TypeError`` saying how to permute along several otherwise.

    >>> check_axis("ppermute", "pp")
    'pp'
    """
    if not isinstance(axis, str):
        raise TypeError(
            f"{what} moves data along one axis: expected an axis name, but got {axis!r}; to move along several "
            "axes at once, flatten them into one first (fmesh.flatten(mesh, axes, 'name'))")
    return axis


def check_perm(perm: object, size: int, axis: str) -> Perm:
    """``perm`` as a tuple of ``(source, destination)`` pairs, checked against an axis of ``size``.

    >>> check_perm([(0, 1), (1, 0)], 2, "pp")
    ((0, 1), (1, 0))
    >>> check_perm([(0, 1), (1, 1)], 2, "pp")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ppermute perm pair (1, 1) repeats destination 1 (pair (0, 1) sends to it already): ...
    """
    # The hot path: one pass over plain ints. Every microsecond before the sends are posted is paid twice
    # in a ring, once on each side; anything unusual goes to the checks that explain what is wrong.
    if isinstance(perm, (list, tuple)):
        pairs = tuple((pair[0], pair[1]) for pair in perm if isinstance(pair, (list, tuple)) and len(pair) == 2)
        coordinates = range(size)
        if len(pairs) == len(perm) and all(
            type(s) is int and type(d) is int and s in coordinates and d in coordinates for s, d in pairs
        ) and len({s for s, _ in pairs}) == len(pairs) == len({d for _, d in pairs}):
            return pairs
    return _explain_perm(perm, size, axis)


def _explain_perm(perm: object, size: int, axis: str) -> Perm:
    """:func:`check_perm` one pair at a time, raising for the first pair that is wrong."""
    if isinstance(perm, (str, bytes)) or not isinstance(perm, Sequence):
        raise TypeError(f"ppermute perm: expected a sequence of (source, destination) pairs, but got {perm!r}")
    by_source: dict[int, tuple[int, int]] = {}
    by_destination: dict[int, tuple[int, int]] = {}
    for pair in perm:
        coordinates = [] if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) else [
            _integer(c) for c in pair]  # numpy's and torch's integers as ints
        ints = [c for c in coordinates if c is not None]
        if len(ints) != 2 or len(coordinates) != 2:
            raise TypeError(f"ppermute perm: expected (source, destination) pairs of ints, but got {pair!r}")
        source, destination = ints
        for role, coordinate in (("source", source), ("destination", destination)):
            if not 0 <= coordinate < size:
                raise ValueError(
                    f"ppermute perm pair {(source, destination)}: {role} {coordinate} is outside axis {axis!r} "
                    f"of size {size}: valid coordinates are 0..{size - 1}")
        for role, coordinate, seen in (("source", source, by_source), ("destination", destination, by_destination)):
            if coordinate in seen:
                raise ValueError(
                    f"ppermute perm pair {(source, destination)} repeats {role} {coordinate} (pair "
                    f"{seen[coordinate]} {'sends from' if role == 'source' else 'sends to'} it already): each "
                    f"coordinate {'sends' if role == 'source' else 'receives'} at most once")
            seen[coordinate] = (source, destination)
    return tuple(by_source.values())


def _integer(value: object) -> int | None:
    """``value`` as an int if it is one (numpy's and torch's integer scalars too, by ``__index__``; never a bool
    or a float), else ``None``."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def peers(perm: Perm, member: int) -> tuple[int | None, int | None]:
    """``(send_to, receive_from)`` of ``member`` (a place in the group) under ``perm`` (``None``: nobody).

    >>> peers(((0, 1),), 1)
    (None, 0)
    """
    send_to = next((destination for source, destination in perm if source == member), None)
    receive_from = next((source for source, destination in perm if destination == member), None)
    return send_to, receive_from


def shift_peers(member: int, size: int, offset: object, wrap: bool) -> tuple[int | None, int | None]:
    """``(send_to, receive_from)`` of ``member`` (a place in the group) when every member sends ``offset`` steps
    along an axis of ``size`` (around the ends with ``wrap``; off the ends, nobody, without); ``TypeError`` unless
    ``offset`` is an int.

    >>> shift_peers(0, 4, -1, wrap=False), shift_peers(0, 4, -1, wrap=True)
    ((None, 1), (3, 1))
    """
    if not is_int(offset):
        raise TypeError(f"shift: expected an int offset (steps along the axis), but got {offset!r}")
    steps = int(offset)

    def along(coordinate: int) -> int | None:
        if wrap:
            return coordinate % size
        return coordinate if 0 <= coordinate < size else None

    return along(member + steps), along(member - steps)


def permute(route: Route, tensor: torch.Tensor, send_to: int | None, receive_from: int | None) -> torch.Tensor:
    """Send ``tensor`` to member ``send_to`` and return what member ``receive_from`` sent (zeros when
    nobody sends here), in one batch of point-to-point operations on ``group``.

    Inside ``torch.compile`` it is one ``all_to_all`` with uneven splits instead (what torch's own
    ``permute_tensor`` does): Dynamo traces that with no switch, while it traces point-to-point only under
    ``torch._dynamo.config.enable_p2p_compilation`` (torch 2.13 and later, experimental). Every member of the
    group takes part in it, as every member calls ``ppermute``.
    """
    target, process_group = route.target, route.group
    if process_group is not None and compiling():
        return _traced_permute(target, process_group, tensor, send_to, receive_from)
    if receive_from == target.member:  # a pair (i, i): this member keeps its own
        return tensor.clone()
    received = torch.zeros_like(tensor, memory_format=torch.contiguous_format)
    operations = []
    if send_to is not None:
        operations.append(dist.P2POp(dist.isend, tensor.contiguous(), target.ranks[send_to], process_group))
    if receive_from is not None:
        operations.append(dist.P2POp(dist.irecv, received, target.ranks[receive_from], process_group))
    if operations:
        # The group's own timeout, given to each wait: gloo's send and receive otherwise keep the timeout the group
        # was connected under (the creation timeout, shorter), and would call a peer lost that is only late.
        timeout = target.spec.timeout
        run("ppermute", route, lambda: [work.wait(timeout) for work in dist.batch_isend_irecv(operations)])
    return received


def _traced_permute(target: Target, process_group: dist.ProcessGroup, tensor: torch.Tensor, send_to: int | None,
                    receive_from: int | None) -> torch.Tensor:
    """:func:`permute` as an ``all_to_all`` of the flattened tensor: ``numel`` elements to ``send_to``, from
    ``receive_from``, none to or from anyone else."""
    numel = tensor.numel()
    input_splits, output_splits = [0] * target.size, [0] * target.size
    if send_to is not None:
        input_splits[send_to] = numel
    if receive_from is not None:
        output_splits[receive_from] = numel
    sent = tensor.reshape(-1) if send_to is not None else tensor.reshape(-1)[:0]
    received = _torch.traced_all_to_all(sent.contiguous(), output_splits, input_splits, process_group)
    if receive_from is None:
        return torch.zeros_like(tensor, memory_format=torch.contiguous_format)
    return received.reshape(tensor.shape)
