"""NCCL's rules on CPU, by default (``FMESH_STRICT_NCCL=0`` turns them off): the c10d calls fmesh makes refuse
what ProcessGroupNCCL refuses, with NCCL's messages: a non-contiguous tensor ("Tensors must be contiguous"), a
sparse one ("Tensors must be CUDA and dense"), a tensor on a device other than the group's, and a dtype NCCL lacks.
gloo checks none of these, so without this a test on CPU passes what a GPU job refuses.

Installed by ``tests/conftest.py`` for the test session and by ``tests/support.py`` in every process the
multi-process tests start (they import it), so the rules hold on every rank. The patching lives here, in the
tests, never in fmesh's runtime path.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

ENV = "FMESH_STRICT_NCCL"
# ProcessGroupNCCL's getNcclDataType: the dtypes with an NCCL type (bool travels as uint8).
NCCL_DTYPES = frozenset({torch.int8, torch.uint8, torch.int32, torch.int64, torch.uint32, torch.uint64, torch.float16,
                         torch.float32, torch.float64, torch.bfloat16, torch.bool, torch.float8_e5m2,
                         torch.float8_e4m3fn})
# The c10d calls that hand a complex tensor to the backend as its real pairs (distributed_c10d.py: broadcast, all_reduce
# (for SUM, AVG and PREMUL_SUM; it raises ValueError itself for the other ops), all_gather_into_tensor,
# all_to_all_single, isend/irecv: ``torch.view_as_real``), so real NCCL sees float32/float64 and accepts them. The
# rest (reduce_scatter_tensor) pass the complex tensor on, and getNcclDataType refuses it.
AS_REAL_PAIRS = frozenset({"all_reduce", "broadcast", "all_gather_into_tensor", "all_gather_single",
                           "all_to_all_single", "P2POp"})
PATCHED = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
           "all_gather_single", "reduce_scatter_single")  # point-to-point: through P2POp (patches)


def enabled() -> bool:
    """Whether this process runs under NCCL's rules: yes, unless ``FMESH_STRICT_NCCL=0`` (gloo's own leniency, to
    see what a CPU-only job would let through)."""
    return os.environ.get(ENV, "1") != "0"


def check(tensor: torch.Tensor, group: Any = None, call: str = "") -> None:
    """Refuse ``tensor`` as ProcessGroupNCCL would, with its messages, when ``call`` (a c10d function's name) hands it
    to the backend (a complex tensor travels as real pairs where ``call`` is one of :data:`AS_REAL_PAIRS`).

    >>> check(torch.ones(2, 3).t())
    Traceback (most recent call last):
    ...
    ValueError: Tensors must be contiguous
    >>> check(torch.ones(2, dtype=torch.complex64), call="all_reduce")  # NCCL sees float32 pairs
    >>> check(torch.ones(2, dtype=torch.complex64), call="reduce_scatter_tensor")
    Traceback (most recent call last):
    ...
    TypeError: Unsupported data type for NCCL process group: torch.complex64
    """
    if tensor.layout != torch.strided:
        raise ValueError("Tensors must be CUDA and dense")
    if not tensor.is_contiguous():
        raise ValueError("Tensors must be contiguous")
    dtype = torch.view_as_real(tensor).dtype if tensor.is_complex() and call in AS_REAL_PAIRS else tensor.dtype
    if dtype not in NCCL_DTYPES:
        raise TypeError(f"Unsupported data type for NCCL process group: {tensor.dtype}")
    devices = _group_devices(group)
    if devices and tensor.device.type not in devices:
        raise ValueError(f"Tensors must be on the group's device ({sorted(devices)}), but got {tensor.device}")


def _group_devices(group: Any) -> set[str]:
    with_default = group if group is not None else (dist.group.WORLD if dist.is_initialized() else None)
    if with_default is None:
        return set()
    try:
        backend = dist.get_backend(with_default)
    except (RuntimeError, ValueError):
        return set()
    return {"cuda"} if backend == "nccl" else {"cpu"} if backend == "gloo" else set()


def _tensors(args: Iterable[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    found = [a for a in args if isinstance(a, torch.Tensor)]
    found += [v for k, v in kwargs.items() if isinstance(v, torch.Tensor) and k != "group"]
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, list | tuple):
            found += [t for t in value if isinstance(t, torch.Tensor)]
    return found


def strict(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call``, refusing first what NCCL refuses in any tensor it is given."""
    if getattr(call, "fmesh_strict", False):
        return call

    name = getattr(call, "__name__", "")

    @functools.wraps(call)
    def checked(*args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group")
        for tensor in _tensors(args, kwargs):
            check(tensor, group, name)
        return call(*args, **kwargs)

    checked.fmesh_strict = True  # type: ignore[attr-defined]
    return checked


def patches() -> list[tuple[Any, str, Any]]:
    """``(owner, name, strict replacement)`` for each c10d call fmesh makes (``dist``'s, the ones ``_torch`` bound
    at its import, and ``P2POp``'s constructor, which ``batch_isend_irecv`` takes its tensors from)."""
    from fmesh.context import _torch  # bound to torch's functions at its import: patched there too

    found = [(dist, name, strict(getattr(dist, name))) for name in PATCHED if hasattr(dist, name)]
    found += [(_torch, name, strict(getattr(_torch, name))) for name in ("all_gather_single", "reduce_scatter_single")]
    op_init = dist.P2POp.__init__
    if not getattr(op_init, "fmesh_strict", False):
        def init(self: Any, op: Any, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            check(tensor, kwargs.get("group", args[1] if len(args) > 1 else None), "P2POp")
            op_init(self, op, tensor, *args, **kwargs)

        init.fmesh_strict = True  # type: ignore[attr-defined]
        found.append((dist.P2POp, "__init__", init))
    return found


def install() -> None:
    """Put NCCL's rules on the c10d calls for good, when :func:`enabled`; idempotent."""
    if enabled():
        for owner, name, replacement in patches():
            setattr(owner, name, replacement)
