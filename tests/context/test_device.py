"""GPU-correct by default, checked without a GPU: a context on CUDA exports CUDA meshes, whatever device the
mesh values name, the training example's meshes carry the context's device, and a host with fewer GPUs than
processes is told so."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest
import torch
from paths import ROOT

import fmesh
from fmesh.context.world import local_gpu


def load_training_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_example", ROOT / "examples" / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_exports_are_on_the_contexts_device(device: str) -> None:
    with fmesh.Context.fake(8, rank=3, device=device) as ctx:
        dims = fmesh.ParallelDims(8, dp_replicate=2, tp=2)  # names no device (its universe says "cpu")
        for mesh in (dims.world_mesh, dims.fsdp_mesh(), dims.mesh("tp"), fmesh.make_mesh((2, 4), ("dp", "tp"))):
            exported = ctx.device_mesh(mesh)
            assert exported.device_type == device, mesh
            assert exported[mesh.axis_names[-1]].device_type == device  # torch's own slices too


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_training_examples_meshes_carry_the_contexts_device(device: str) -> None:
    train = load_training_example()
    args = train.parse(["--tp", "2", "--dp-replicate", "2"])
    with fmesh.Context.fake(8, rank=5, device=device) as ctx:
        dims = train.check_degrees(args, ctx.world_size)
        tp_mesh, dp_mesh = train.device_meshes(ctx, dims)
        assert (tp_mesh.device_type, dp_mesh.device_type) == (device, device)
        assert dp_mesh.mesh_dim_names == ("dp_replicate", "dp_shard_cp")  # HSDP


def test_more_local_processes_than_gpus_is_one_clear_error() -> None:
    assert local_gpu({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, count=1) == torch.device("cuda", 0)
    for rank in ("0", "1"):  # every local rank raises, so none is left waiting for the others
        with pytest.raises(ValueError, match=r"a GPU for each of the 2 processes on this host, but it has 1 "
                                             r"visible \(CUDA_VISIBLE_DEVICES=0\).*--nproc-per-node 1.*'gloo'"):
            local_gpu({"LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "0"}, count=1)


def test_each_rank_may_name_its_own_gpu_and_none_past_the_visible_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    from fmesh.context.world import check_device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert [check_device(f"cuda:{rank}") for rank in (0, 1)] == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert check_device("cuda") == torch.device("cuda", 1)  # no index: the current device, made explicit
    with pytest.raises(ValueError, match=r"'cuda:2', but this process sees 2 CUDA devices; .* cuda:0 to cuda:1"):
        check_device("cuda:2")
