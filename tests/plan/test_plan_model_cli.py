"""``python -m fmesh plan --model NAME``: the model-aware plan on the command line, its JSON, and one line with
exit status 2 for a model that fits nowhere, degrees that do not divide, an unknown preset or hardware."""

from __future__ import annotations

import io
import json
import pathlib

import pytest

from fmesh.cli import main


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
