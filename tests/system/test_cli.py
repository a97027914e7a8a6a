"""The command line: ``python -m fmesh`` (demo) and ``python -m fmesh plan`` (table and JSON, errors)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT
from support import patience

from fmesh.cli import main


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
    assert lines[1].split() == ["mesh", "size", "groups", "rank", "0's", "group", "hosts", "placement", "cost", "of",
                                "256", "MiB"]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert rows["tp"].split()[1:3] == ["16", "2"] and "2  inter-host  all_reduce " in rows["tp"]
    assert "[0, 1, 2, 3, 4, 5, ..., 15] (16 ranks)" in rows["tp"]
    assert rows["dp_shard"].split()[1:5] == ["2", "16", "[0,", "16]"]
    assert rows["pp"].endswith("intra-host  send 0")  # a group of one rank costs nothing
    assert "fsdp_mesh(dp_shard_cp)" in rows
    # tp 16 on 8-GPU hosts must cross hosts: still a warning, with what it costs
    warnings = [line for line in lines if line.startswith("warning")]
    assert len(warnings) == 1 and warnings[0].startswith(
        "warning: tp groups (size 16) span 2 hosts each: more ranks than the 8 gpus of one host; all_reduce of "
        "256 MiB along tp takes ")
    assert "across hosts against" in warnings[0] and warnings[0].endswith("x)")


def test_human_table_shows_warnings() -> None:
    code, out, _ = run(
        "plan", "--world-size", "16", "--gpus-per-node", "8", "--dp-shard", "2", "--tp", "8", "--rank-order", "cyclic"
    )
    assert code == 0
    warning = out.splitlines()[-1]
    assert warning.startswith("warning: tp groups (size 8) span 2 hosts each while dp_shard")
    assert "all_reduce of 256 MiB along tp takes" in warning


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
        (["--world-size", "8", "--gpus-per-node", "8", "--cost-bytes", "1TB"], "expected bytes such as 4096"),
        (["--world-size", "8", "--gpus-per-node", "8", "--links", "nvl72"], "invalid choice: 'nvl72'"),
        (["--world-size", "8", "--gpus-per-node", "8", "--manifest", "/nonexistent/dir/m.json"],
         "cannot write the manifest to /nonexistent/dir/m.json"),
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


def test_plan_costs_in_json_and_on_other_links() -> None:
    plan = plan_json("--world-size", "64", "--gpus-per-node", "8", "--tp", "8", "--cost-bytes", "1GiB")
    tp = by_name(plan)["tp"]["cost"]
    assert tp["collective"] == "all_reduce" and tp["bytes"] == 2**30 and tp["seconds"] > 0
    slow = plan_json("--world-size", "64", "--gpus-per-node", "8", "--tp", "8", "--cost-bytes", "1GiB",
                     "--links", "loopback")
    assert by_name(slow)["tp"]["cost"]["seconds"] > 10 * tp["seconds"] and "loopback" in slow["links"]


def test_plan_writes_a_manifest_that_loads(tmp_path: Path) -> None:
    from fmesh.plan.manifest import load_manifest

    path = tmp_path / "job.json"
    code, out, err = run("plan", "--world-size", "4096", "--gpus-per-node", "8", "--tp", "8", "--cp", "2", "--pp", "4",
                         "--ep", "8", "--manifest", str(path))
    assert code == 0 and err == "" and f"manifest written to {path}" in out
    manifest = load_manifest(path)
    assert manifest["universe"]["world_size"] == 4096 and manifest["per_rank"]["communicators"] == 5
    assert "each rank joins 5 communicators" in out


def test_diff_of_files_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    assert run("plan", "--world-size", "64", "--gpus-per-node", "8", "--tp", "8", "--manifest", str(path))[0] == 0
    code, out, err = run("diff", str(path), "--world-size 64 --gpus-per-node 8 --tp 4")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[2] == "communicators: 0 shared, 2 added, 2 removed"
    assert any(line.split()[:3] == ["tp", "regrouped", "size"] and "[0, 1, 2, 3]" in line for line in lines)
    assert lines[-2].startswith("ranks changing group: all 64 ranks present in both, along dp_shard")
    code, out, _ = run("diff", str(path), str(path), "--json")
    same = json.loads(out)
    assert code == 0 and same["ranks_changing_group"] == 0 and len(same["shared"]) == 2


@pytest.mark.parametrize(
    ("sides", "message"),
    [
        (["{tmp}/none.json", "{tmp}/a.json"], "{tmp}/none.json: cannot read it: No such file or directory"),
        (["{tmp}/bad.json", "{tmp}/a.json"], "{tmp}/bad.json: not JSON"),
        (["{tmp}/old.json", "{tmp}/a.json"],
         "{tmp}/old.json: expected schema 'fmesh.manifest/1', but got 'fmesh.manifest/0'"),
        (["{tmp}/lying.json", "{tmp}/a.json"], "{tmp}/lying.json: per_rank.communicators is 7, but 2 communicators"),
        (["{tmp}/a.json", "--world-size 64 --gpus-per-node 8 --tp 5"],
         "B ('--world-size 64 --gpus-per-node 8 --tp 5'): cannot infer dp_shard=-1"),
        (["--world-size 64 --tp 8", "{tmp}/a.json"], "A ('--world-size 64 --tp 8'): the following arguments are "
         "required: --gpus-per-node"),
        (["{tmp}/a.json"], "the following arguments are required: b"),
    ],
)
def test_diff_errors_are_one_line_and_status_2(tmp_path: Path, sides: list[str], message: str) -> None:
    a = tmp_path / "a.json"
    assert run("plan", "--world-size", "64", "--gpus-per-node", "8", "--tp", "8", "--manifest", str(a))[0] == 0
    (tmp_path / "bad.json").write_text("{")
    data = json.loads(a.read_text())
    (tmp_path / "old.json").write_text(json.dumps({**data, "schema": "fmesh.manifest/0"}))
    (tmp_path / "lying.json").write_text(json.dumps({**data, "per_rank": {**data["per_rank"], "communicators": 7}}))
    code, out, err = run("diff", *(side.format(tmp=tmp_path) for side in sides))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("fmesh diff: error: ")
    assert message.format(tmp=tmp_path) in err


def test_a_closed_pipe_ends_the_command_quietly() -> None:
    """``python -m fmesh plan ... | head``: the reader is gone before the table is written."""
    read, write = os.pipe()
    os.close(read)  # every write now fails with EPIPE, as after ``head`` exits
    try:
        result = subprocess.run(
            [sys.executable, "-m", "fmesh", "plan", "--world-size", "4096", "--gpus-per-node", "8", "--tp", "8"],
            cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True, check=False, timeout=patience(120),
        )  # fmt: skip
    finally:
        os.close(write)
    assert result.stderr == "" and result.returncode == 1


@pytest.mark.parametrize("nested", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_a_deeply_nested_manifest_is_one_line_and_status_2(tmp_path: Path, nested: str) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text(nested)
    code, out, err = run("diff", str(deep), str(deep))
    assert code == 2 and out == ""
    assert err == f"fmesh diff: error: {deep}: not JSON: nested too deeply\n"


def test_an_endless_file_is_one_line_and_status_2() -> None:
    code, out, err = run("diff", "/dev/zero", "/dev/zero")
    assert code == 2 and out == ""
    assert err == "fmesh diff: error: /dev/zero: larger than 64 MiB: not a manifest (a manifest lists layouts, not " \
                  "ranks; a million-rank job's is a few kB)\n"
