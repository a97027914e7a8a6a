"""Picklable Python objects along mesh axes: they travel as byte tensors on the context's device.

Each collective moves the sizes first, then the bytes padded to the largest size, so it works on
every backend that moves tensors (gloo on the CPU, NCCL on the GPU). A member whose object cannot be
pickled still takes part: it sends a negative size, ``-(len(reason) + 1)``, and the text of its
error in place of the bytes, so every member learns of the failure from the same two collectives and
raises :class:`~fmesh.errors.UnpicklableObjectError` naming the members that failed. Nobody waits for a
member that gave up. Unpickling can fail too, on some members only (a class whose module one rank lacks): the
members then tell each other whether they could load what arrived (one more gather of sizes, a few bytes), so that
every member raises the same error, naming the members that could not, or none does.

>>> import threading
>>> size, payload = pickled(threading.Lock())
>>> size, payload
(-47, b"TypeError: cannot pickle '_thread.lock' object")
>>> length(size) == len(payload)
True
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import torch
import torch.distributed as dist

from fmesh.context import _torch
from fmesh.context.collectives import run
from fmesh.context.groups import Route, Target
from fmesh.errors import UnpicklableObjectError


def pickled(obj: object) -> tuple[int, bytes]:
    """``(size, bytes)`` of ``obj``; for an object that cannot be pickled, a negative size and the
    error's text (:func:`length` reads either).

    >>> pickled(3)[0] > 0
    True
    """
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        reason = f"{type(error).__name__}: {error}".encode()
        return -(len(reason) + 1), reason
    return len(data), data


def length(size: int) -> int:
    """The number of bytes a member sends for ``size`` (the bytes of its object, or of its error).

    >>> length(5), length(-6)
    (5, 5)
    """
    return size if size >= 0 else -size - 1


def _bytes_tensor(payload: bytes, width: int, device: torch.device) -> torch.Tensor:
    padded = bytearray(width)
    padded[: len(payload)] = payload
    return torch.frombuffer(padded, dtype=torch.uint8).to(device) if width else torch.empty(0, dtype=torch.uint8,
                                                                                               device=device)


def _refuse(what: str, target: Target, members: Sequence[tuple[int, bytes]]) -> UnpicklableObjectError:
    """The error every member raises when the objects of ``members`` (group member, reason) failed."""
    said = "; ".join(f"member {member} (rank {target.ranks[member]}): {reason.decode(errors='replace')}"
                     for member, reason in members[:8])
    more = f" and {len(members) - 8} more" if len(members) > 8 else ""
    return UnpicklableObjectError(
        f"{what} along {target.label()}: expected a picklable object from every member, but {said}{more}. "
        "Pass plain data (numbers, strings, containers, module-level classes), not locks, open files or lambdas")


def alone(what: str, target: Target, obj: object) -> object:
    """``obj`` as another member would receive it (a pickled copy): a group of one, or a dry run."""
    size, payload = pickled(obj)
    if size < 0:
        raise _refuse(what, target, [(target.member, payload)])
    return pickle.loads(payload)


def _gathered(what: str, route: Route, size: int, payload: bytes, device: torch.device) -> tuple[list[int],
                                                                                                   list[bytes]]:
    """Every member's ``size`` and ``payload`` (its :func:`pickled` form), in group order: the sizes first, then the
    bytes padded to the longest."""
    target, process_group = route.target, route.group
    sizes = torch.empty(target.size, dtype=torch.int64, device=device)
    mine = torch.tensor([size], dtype=torch.int64).to(device)
    run(what, route, lambda: _torch.all_gather_single(sizes, mine, group=process_group))
    every = sizes.tolist()
    width = max(length(s) for s in every)
    if width == 0:
        return every, [b"" for _ in every]
    gathered = torch.empty(target.size * width, dtype=torch.uint8, device=device)
    sent = _bytes_tensor(payload, width, device)
    run(what, route, lambda: _torch.all_gather_single(gathered, sent, group=process_group))
    raw = memoryview(gathered.cpu().numpy())
    return every, [bytes(raw[i * width : i * width + length(s)]) for i, s in enumerate(every)]


def _loaded(what: str, route: Route, parts: Sequence[bytes], device: torch.device) -> list[object]:
    """``parts`` unpickled on every member, or one :class:`~fmesh.errors.UnpicklableObjectError` on every member
    naming those that could not (their reason): the members tell each other how it went (:func:`_gathered`)."""
    try:
        loaded, reason = [pickle.loads(part) for part in parts], b""
    except Exception as error:  # a class or module this member lacks, a corrupt payload: its own reason
        loaded, reason = [], f"{type(error).__name__}: {error}".encode()
    every, reasons = _gathered(what, route, len(reason), reason, device)
    failed = [(i, why) for i, (size, why) in enumerate(zip(every, reasons, strict=True)) if size > 0]
    if failed:
        target = route.target
        said = "; ".join(f"member {member} (rank {target.ranks[member]}): {why.decode(errors='replace')}"
                         for member, why in failed[:8])
        raise UnpicklableObjectError(
            f"{what} along {target.label()}: the objects were sent, but {said} could not unpickle what arrived. "
            "Expected every rank to import the modules and classes of the objects (the same code on every rank); "
            "send plain data (numbers, strings, containers)")
    return loaded


def all_gather_object(route: Route, obj: object, device: torch.device) -> list[object]:
    """Every member's ``obj``, unpickled, in group order."""
    size, payload = pickled(obj)
    every, parts = _gathered("all_gather_object", route, size, payload, device)
    failed = [(i, part) for i, (s, part) in enumerate(zip(every, parts, strict=True)) if s < 0]
    if failed:
        raise _refuse("all_gather_object", route.target, failed)
    return _loaded("all_gather_object", route, parts, device)


def broadcast_object(route: Route, obj: object, src: int, device: torch.device) -> object:
    """Member ``src``'s ``obj`` on every member (``obj`` itself on ``src``); ``src`` checked by the caller."""
    target, process_group = route.target, route.group
    source = target.ranks[src]
    size, payload = pickled(obj) if target.member == src else (0, b"")
    sizes = torch.tensor([size], dtype=torch.int64).to(device)
    run("broadcast_object", route, lambda: dist.broadcast(sizes, src=source, group=process_group))
    size = int(sizes.item())
    data = _bytes_tensor(payload, length(size), device)
    run("broadcast_object", route, lambda: dist.broadcast(data, src=source, group=process_group))
    if size < 0:
        raise _refuse("broadcast_object", target, [(src, bytes(data.cpu().numpy()))])
    arrived = [] if target.member == src else [bytes(data.cpu().numpy())]
    loaded = _loaded("broadcast_object", route, arrived, device)
    return obj if target.member == src else loaded[0]
