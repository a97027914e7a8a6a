"""GPUs and the links between them: peak FLOP/s, memory, and :class:`~fmesh.plan.costs.Links` per node kind.

Every figure is the vendor's peak (dense bf16 tensor-core FLOP/s, HBM capacity, NVLink and NIC bandwidth each
way); what a job reaches is a fraction of it, which :class:`~fmesh.plan.model.Options` states
(``efficiency``) and :mod:`fmesh.plan.costs` documents for the links. Latencies are NCCL's
(:data:`fmesh.plan.costs.H100_IB`).

* **A100** (the validation's, Korthikanti et al. 2022 ran on Selene's DGX A100 nodes): 312 TFLOP/s bf16 dense, no FP8
  (NVIDIA A100 datasheet), 80 GB HBM2e at 2,039 GB/s, NVLink 3 at 600 GB/s both ways (300 GB/s each way), eight
  200 Gb/s HDR InfiniBand NICs per node, one per GPU: 25 GB/s each way (DGX A100 user guide).
* **H100** SXM: 989 TFLOP/s bf16 dense (H100 datasheet: 1,979 with sparsity), 1,979 FP8 dense (3,958 with
  sparsity), 80 GB HBM3 at 3.35 TB/s, NVLink 4 at
  900 GB/s both ways, one 400 Gb/s NDR NIC per GPU (DGX H100 user guide): :data:`fmesh.plan.costs.H100_IB`.
* **H200** SXM: the H100's compute and links (H200 datasheet: 989 TFLOP/s bf16 dense, 1,979 FP8), 141 GB HBM3e at
  4.8 TB/s.
* **B200**: 2.25 PFLOP/s bf16 dense (HGX B200 datasheet: 4.5 PFLOP/s with sparsity), 4.5 PFLOP/s FP8 dense, 180 GB
  HBM3e per GPU at 8 TB/s (DGX B200: 1,440 GB for 8), NVLink 5 at 1.8 TB/s both ways (900 GB/s each way), eight
  400 Gb/s ConnectX-7 NICs per node (DGX B200 user guide).

**Memory** is what one process can allocate, in GiB (2^30 bytes), not the datasheet's "80 GB": the total
``torch.cuda.get_device_properties(i).total_memory`` reports (torch's out-of-memory message prints it as "GPU 0
has a total capacity of 79.11 GiB"), which is ``nvidia-smi``'s ``memory.total`` less what the driver reserves.
The figures, as torch prints them on each GPU (they move by about 0.1 GiB with the driver and ECC setting):

* A100 SXM4 80GB: 79.15 GiB (``nvidia-smi``: 81,920 MiB = 80 GiB);
* H100 SXM 80GB HBM3: 79.11 GiB (``nvidia-smi``: 81,559 MiB = 79.6 GiB; the datasheet's "80GB");
* H200 SXM: 139.80 GiB (``nvidia-smi``: 143,771 MiB = 140.4 GiB; the datasheet's "141GB");
* B200: 178.35 GiB (``nvidia-smi``: 183,359 MiB = 179.1 GiB; the datasheet's "180GB").

The CUDA context (a few hundred MiB) and the allocator's fragmentation come out of it too; the planner does
not model them, so a plan within a GiB of the figure is tight.

>>> hardware("h100").flops, hardware("a100").links.intra_bandwidth
(989000000000000.0, 300000000000.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import attrs

from fmesh.plan.costs import H100_IB, Links

__all__ = ["HARDWARE", "Hardware", "hardware"]


@attrs.frozen
class Hardware:
    """One kind of GPU node: peak dense bf16 FLOP/s per GPU (and FP8's; 0: no FP8 tensor cores), memory per GPU
    (bytes a process can allocate: the module docstring) and its bandwidth (bytes per second), GPUs per node, links.

    >>> Hardware("x", flops=1e15, memory=80 * 2**30).gpus_per_node
    8
    """

    name: str
    flops: float = attrs.field(kw_only=True)
    memory: int = attrs.field(kw_only=True)
    memory_bandwidth: float = attrs.field(default=3.35e12, kw_only=True)
    fp8_flops: float = attrs.field(default=0.0, kw_only=True)
    gpus_per_node: int = attrs.field(default=8, kw_only=True)
    links: Links = attrs.field(default=H100_IB, kw_only=True)


_NVLINK4_NDR = H100_IB


def _gib(figure: float) -> int:
    """Bytes of ``figure`` GiB (as torch prints a device's total memory, to two decimals)."""
    return round(figure * 2**30)


HARDWARE: Mapping[str, Hardware] = MappingProxyType({
    "a100": Hardware("A100 SXM 80GB (DGX A100: NVLink 3, 8 x 200 Gb/s HDR IB)", flops=312e12, memory=_gib(79.15),
                     memory_bandwidth=2.039e12,
                     links=attrs.evolve(H100_IB, intra_bandwidth=300e9, inter_bandwidth=25e9,
                                        name="A100 SXM: NVLink 3 (300 GB/s each way) + one 200 Gb/s IB HDR NIC "
                                             "per GPU")),
    "h100": Hardware("H100 SXM 80GB (DGX H100: NVLink 4, 8 x 400 Gb/s NDR IB)", flops=989e12, memory=_gib(79.11),
                     fp8_flops=1979e12, links=_NVLINK4_NDR),
    "h200": Hardware("H200 SXM 141GB (HGX H200: NVLink 4, 8 x 400 Gb/s NDR IB)", flops=989e12, memory=_gib(139.80),
                     memory_bandwidth=4.8e12, fp8_flops=1979e12,
                     links=_NVLINK4_NDR),
    "b200": Hardware("B200 180GB (DGX B200: NVLink 5, 8 x 400 Gb/s NDR IB)", flops=2250e12, memory=_gib(178.35),
                     memory_bandwidth=8e12, fp8_flops=4500e12,
                     links=attrs.evolve(H100_IB, intra_bandwidth=900e9,
                                        name="B200: NVLink 5 (900 GB/s each way) + one 400 Gb/s IB NDR NIC per GPU")),
})
"""The node kinds by name (the module docstring gives each figure's source)."""


def hardware(name: str) -> Hardware:
    """The node kind ``name`` (one of :data:`HARDWARE`).

    >>> hardware("b200").memory, round(hardware("h100").memory / 2**30, 2)
    (191501854310, 79.11)
    >>> hardware("v100")
    Traceback (most recent call last):
    ...
    KeyError: "expected hardware among ('a100', 'h100', 'h200', 'b200'), but got 'v100'"
    """
    if name not in HARDWARE:
        raise KeyError(f"expected hardware among {tuple(HARDWARE)}, but got {name!r}")
    return HARDWARE[name]
