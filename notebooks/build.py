"""Write the notebooks from their cells and run them, so they are committed with fresh outputs.

    python notebooks/build.py            # rebuild and execute all four
    python notebooks/build.py 04_sharded_computation.ipynb   # only the ones named
    python notebooks/build.py --check    # execute the committed ones, fail on any error

The cells live here, in one place; ``tests/system/test_notebooks.py`` runs the committed notebooks.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import nbformat
from nbclient import NotebookClient

HERE = pathlib.Path(__file__).resolve().parent

TOUR = [
    ("md", """# A tour of the fmesh algebra

A `Mesh` is a value: a universe of ranks and one layout per named axis. Every operation is a pure
function that returns a new mesh and costs microseconds at any world size. Each step below is shown
beside the same step with `torch.distributed.DeviceMesh`, on torch's fake backend (one process, no
devices), to show that the groups agree."""),
    ("code", """import warnings

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import fmesh
from fmesh.context import device_mesh_groups

warnings.filterwarnings("ignore")
dist.init_process_group("fake", rank=0, world_size=16)   # only for the DeviceMesh column


def torch_groups(dm, dim=0):  # every group torch makes along a dim (of any torch release)
    return sorted(device_mesh_groups(dm, [dim]))"""),
    ("md", "## Build\n`make_mesh` is row-major like `init_device_mesh`; no process group is created."),
    ("code", """mesh = fmesh.make_mesh((2, 2, 4), ("dp", "cp", "tp"))
dm = init_device_mesh("cpu", (2, 2, 4), mesh_dim_names=("dp", "cp", "tp"))
print(mesh)
print(dm)
print(fmesh.render(mesh, highlight="tp"))"""),
    ("md", "The HTML view colours the groups along an axis (hover a cell for its coordinates):"),
    ("code", "mesh"),
    ("md", "## Slice\nAny subset, in any order. `DeviceMesh` accepts only ascending order."),
    ("code", """print(fmesh.slice(mesh, "tp", "dp"), fmesh.slice(mesh, "tp", "dp").ranks(0).tolist())
try:
    dm["tp", "dp"]
except KeyError as error:
    print("DeviceMesh:", error)
print(sorted(mesh.groups("cp")) == torch_groups(dm["cp"]))"""),
    ("md", "## Flatten\nAny axes, adjacent or not, in the order given; the other axes stay."),
    ("code", """dp_tp = fmesh.flatten(mesh, ("dp", "tp"), "dp_tp")
print(dp_tp, dp_tp.group(0, "dp_tp"))
print(sorted(dp_tp.groups("dp_tp")) == torch_groups(dm["dp", "tp"]._flatten("dp_tp")))
print(fmesh.render(dp_tp, highlight="dp_tp"))"""),
    ("md", """## Unflatten
Split any axis by sizes that multiply to its size. torch fails an internal assertion when the split
cuts a flattened, strided axis unevenly; fmesh re-indexes the universe and carries on."""),
    ("code", """world12 = fmesh.make_mesh((3, 2, 2), ("a", "b", "c"))
ac = fmesh.slice(fmesh.flatten(world12, ("a", "c"), "ac"), "ac")
split = fmesh.unflatten(ac, "ac", {"p": 2, "q": 3})
print(split, "q groups:", split.groups("q"))
dist.destroy_process_group()
dist.init_process_group("fake", rank=0, world_size=12)
dm12 = init_device_mesh("cpu", (3, 2, 2), mesh_dim_names=("a", "b", "c"))
try:
    dm12["a", "c"]._flatten("ac")._unflatten(0, (2, 3), ("p", "q"))
except AssertionError:
    print("DeviceMesh: AssertionError")"""),
    ("md", "## Concatenate, rename, select"),
    ("code", """print(fmesh.concat(mesh["tp"], mesh["dp"]))
print(fmesh.rename(mesh, {"dp": "fsdp"}))
stage = fmesh.select(mesh, dp=1)          # the ranks of one coordinate, without that axis
print(stage, stage.ranks().tolist())
try:
    fmesh.concat(mesh["tp"], dp_tp["dp_tp"])
except ValueError as error:
    print(error)"""),
    ("md", "## A million ranks\nThe cost does not grow with the world size: queries are digit arithmetic."),
    ("code", """import time

start = time.perf_counter()
big = fmesh.make_mesh((8, 16, 256, 2, 16), ("pp", "dp_replicate", "dp_shard", "cp", "tp"))
fsdp = fmesh.flatten(big, ("dp_shard", "cp"), "fsdp")
group = fsdp.group(654_321, "tp")
print(big, group, f"{(time.perf_counter() - start) * 1e3:.2f} ms")
big"""),
    ("code", "dist.destroy_process_group()"),
]

PLANNING = [
    ("md", """# Planning a real job

4096 GPUs, 8 per host, with tensor parallelism 8, context parallelism 2, pipeline parallelism 4 and expert
parallelism 8. Everything here is pure: no process group, no GPU."""),
    ("code", """import fmesh
from fmesh.plan.job_table import format_plan
from fmesh.plan.jobs import build_plan

dims = fmesh.ParallelDims(4096, pp=4, cp=2, tp=8, ep=8)
dims"""),
    ("code", """print(dims.world_mesh)
for name, mesh in dims.meshes().items():
    print(f"{name:<14} {mesh!r:<60} rank 0's group: {mesh.group(0)[:8]}{'...' if mesh.size > 8 else ''}")"""),
    ("md", "## Which axes cross hosts?"),
    ("code", """topology = fmesh.Topology(hosts=512, ranks_per_host=8)
for span in topology.spans(dims.meshes()).values():
    print(span)
print(fmesh.plan.topology.check_placement(topology.spans(dims.meshes())) or "no placement warnings")"""),
    ("md", "The same plan as `python -m fmesh plan` prints it:"),
    ("code", """print(format_plan(build_plan(4096, 8, pp=4, cp=2, tp=8, ep=8)))"""),
    ("md", """## A bad placement, caught before launch
With the ranks of a host spread cyclically (rank r on host r % 512), tp groups cross hosts while the
cheaper pp axis stays inside one: the check warns."""),
    ("code", """cyclic = fmesh.Topology(hosts=512, ranks_per_host=8, rank_order="cyclic")
print("\\n".join(fmesh.plan.topology.check_placement(cyclic.spans(dims.meshes()))))"""),
    ("md", "## Pictures\nThe world mesh is far too big to draw cell by cell; the views summarise it."),
    ("code", """print(fmesh.render(dims.mesh("tp")["tp"], highlight="tp"))
fmesh.slice(dims.world_mesh, "dp_shard", "cp", "tp")"""),
    ("code", """dims.expert_mesh"""),
    ("md", "## What FSDP gets\n`fsdp_mesh()` is the 1-D shard mesh, or (dp_replicate, dp_shard_cp) for HSDP."),
    ("code", """print(dims.fsdp_mesh(), fmesh.ParallelDims(4096, dp_replicate=2, pp=4, cp=2, tp=8).fsdp_mesh())"""),
    ("md", """## The communicators, before launch
The manifest lists every distinct communicator layout the job creates, in the order the Context creates them,
with the GPU memory NCCL's buffers will take on each rank (`python -m fmesh plan ... --manifest job.json`
writes the same JSON)."""),
    ("code", """import json

from fmesh.plan.diff_table import format_diff
from fmesh.plan.manifest import plan_manifest
from fmesh.plan.manifest_diff import compare
from fmesh.plan.manifest_table import format_manifest

manifest = plan_manifest(4096, 8, pp=4, cp=2, tp=8, ep=8)
print(format_manifest(manifest))
print(len(json.dumps(manifest.to_json())), "bytes of JSON")"""),
    ("md", """## What changes if tp goes from 8 to 4
A diff of two plans (`python -m fmesh diff job.json "--world-size 4096 --gpus-per-node 8 --tp 4 ..."`): the
communicators both share, those added and removed, and the axes along which ranks change group: what a resumed
checkpoint or a mid-run change of degrees has to reshard."""),
    ("code", """print(format_diff(compare(manifest, plan_manifest(4096, 8, pp=4, cp=2, tp=4, ep=8))))"""),
    ("md", """## What each axis costs
`fmesh.cost` times one collective from the links its groups really cross: H100 NVLink inside a host, one
400 Gb/s InfiniBand NIC per GPU between hosts (override with `links=`). With block order, tp stays on NVLink;
with the cyclic order above, every tp all_reduce goes over the network."""),
    ("code", """nbytes = 256 * 2**20
for name, collective in [("tp", "all_reduce"), ("cp", "all_gather"), ("ep", "all_to_all"),
                         ("dp_shard_cp", "reduce_scatter"), ("pp", "send")]:
    mesh = dims.mesh(name)
    block = fmesh.cost(mesh, name, collective, nbytes, topology)
    spread = fmesh.cost(mesh, name, collective, nbytes, cyclic)
    print(f"{name:<12} {collective:<15} block {block * 1e3:8.2f} ms   cyclic {spread * 1e3:8.2f} ms")"""),
    ("md", """## A 70B model on these 4,096 GPUs, laid out by the search
Until now the degrees were given. With a model, the planner chooses them: every degree set, micro-batch and rank
order for 4,096 GPUs of 8 per node, kept if it fits in an H100's memory with the least recomputation, ranked by
estimated step time
(`python -m fmesh plan --model llama3-70b --world-size 4096 --gpus-per-node 8 --search --lose 5,9`)."""),
    ("code", """from fmesh.plan.hardware import hardware
from fmesh.plan.model import Options, preset
from fmesh.plan.model_plan import plan_model
from fmesh.plan.model_table import format_model_plan

plan70 = plan_model(preset("llama3-70b"), Options(), hardware("h100"), 4096, 8, lose=[5, 9])
print(format_model_plan(plan70))"""),
    ("md", """The bytes each axis moves per step, drawn on the job's mesh (one picture per axis, its groups coloured;
thick lines are host boundaries). Losing two GPUs drops the `dp_replicate` slice that held them: 254 healthy GPUs
idle, and the 960 data-parallel ranks left cannot share the 1,024 sequences evenly, so each keeps its micro-batch
and the job trains on 960 per step: the same step time, 6.2% fewer sequences per second (the last lines above
say what the smaller job assumes, and that its memory fits)."""),
    ("code", """from IPython.display import HTML

from fmesh.rendering import traffic_html

HTML(traffic_html(plan70.dims, plan70.moved, fmesh.Topology(512, 8)))"""),
    ("md", """## What a schedule, ZeRO or FP8 would change
The training options are values too. For a pipelined layout of the same model (pp 4, tp 8 in a node, HSDP 16 x 8,
selective recomputation), the zero-bubble ZB-H1 schedule idles a third of 1F1B's bubble with the same memory;
ZeRO-1 keeps the weights and gradients whole but drops FSDP's unsharded copies of the stage (under a pipeline
FSDP holds both); FP8 runs the layers' linear layers at the H100's FP8 peak and gathers their weights in one byte
(`python -m fmesh plan --model llama3-70b ... --pipeline-schedule zb-h1`, `--zero 1`, `--fp8`)."""),
    ("code", """import attrs

from fmesh.plan.costs import format_bytes
from fmesh.plan.memory import memory, with_communicators
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.step import step_time

piped = ParallelDims(4096, pp=4, dp_replicate=16, dp_shard=8, tp=8)
base = Options(recompute="selective")
for label, options in [("as planned (FSDP, 1F1B, bf16)", base),
                       ("--pipeline-schedule zb-h1", attrs.evolve(base, pipeline_schedule="zb-h1")),
                       ("--zero 1", attrs.evolve(base, zero=1)), ("--fp8", attrs.evolve(base, fp8=True))]:
    t = step_time(preset("llama3-70b"), options, piped, hardware("h100"), fmesh.Topology(512, 8))
    used = with_communicators(memory(preset("llama3-70b"), options, piped), piped, 8)
    print(f"{label:<30} {t.total:5.2f} s per step, bubble {t.bubble:4.2f} s, {format_bytes(used.total)} per GPU")"""),
]

COLLECTIVES = [
    ("md", """# Collectives on simulated ranks

Two ways to run real collectives from a notebook on a CPU: `fmesh.simulate(n)` runs every rank at
once in this process (torch's `LocalTensorMode` over the fake backend), and `fmesh.launch(fn, n)`
starts n real gloo processes on loopback and brings every rank's result back."""),
    ("code", """import warnings

import torch

import fmesh

warnings.filterwarnings("ignore")
mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))
print(fmesh.render(mesh, highlight="tp"))"""),
    ("md", "## Every rank in one process"),
    ("code", """with fmesh.simulate(4) as sim:
    x = sim.per_rank(lambda rank: torch.tensor([float(rank)]))
    for axes in ("tp", "dp", ("dp", "tp")):
        total = sim.values(sim.ctx.all_reduce(x, mesh, axes))
        print(f"all_reduce along {axes!s:<14}", {rank: t.item() for rank, t in total.items()})
    gathered = sim.values(sim.ctx.all_gather(x, mesh, "dp"))
    print("all_gather along dp        ", {rank: t.tolist() for rank, t in gathered.items()})
    print(sim.ctx.stats())"""),
    ("md", "## DTensor on `ctx.device_mesh(...)`\nThe exported `DeviceMesh` runs on the context's own groups."),
    ("code", """from torch.distributed.tensor import Replicate, Shard, distribute_tensor

with fmesh.simulate(4) as sim:
    device_mesh = sim.ctx.device_mesh(mesh)
    full = torch.arange(16.0).reshape(4, 4)
    sharded = distribute_tensor(full, device_mesh, [Shard(0), Shard(1)])
    for rank, local in sim.values(sharded.to_local()).items():
        print(f"rank {rank} at {mesh.coordinate(rank)} holds {local.tolist()}")
    back = sharded.redistribute(device_mesh, [Replicate(), Replicate()]).to_local()
    print("replicated again on every rank:", all(torch.equal(t, full) for t in sim.values(back).values()))"""),
    ("md", "## Real processes\n`fn` may be defined right here; every rank's return value comes back."),
    ("code", """permuted = fmesh.make_mesh((2, 2), ("dp", "tp"), rank_map=[3, 0, 2, 1])

def step(ctx):
    tp_sum = ctx.all_reduce(torch.tensor([float(ctx.rank)]), permuted, "tp").item()
    gathered = ctx.all_gather(torch.tensor([ctx.rank]), permuted, ("dp", "tp")).tolist()
    return ctx.rank, permuted.group(ctx.rank, "tp"), tp_sum, gathered

for rank, group, tp_sum, gathered in fmesh.launch(step, world_size=4):
    print(f"rank {rank}: tp group {group} sums to {tp_sum}; all ranks in mesh order: {gathered}")"""),
    ("md", "A failing rank raises its own exception here, with its traceback:"),
    ("code", """def fails(ctx):
    if ctx.rank == 1:
        raise ValueError("rank 1 got a bad batch")
    return ctx.rank

try:
    fmesh.launch(fails, world_size=2)
except ValueError as error:
    print(f"{error!r} from rank {error.rank}")
    print(str(error.__cause__).splitlines()[0])"""),
    ("md", """## What training code asks a communicator for

Group indices (`ctx.index`: a rank's `dp_rank` or `tp_rank`), picklable objects (`all_gather_object`,
`broadcast_object`) and JAX's collective permute (`ppermute`, and `shift` for pipeline neighbours). On simulated
ranks every rank runs this one Python program, so an object is the same on all of them (the dry-run answer), and
torch's `LocalTensorMode` has no point-to-point operations: `ppermute` and `shift` say so and run on launched
ranks below."""),
    ("code", """with fmesh.simulate(4) as sim:
    print("tp index of each rank:", {rank: mesh.group(rank, "tp").index(rank) for rank in range(4)},
          "| ctx.index(mesh, 'tp') on rank 0:", sim.ctx.index(mesh, "tp"))
    print("all_gather_object along tp:", sim.ctx.all_gather_object({"step": 10}, mesh, "tp"))
    try:
        sim.ctx.shift(sim.per_rank(lambda rank: torch.tensor([float(rank)])), mesh, "tp")
    except ValueError as error:
        print(error)"""),
    ("md", """On real processes each rank has its own objects. A 4-stage pipeline: every stage learns who the others
are, gets rank 0's config, and passes a tensor on to the next stage (`shift`), back around the ring
(`offset=-1, wrap=True`), or along any partial permutation (`ppermute`; a stage that receives nothing gets
zeros)."""),
    ("code", """pipeline = fmesh.make_mesh((4,), ("pp",), rank_map=[2, 0, 3, 1])   # stage s runs on rank_map[s]

def stages(ctx):
    stage = ctx.index(pipeline, "pp")
    everyone = ctx.all_gather_object({"rank": ctx.rank, "stage": stage}, pipeline, "pp")
    config = ctx.broadcast_object({"lr": 3e-4} if stage == 0 else None, pipeline, "pp", src=0)
    x = torch.tensor([10.0 * (stage + 1)])                       # stage s sends 10 (s + 1)
    forward = ctx.shift(x, pipeline, "pp")                        # to the next stage; stage 0 gets zeros
    backward = ctx.shift(x, pipeline, "pp", offset=-1, wrap=True)  # to the previous, around the ring
    swapped = ctx.ppermute(x, pipeline, "pp", [(0, 3), (3, 0)])    # stages 0 and 3 swap; 1 and 2 get zeros
    return stage, [o["rank"] for o in everyone], config, forward.item(), backward.item(), swapped.item()

for stage, ranks, config, forward, backward, swapped in sorted(fmesh.launch(stages, world_size=4)):
    print(f"stage {stage}: stages on ranks {ranks}, config {config}, "
          f"shift {forward:>4}, shift(-1, wrap) {backward:>4}, ppermute {swapped:>4}")"""),
    ("md", """A host-local collective: `Topology(...).mesh()` is `Mesh(host, local)` in the topology's rank order, so
the `"local"` groups are the hosts. Here 2 hosts of 2 ranks, with rank r on host r % 2:"""),
    ("code", """topology = fmesh.Topology(hosts=2, ranks_per_host=2, rank_order="cyclic")
hosts = topology.mesh()
print(hosts, "local groups:", hosts.groups("local"))

def host_sum(ctx):
    return ctx.rank, ctx.index(hosts, "local"), ctx.all_reduce(torch.tensor([float(ctx.rank)]), hosts, "local").item()

for rank, local_rank, total in fmesh.launch(host_sum, world_size=4):
    print(f"rank {rank}: local rank {local_rank}, sum over its host {total}")"""),
    ("md", "An object that cannot be pickled fails on every member of the group, naming the member, and nobody hangs:"),
    ("code", """import threading


def unpicklable(ctx):
    return ctx.all_gather_object(threading.Lock() if ctx.rank == 1 else ctx.rank, pipeline, "pp")

errors = fmesh.launch(unpicklable, world_size=4, return_exceptions=True)
print([type(error).__name__ for error in errors])
print(errors[0])"""),
]

SHARDED = [
    ("md", """# Sharded computation, the JAX way

For a JAX user: `fmesh.make_mesh` is `jax.make_mesh`, `P` is `PartitionSpec`, `Sharding` is `NamedSharding`,
`shard_map` is JAX's `shard_map`, and `check=True` (the default) is `check_vma`: every local value carries a type
per mesh axis, and a program whose gradient would be wrong raises `SpmdTypeError` in the forward pass. Storage
stays DTensor's: a global tensor is a `DTensor` on `ctx.device_mesh(mesh)`, there is no new array class.

This notebook writes a Megatron tensor- and sequence-parallel transformer block (attention and MLP) in
`shard_map` on a (dp=2, tp=2) mesh of 4 gloo processes, checks it against the same block in one process, seeds
one bug that the types catch in the forward pass, and draws the shardings."""),
    ("code", """import math
import warnings

import torch
import torch.nn.functional as F
from IPython.display import HTML, display
from torch.distributed.tensor import distribute_tensor

import fmesh
from fmesh.spmd import P, Sharding, shard_map, sharding_html, sharding_text, to_placements

warnings.filterwarnings("ignore")
mesh = fmesh.make_mesh((2, 2), ("dp", "tp"))   # jax.make_mesh((2, 2), ("dp", "tp"))
mesh"""),
    ("md", """## Specs
One entry per tensor dimension: an axis name, a tuple of axes, or `None` (not split), as in JAX. `partial=` names
axes along which the value is a pending sum (DTensor's `Partial`). A `Sharding` is a mesh and a spec; it knows each
rank's block, and converts to DTensor placements (one per mesh axis)."""),
    ("code", """for spec in (P("dp", None), P(None, "tp"), P(("dp", "tp")), P(), P(None, "tp", partial="dp")):
    sharding = Sharding(mesh, spec)
    print(f"{spec!r:<31} block of (8, 4): {sharding.local_shape((8, 4))!s:<8} "
          f"rank 3 holds {sharding.block(3, (8, 4))}   placements {to_placements(sharding)}")"""),
    ("md", """## Placing a tensor
`jax.device_put(x, NamedSharding(mesh, spec))` is DTensor's `distribute_tensor` with the sharding's placements, on
the mesh exported by a `Context`. Here on 4 simulated ranks in this process (`fmesh.simulate`, as in the
collectives notebook):"""),
    ("code", """with fmesh.simulate(4) as sim:
    full = torch.arange(8.0).reshape(4, 2)
    placed = distribute_tensor(full, sim.ctx.device_mesh(mesh), to_placements(Sharding(mesh, P("dp", None))))
    for rank, block in sim.values(placed.to_local()).items():
        print(f"rank {rank} at {mesh.coordinate(rank)} holds {block.tolist()}")"""),
    ("md", """## The block, in one process
A pre-LN transformer block: layer norm, attention, residual; layer norm, MLP, residual. Its loss and gradients
are what every sharded run below must reproduce (float64, so that the comparison is exact to rounding)."""),
    ("code", """B, S, H, HEADS, FFN = 4, 8, 8, 4, 16          # batch, sequence, hidden, heads, MLP width
SHAPES = {"ln1w": (H,), "ln1b": (H,), "wq": (H, H), "wk": (H, H), "wv": (H, H), "wo": (H, H), "bo": (H,),
          "ln2w": (H,), "ln2b": (H,), "w1": (FFN, H), "b1": (FFN,), "w2": (H, FFN), "b2": (H,)}
NAMES = tuple(SHAPES)
g = torch.Generator().manual_seed(0)
PARAMS = {k: torch.randn(s, generator=g, dtype=torch.float64) / math.sqrt(s[-1]) for k, s in SHAPES.items()}
PARAMS["ln1w"] += 1
PARAMS["ln2w"] += 1
X = torch.randn(B, S, H, generator=g, dtype=torch.float64)


def attention(x, wq, wk, wv, heads):          # heads: this rank's heads (all of them in one process)
    b, s, _ = x.shape
    q, k, v = (F.linear(x, w).view(b, s, heads, -1).transpose(1, 2) for w in (wq, wk, wv))
    scores = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(H // HEADS), dim=-1)
    return (scores @ v).transpose(1, 2).reshape(b, s, -1)


def block(x, p):
    h = F.layer_norm(x, (H,), p["ln1w"], p["ln1b"])
    x = x + F.linear(attention(h, p["wq"], p["wk"], p["wv"], HEADS), p["wo"], p["bo"])
    h = F.layer_norm(x, (H,), p["ln2w"], p["ln2b"])
    return x + F.linear(F.gelu(F.linear(h, p["w1"], p["b1"])), p["w2"], p["b2"])


params = {k: v.clone().requires_grad_() for k, v in PARAMS.items()}
reference_y = block(X, params)
reference_loss = (reference_y ** 2).mean()
reference_loss.backward()
REFERENCE = {"loss": reference_loss.item(), "y": reference_y.detach(), **{k: v.grad for k, v in params.items()}}
print(f"single process: loss {reference_loss.item():.6f}")"""),
    ("md", """## Its shardings
Megatron's tensor parallelism splits the column-parallel weights (`wq`, `wk`, `wv`, `w1`, and the bias `b1`) by
their output features over `tp`, so each `tp` member has its own heads and its own MLP columns, and the
row-parallel ones (`wo`, `w2`) by their input features: their products are pending sums over `tp`. Sequence
parallelism splits the activations between the blocks by the sequence over `tp` (and the batch over `dp`), so the
layer norms, the residuals and the biases `bo`, `b2` run on a `1/tp` slice of the sequence. The layer-norm
weights and those biases are whole on every rank."""),
    ("code", """SPECS = {"ln1w": P(), "ln1b": P(), "wq": P("tp", None), "wk": P("tp", None), "wv": P("tp", None),
         "wo": P(None, "tp"), "bo": P(), "ln2w": P(), "ln2b": P(), "w1": P("tp", None), "b1": P("tp"),
         "w2": P(None, "tp"), "b2": P()}
X_SPEC = P("dp", "tp", None)                  # batch over dp, sequence over tp, hidden whole
IN_SPECS = [X_SPEC] + [SPECS[k] for k in NAMES]
OUT_SPECS = (P(), X_SPEC)                     # the loss (everywhere the same), the block's output

print("x: the (batch, sequence) plane of", tuple(X.shape), "(hidden is whole)")
print(sharding_text(Sharding(mesh, P("dp", "tp")), (B, S)))
for k in ("wq", "wo", "b1", "ln1w"):
    print(f"\\n{k}:")
    print(sharding_text(Sharding(mesh, SPECS[k]), SHAPES[k]))"""),
    ("md", "The same pictures as notebook HTML, one colour per block:"),
    ("code", """display(HTML(sharding_html(Sharding(mesh, P("dp", "tp")), (B, S))))
for k in ("wq", "wo", "w1", "w2"):
    display(HTML(f"<b>{k}</b>" + sharding_html(Sharding(mesh, SPECS[k]), SHAPES[k])))"""),
    ("md", """## The block in `shard_map`
`f` receives `ax` (the axes and their collectives: `ax.psum(x, "tp")` is `lax.psum(x, "tp")`) and each rank's
blocks, and runs on every rank. Before each column-parallel part, `ax.all_gather(..., "tp", dim=1)` gathers the
whole sequence (its backward is a reduce-scatter); after each row-parallel part, `ax.psum_scatter(..., "tp",
dim=1)` sums the pending partial products and leaves each member its slice of the sequence (its backward is an
all_gather). Megatron's `g` and `g-bar` are these two calls.

The types ask one more thing: a weight that is whole on every rank but meets a value that differs between
ranks must say so, `ax.pvary(w, axes)`. Its backward sums the gradient over those axes: over `dp`, DDP's
all_reduce; over `tp`, the all_reduce of the layer norms' gradients that sequence parallelism needs (each `tp`
member saw only its slice of the sequence). JAX's `shard_map` inserts `pvary` itself; here it is written, and
forgetting it is an error (below)."""),
    ("code", """REPLICATED = ("ln1w", "ln1b", "bo", "ln2w", "ln2b", "b2")   # whole everywhere, meet sequence slices
TP_SPLIT = ("wq", "wk", "wv", "wo", "w1", "b1", "w2")          # split over tp, whole over dp


def tp_sp_block(ax, x, *weights, ln_axes=("dp", "tp")):
    p = dict(zip(NAMES, weights, strict=True))
    for k in REPLICATED:
        p[k] = ax.pvary(p[k], ln_axes if k.startswith("ln") else ("dp", "tp"))
    for k in TP_SPLIT:
        p[k] = ax.pvary(p[k], "dp")
    tp_heads = HEADS // ax.axis_size("tp")

    h = ax.all_gather(F.layer_norm(x, (H,), p["ln1w"], p["ln1b"]), "tp", dim=1)  # (b, s/tp, H) -> (b, s, H)
    a = F.linear(attention(h, p["wq"], p["wk"], p["wv"], tp_heads), p["wo"])       # partial over tp
    x = x + ax.psum_scatter(a, "tp", dim=1) + p["bo"]                              # summed, (b, s/tp, H)

    h = ax.all_gather(F.layer_norm(x, (H,), p["ln2w"], p["ln2b"]), "tp", dim=1)
    m = F.linear(F.gelu(F.linear(h, p["w1"], p["b1"])), p["w2"])                   # partial over tp
    y = x + ax.psum_scatter(m, "tp", dim=1) + p["b2"]

    loss = ax.psum((y ** 2).sum() / (B * S * H), ("dp", "tp"))                     # the mean over everything
    return loss, y


def train_step(ctx, f, check=True):
    # Global tensors in (DTensors placed by the specs), global tensors out; the gradients are DTensors too.
    device_mesh = ctx.device_mesh(mesh)
    x, *weights = (distribute_tensor(value, device_mesh, to_placements(Sharding(mesh, spec)))
                   for value, spec in zip([X] + [PARAMS[k] for k in NAMES], IN_SPECS, strict=True))
    for w in weights:
        w.requires_grad_()
    ctx.barrier(mesh, ("dp", "tp"))  # all placed: a rank that raises below then leaves no peer mid-placement
    loss, y = shard_map(f, mesh=mesh, ctx=ctx, in_specs=IN_SPECS, out_specs=OUT_SPECS, check=check,
                        names=("x", *NAMES))(x, *weights)
    loss.to_local().backward()
    return {"rank": ctx.rank, "loss": loss.to_local().item(), "y": y.full_tensor().detach(),
            **{k: w.grad.full_tensor() for k, w in zip(NAMES, weights, strict=True)}}


def differences(result):  # the largest |sharded - single process| of the loss, the output and each gradient
    return {k: abs(result["loss"] - REFERENCE["loss"]) if k == "loss" else
            (result[k] - REFERENCE[k]).abs().max().item() for k in REFERENCE}


results = fmesh.launch(lambda ctx: train_step(ctx, tp_sp_block), world_size=4)
for result in results:
    worst = differences(result)
    print(f"rank {result['rank']}: loss {result['loss']:.6f}, max |difference| loss {worst.pop('loss'):.1e}, "
          f"output {worst.pop('y'):.1e}, gradients {max(worst.values()):.1e} (worst: {max(worst, key=worst.get)})")"""),
    ("md", """Every rank's loss, the block's output and every gradient (each reassembled from its blocks by DTensor)
equal the single process's to rounding.

## A seeded bug, caught in the forward pass
The classic sequence-parallel bug: the layer norms' weights are said to vary over `dp` only, not over `tp`. Each
`tp` member computes the layer norms on its own slice of the sequence, so each has only part of their gradient,
and nothing sums the parts (Megatron sums them by hand, after the backward, for weights marked
`sequence_parallel`). Run checked on 4 real gloo processes, it raises in the forward pass, on every rank, at the
operation, naming the value, its type, the axis and the fix:"""),
    ("code", """def forgot_tp(ax, *blocks):
    return tp_sp_block(ax, *blocks, ln_axes="dp")


try:
    fmesh.launch(lambda ctx: train_step(ctx, forgot_tp), world_size=4)
except fmesh.SpmdTypeError as error:
    print(f"{type(error).__name__} from rank {error.rank}:\\n{error}")"""),
    ("md", """Unchecked (`check=False`, no types and no cost), the same program runs, its loss is right, and the
layer norms' gradients are silently wrong: each `tp` member keeps the gradient of its own slice of the sequence."""),
    ("code", """for result in fmesh.launch(lambda ctx: train_step(ctx, forgot_tp, check=False), world_size=4):
    worst = differences(result)
    print(f"rank {result['rank']}: loss off by {worst['loss']:.1e}; gradients off by "
          + ", ".join(f"{k} {worst[k]:.2f}" for k in ("ln1w", "ln2b")) + f"; wq off by {worst['wq']:.1e}")"""),
    ("md", """The fix is the one the message names, `ax.pvary(w, ("dp", "tp"))`: the correct block above.

Other mistakes the types catch the same way (the test suite seeds 17 in this block, and 42 more in a corpus of 20
programs): a non-linear operation (or a bias) on a pending sum, a residual added before its reduction, a `psum` of
a value already reduced, an `all_gather` where a `psum_scatter` belongs, a reduction over the wrong axis, a sum
where a mean belongs, a softmax or a scan along a split dimension, and an out spec that does not match the value.

The check runs once per signature (the inputs' shapes, dtypes, `requires_grad`), on copies of the inputs with
rehearsed collectives, before any communication; every later call runs unchecked, at the cost of `check=False`
(about 1.02x on this block, `bench/spmd.py` (d)). Under `torch.compile(fullgraph=True)` the same check runs while
Dynamo traces the region (see *Coming from JAX* in the guides, and `bench/spmd.py` for this block eager, compiled,
and written with torch's `parallelize_module` on DTensor)."""),
]

NOTEBOOKS = {"01_mesh_algebra.ipynb": TOUR, "02_planning_a_job.ipynb": PLANNING, "03_collectives.ipynb": COLLECTIVES,
             "04_sharded_computation.ipynb": SHARDED}


def make(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell(text) if kind == "md" else nbformat.v4.new_code_cell(text)
        for kind, text in cells
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return notebook


def execute(notebook: nbformat.NotebookNode, timeout: int = 300) -> nbformat.NotebookNode:
    """Run every cell in a fresh python3 kernel started in ``notebooks/``; raises on the first error."""
    resources = {"metadata": {"path": str(HERE)}}
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", resources=resources)
    client.execute()
    return notebook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="execute the committed notebooks only")
    parser.add_argument("names", nargs="*", help="only these notebooks (default: all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(NOTEBOOKS))
    if unknown:
        parser.error(f"expected notebooks among {sorted(NOTEBOOKS)}, but got {unknown}")
    for name, cells in NOTEBOOKS.items():
        if args.names and name not in args.names:
            continue
        path = HERE / name
        notebook = nbformat.read(path, as_version=4) if args.check else make(cells)
        execute(notebook)
        if not args.check:
            nbformat.write(notebook, path)
        print(f"ran {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
