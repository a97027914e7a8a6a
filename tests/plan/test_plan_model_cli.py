"""``python -m fmesh plan --model NAME``: the model-aware plan on the command line, its JSON, and one line with
exit status 2 for a model that fits nowhere, degrees that do not divide, an unknown preset or hardware."""

from __future__ import annotations

import io
import json
import pathlib
from contextlib import redirect_stdout

import attrs
import pytest

from fmesh.cli import main
from fmesh.plan.hardware import hardware
from fmesh.plan.memory import memory, with_communicators
from fmesh.plan.model import Model, Options, preset
from fmesh.plan.model_plan import plan_model
from fmesh.plan.model_table import format_model_plan
from fmesh.plan.parallel import ParallelDims
from fmesh.plan.step import step_time
from fmesh.plan.topology import Topology


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["plan", *argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_search_70b_on_4096_gpus_json() -> None:
    code, out, err = run("--model", "llama3-70b", "--world-size", "4096", "--gpus-per-node", "8", "--search",
                         "--lose", "5,9", "--json")
    assert code == 0 and not err
    plan = json.loads(out)
    degrees = plan["degrees"]
    assert degrees["pp"] * degrees["dp_replicate"] * degrees["dp_shard"] * degrees["cp"] * degrees["tp"] == 4096
    assert plan["memory_bytes"]["total"] <= 80 * 10**9
    assert plan["ranked"][0]["step_seconds"] == plan["step_seconds"]["total"]
    assert [r["step_seconds"] for r in plan["ranked"]] == sorted(r["step_seconds"] for r in plan["ranked"])
    assert plan["loss"]["world_size"] + plan["loss"]["idle_gpus"] + 2 == 4096
    assert {t["axis"] for t in plan["bytes_per_step"]} >= {"dp_shard_cp"}


def test_a_config_file(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "model.json"
    config.write_text(json.dumps({"name": "mine", "layers": 4, "hidden": 1024, "heads": 8, "vocab": 32000,
                                  "seq_len": 2048, "global_batch": 64}))
    code, out, _ = run("--model", str(config), "--world-size", "16", "--gpus-per-node", "8", "--search", "--json")
    assert code == 0 and json.loads(out)["model"] == "mine"
    config.write_text(json.dumps({"layers": 4, "width": 1024}))
    code, _, err = run("--model", str(config), "--world-size", "16", "--gpus-per-node", "8", "--search")
    assert code == 2 and "['width']" in err and err.count("\n") == 1


def test_given_degrees_text() -> None:
    code, out, _ = run("--model", "llama3-8b", "--world-size", "16", "--gpus-per-node", "8", "--tp", "8")
    assert code == 0
    assert "tensor parallel (SP)" in out and "step time:" in out and "assumptions:" in out


@pytest.mark.parametrize(("argv", "says"), [
    (["--model", "llama3-405b", "--world-size", "8", "--gpus-per-node", "8", "--search"], "fits on 128 GPUs"),
    (["--model", "llama-70b", "--world-size", "8", "--gpus-per-node", "8", "--search"], "'llama-70b'"),
    (["--model", "llama3-70b", "--world-size", "64", "--gpus-per-node", "8", "--tp", "3"], "not divisible"),
    (["--model", "llama3-70b", "--world-size", "8", "--gpus-per-node", "8", "--tp", "8"], "does not with any"),
    (["--model", "llama3-8b", "--world-size", "16", "--gpus-per-node", "8", "--hardware", "v100"], "v100"),
    (["--model", "llama3-8b", "--world-size", "16", "--gpus-per-node", "8", "--tp", "8", "--search"], "--search"),
    (["--world-size", "16", "--gpus-per-node", "8", "--search"], "--model"),
    (["--model", "llama3-8b", "--world-size", "16", "--gpus-per-node", "8", "--tp", "8", "--links", "loopback"],
     "--links"),
    (["--model", "llama3-8b", "--world-size", "16", "--gpus-per-node", "8", "--tp", "8", "--lose", "3", "--absorb",
      "pp"], "pp"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], says: str) -> None:
    code, out, err = run(*argv)
    assert code == 2 and not out
    assert err.count("\n") == 1 and says in err


@pytest.mark.parametrize(("argv", "says"), [
    (["--world-size", "64", "--tp", "16"], "expected tp dividing the 64 heads, the 8 KV heads and the FFN size 28672 "
                                           "of llama3-70b (tp in 1, 2, 4, 8), but got tp=16"),
    (["--world-size", "24", "--cp", "3"], "expected cp dividing the 8192-token sequence of llama3-70b (cp in 1, 2, 4, "
                                          "8), but got cp=3"),
    (["--world-size", "24", "--tp", "8"], "but got dp=3 (dp_replicate=1 x dp_shard=3)"),
    (["--world-size", "64", "--tp", "8", "--ep", "2"], "expected ep 1 (it has no experts) of llama3-70b"),
    (["--world-size", "64", "--efficiency", "2"], "expected efficiency in (0, 1], but got 2.0"),
    (["--world-size", "64", "--tp", "8", "--recompute", "some"], "invalid choice: 'some'"),
])
def test_given_degrees_and_options_that_do_not_suit_the_model(argv: list[str], says: str) -> None:
    code, out, err = run("--model", "llama3-70b", "--gpus-per-node", "8", *argv)
    assert code == 2 and not out
    assert err.count("\n") == 1 and says in err


def test_training_options_from_the_flags() -> None:
    base = ["--model", "llama3-8b", "--world-size", "16", "--gpus-per-node", "8", "--tp", "8", "--json"]
    plan = json.loads(run(*base)[1])
    assert plan["options"]["recompute"] == "auto" and plan["recompute"] == "none"
    assert plan["gpu_memory_bytes"] > 79 * 2**30
    forced = json.loads(run(*base, "--recompute", "full", "--no-sequence-parallel", "--efficiency", "0.25",
                            "--dropout", "--moment-bytes", "4")[1])
    assert forced["recompute"] == "full" and forced["options"]["sequence_parallel"] is False
    assert forced["options"]["efficiency"] == 0.25 and forced["options"]["dropout"] is True
    assert {(t["axis"], t["collective"]) for t in forced["bytes_per_step"]} >= {("tp", "all_reduce")}
    assert ("tp", "all_gather") not in {(t["axis"], t["collective"]) for t in forced["bytes_per_step"]}
    assert forced["memory_bytes"]["optimizer"] * 3 == plan["memory_bytes"]["optimizer"] * 2  # 4 + 4 vs 4 + 8
    assert any("25% of 989 TFLOP/s" in a for a in forced["assumptions"])
    assert any("sequence parallelism off" in a for a in forced["assumptions"])
    code, _, err = run("--world-size", "16", "--gpus-per-node", "8", "--recompute", "full")
    assert code == 2 and "--recompute set how a model is trained, so they go with --model NAME" in err


def test_help_says_fsdp_or_hsdp_by_degrees() -> None:
    out = io.StringIO()
    with pytest.raises(SystemExit), redirect_stdout(out):
        main(["plan", "--help"])
    text = " ".join(out.getvalue().split())
    assert "HSDP" in text and "--recompute" in text and "--efficiency" in text and "--sequence-parallel" in text


def test_one_node_is_singular() -> None:
    code, out, _ = run("--model", "llama3-8b", "--world-size", "8", "--gpus-per-node", "8", "--tp", "8")
    assert code == 0 and out.startswith("llama3-8b on 8 GPUs (1 node of 8, ")


def test_memory_is_what_the_gpu_lets_a_process_allocate_in_gib() -> None:
    # torch reports 79.11 GiB of total_memory on an H100 SXM 80GB, below nvidia-smi's 81,559 MiB; not 80e9 bytes.
    assert 79 * 2**30 < hardware("h100").memory < 81559 * 2**20
    assert 139 * 2**30 < hardware("h200").memory < 143771 * 2**20
    code, out, _ = run("--model", "llama3-8b", "--world-size", "8", "--gpus-per-node", "8", "--tp", "8")
    assert code == 0 and "memory per GPU (GiB = 2^30 bytes):" in out and "of 79.1 GiB usable" in out


def _step(model: Model, options: Options, dims: ParallelDims, per_node: int) -> float:
    return step_time(model, options, dims, hardware("h100"), Topology(dims.world_size // per_node, per_node)).total


def test_the_loss_of_4096_gpus_is_one_consistent_smaller_job() -> None:
    model = preset("llama3-70b")
    plan = plan_model(model, Options(), hardware("h100"), 4096, 8, lose=[5, 9])
    loss, chosen = plan.loss, Options(recompute=plan.recompute)
    assert loss is not None
    dp = loss.dims.dp_replicate * loss.dims.dp_shard
    assert loss.global_batch == dp * loss.micro_batches * model.micro_batch  # every rank an equal share
    smaller = attrs.evolve(model, global_batch=loss.global_batch)
    assert loss.step_seconds == _step(smaller, chosen, loss.dims, 8)
    assert loss.memory == with_communicators(memory(smaller, chosen, loss.dims), loss.dims, 8)
    assert loss.fits == (loss.memory.total <= hardware("h100").memory)
    if model.global_batch % dp:
        assert loss.global_batch != model.global_batch and f"dp={dp} does not divide" in loss.assumed[0]
    text = format_model_plan(plan)
    assert f"global batch {loss.global_batch} sequences" in text and "assumed: " in text


def test_a_loss_that_keeps_the_global_batch_accumulates_more() -> None:
    model = preset("llama3-8b")
    plan = plan_model(model, Options(), hardware("h100"), 64, 8, degrees={"dp_replicate": 2, "dp_shard": 4, "tp": 8},
                      lose=[3])
    loss = plan.loss
    assert loss is not None and loss.dims.dp_replicate == 1 and loss.global_batch == 1024
    assert loss.micro_batches == 1024 // 4 and "keeps the global batch of 1024 sequences" in loss.assumed[0]
    assert loss.step_seconds == _step(model, Options(recompute=plan.recompute), loss.dims, 8)
    assert json.loads(json.dumps(plan.to_json()))["loss"]["global_batch"] == 1024
