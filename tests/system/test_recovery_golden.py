"""``plan --lose`` and ``diff --lose``: the recovery plan's text and JSON, byte for byte, against
tests/data/recovery_golden.json, and their bad input (one line, exit 2).

``PYTHONPATH=tests python tests/system/test_recovery_golden.py`` rewrites the fixture; do that only when a change of
output is meant.
"""

from __future__ import annotations

import io
import json
import sys

import pytest
from paths import DATA

from fmesh.cli import main

FIXTURE = DATA / "recovery_golden.json"
HSDP = "--world-size 32 --gpus-per-node 8 --pp 2 --dp-replicate 2 --dp-shard 4 --tp 2"
SMALLER = "--world-size 24 --gpus-per-node 8 --pp 2 --dp-replicate 2 --dp-shard 3 --tp 2"
COMMANDS = (
    f"plan {HSDP} --lose 9",
    f"plan {HSDP} --lose 1,9",
    f"plan {HSDP} --lose 1,9 --json",
    f"plan {HSDP} --lose 1,9 --backend gloo",
    "plan --world-size 64 --gpus-per-node 8 --dp-replicate 2 --cp 2 --tp 4 --lose 5,37",
    "plan --world-size 48 --gpus-per-node 4 --dp-replicate 3 --tp 2 --ep 4 --lose 7",
    "plan --world-size 16 --gpus-per-node 8 --pp 2 --tp 8 --lose 3 --absorb dp_replicate,dp_shard,pp",
)
DIFFS = ((HSDP, SMALLER, "1,9", ()), (HSDP, SMALLER, "1,9", ("--json",)))


def _run(args: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = main(args, stdout=out, stderr=err)
    return f"exit {code}\n{out.getvalue()}{err.getvalue()}"


def outputs() -> dict[str, str]:
    """Every output, by command line."""
    found = {command: _run(command.split()) for command in COMMANDS}
    for a, b, lost, mode in DIFFS:
        found[f"diff '{a}' '{b}' --lose {lost} {' '.join(mode)}"] = _run(["diff", a, b, "--lose", lost, *mode])
    return found


@pytest.fixture(scope="module")
def now() -> dict[str, str]:
    return outputs()


@pytest.mark.parametrize("label", sorted(json.loads(FIXTURE.read_text())))
def test_output_is_unchanged(label: str, now: dict[str, str]) -> None:
    assert now[label] == json.loads(FIXTURE.read_text())[label]


def test_fixture_covers_every_case(now: dict[str, str]) -> None:
    assert sorted(json.loads(FIXTURE.read_text())) == sorted(now)


BAD = [
    (f"plan {HSDP} --lose 40", "fmesh plan: error: rank 40 is outside the universe: valid ranks are 0..31"),
    ("plan --world-size 8 --gpus-per-node 8 --tp 8 --lose 3",
     "fmesh plan: error: no axis of ('dp_replicate', 'dp_shard') can absorb the loss of ranks [3] in "
     "ParallelDims(world_size=8, pp=1, dp_replicate=1, dp_shard=1, cp=1, tp=8, ep=1, etp=1): dp_replicate=1: the "
     "lost ranks lie in all 1 of its slices; dp_shard=1: the lost ranks lie in all 1 of its slices (pp is tried "
     "only when axes names it; tp and cp cannot absorb a change"),
    (f"plan {HSDP} --lose 5,x", "fmesh plan: error: argument --lose: expected ranks as comma-separated ints such as "
                                "5,9, but got '5,x'"),
    (f"plan {HSDP} --lose 9 --absorb tp", "fmesh plan: error: axes names 'tp': tp and cp cannot absorb a change"),
    (f"plan {HSDP} --absorb pp", "fmesh plan: error: --absorb says which axes absorb a loss, so it goes with --lose"),
    (f"plan {HSDP} --lose 9 --manifest m.json", "fmesh plan: error: --lose prints the recovery plan and writes no "
                                                "manifest"),
]


@pytest.mark.parametrize(("command", "message"), BAD, ids=[b[0].split("--tp 2 ")[-1] for b in BAD])
def test_bad_input_is_one_line_and_exit_2(command: str, message: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(command.split(), stdout=out, stderr=err) == 2
    assert out.getvalue() == "" and err.getvalue().count("\n") == 1 and err.getvalue().startswith(message)


def test_a_diff_whose_b_is_not_a_after_the_loss_is_one_line_and_exit_2() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["diff", HSDP, SMALLER, "--lose", "9"], stdout=out, stderr=err) == 2
    assert err.getvalue() == (
        "fmesh diff: error: B (world 24 = 3 hosts x 8 (block order), nccl; pp=2 dp_replicate=2 dp_shard=3 tp=2) is "
        "not the job A becomes after losing ranks [9]: that job has pp=2 dp_replicate=1 dp_shard=4 cp=1 tp=2 ep=1 "
        "etp=1 efsdp=8 (world 16)\n")


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(outputs(), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)
