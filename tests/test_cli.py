"""The command line: ``python -m fmesh`` (demo) and ``python -m fmesh plan`` (table and JSON, errors)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fmesh.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def plan_json(*args: str) -> dict[str, object]:
    code, out, err = run("plan", *args, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert isinstance(data, dict)
    return data


def by_name(plan: dict[str, object]) -> dict[str, dict[str, object]]:
    meshes = plan["meshes"]
    assert isinstance(meshes, list)
    return {m["name"]: m for m in meshes}


def test_json_plan_hsdp_cp_tp() -> None:
    plan = plan_json("--world-size", "64", "--gpus-per-node", "8", "--dp-replicate", "2", "--cp", "2", "--tp", "4")
    assert plan["degrees"] == {
        "pp": 1, "dp_replicate": 2, "dp_shard": 4, "cp": 2, "tp": 4, "ep": 1, "etp": 1, "efsdp": 4 * 2 * 4,
    }  # fmt: skip
    assert plan["hosts"] == 8 and plan["data_parallel"] == "hsdp" and plan["warnings"] == []
    meshes = by_name(plan)
    # (pp1, dpr2, dps4, cp2, tp4) row-major: tp stride 1, cp stride 4, dp_shard stride 8, dp_replicate stride 32.
    assert meshes["tp"]["rank0_group"] == [0, 1, 2, 3] and meshes["tp"]["placement"] == "intra-host"
    assert meshes["cp"]["rank0_group"] == [0, 4] and meshes["cp"]["hosts_per_group"] == 1
    assert meshes["dp_shard"]["rank0_group"] == [0, 8, 16, 24] and meshes["dp_shard"]["hosts_per_group"] == 4
    assert meshes["dp_replicate"]["rank0_group"] == [0, 32] and meshes["dp_replicate"]["num_groups"] == 32
    assert meshes["dp_shard_cp"]["rank0_group"] == [0, 4, 8, 12, 16, 20, 24, 28]
    assert meshes["fsdp_mesh"]["axes"] == {"dp_replicate": 2, "dp_shard_cp": 8}
    assert "ep" not in meshes  # expert rows only when ep > 1


def test_json_abbreviates_long_groups() -> None:
    plan = plan_json("--world-size", "256", "--gpus-per-node", "8", "--tp", "8")
    dp = by_name(plan)["dp_shard"]
    assert dp["size"] == 32 and dp["rank0_group_complete"] is False
    assert dp["rank0_group"] == [0, 8, 16, 24, 32, 40, 248]


def test_expert_rows_and_cyclic_warning() -> None:
    plan = plan_json(
        "--world-size", "16", "--gpus-per-node", "8", "--dp-shard", "2", "--tp", "8", "--ep", "4",
        "--rank-order", "cyclic",
    )  # fmt: skip
    meshes = by_name(plan)
    assert meshes["ep"]["rank0_group"] == [0, 1, 2, 3] and meshes["efsdp"]["size"] == 4
    warnings = plan["warnings"]
    assert isinstance(warnings, list) and [w.split(" ")[0] for w in warnings] == ["tp", "ep"]


def test_human_table() -> None:
    code, out, err = run("plan", "--world-size", "32", "--gpus-per-node", "8", "--tp", "16")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("world 32 = 4 hosts x 8 ranks (block order); pp=1 dp_replicate=1 dp_shard=2")
    assert lines[1].split() == ["mesh", "size", "groups", "rank", "0's", "group", "hosts", "placement"]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert rows["tp"].split()[1:3] == ["16", "2"] and rows["tp"].endswith("2  inter-host")
    assert "[0, 1, 2, 3, 4, 5, ..., 15] (16 ranks)" in rows["tp"]
    assert rows["dp_shard"].split()[1:5] == ["2", "16", "[0,", "16]"]
    assert "fsdp_mesh(dp_shard_cp)" in rows
    assert not any(line.startswith("warning") for line in lines)


def test_human_table_shows_warnings() -> None:
    code, out, _ = run(
        "plan", "--world-size", "16", "--gpus-per-node", "8", "--dp-shard", "2", "--tp", "8", "--rank-order", "cyclic"
    )
    assert code == 0
    assert out.splitlines()[-1].startswith("warning: tp groups (size 8) span 2 hosts each while dp_shard")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", "8", "--gpus-per-node", "8", "--tp", "3"], "cannot infer dp_shard=-1: world_size 8"),
        (["--world-size", "8", "--gpus-per-node", "8", "--tp", "-1"], "only one degree may be -1"),
        (["--world-size", "8", "--gpus-per-node", "3"], "not a multiple of 3 gpus per node"),
        (["--world-size", "8", "--gpus-per-node", "0"], "gpus per node must be a positive int, got 0"),
        (["--world-size", "0", "--gpus-per-node", "8"], "world_size must be a positive int"),
        (["--world-size", "8", "--gpus-per-node", "8", "--tp", "4", "--etp", "2"], "etp=2 is not supported"),
        (["--world-size", "8", "--gpus-per-node", "8", "--tp", "2", "--ep", "3"], "ep=3 does not divide"),
        (["--world-size", "x", "--gpus-per-node", "8"], "argument --world-size: invalid int value: 'x'"),
        (["--gpus-per-node", "8"], "required: --world-size"),
        (["--world-size", "8", "--gpus-per-node", "8", "--rank-order", "zigzag"], "invalid choice: 'zigzag'"),
        (["--world-size", "8", "--gpus-per-node", "8", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_give_one_line_and_status_2(args: list[str], message: str) -> None:
    code, out, err = run("plan", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("fmesh plan: error: ")
    assert message in err


def test_million_ranks_plan() -> None:  # how fast: bench/mesh_ops.py
    plan = plan_json(
        "--world-size", "1048576", "--gpus-per-node", "8", "--pp", "8", "--cp", "2", "--tp", "8", "--ep", "32"
    )  # fmt: skip
    assert by_name(plan)["dp_shard"]["size"] == 8192


def test_demo_without_subcommand() -> None:
    code, out, _ = run()
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "Mesh(dp=2, cp=2, tp=4; world=16)"
    # (dp, cp, tp) = (2, 2, 4) row-major: tp groups are runs of 4, dp pairs are 8 apart.
    assert "groups along tp     [0,1,2,3] [4,5,6,7] [8,9,10,11] [12,13,14,15]" in lines
    assert any(line.startswith("groups along dp ") and "[0,8] [1,9]" in line for line in lines)


def test_python_dash_m_entry_point() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "fmesh", "plan", "--world-size", "16", "--gpus-per-node", "8", "--tp", "8", "--json"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ok.returncode == 0 and json.loads(ok.stdout)["degrees"]["dp_shard"] == 2
    bad = subprocess.run(
        [sys.executable, "-m", "fmesh", "plan", "--world-size", "10", "--gpus-per-node", "8"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
