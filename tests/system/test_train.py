"""The main job: examples/train.py under torchrun on gloo (tp 2 x dp_shard 2), against one process."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from paths import ROOT
from support import losses, patience

pytestmark = pytest.mark.slow  # multi-process or subprocess runs: left out of the quick subset (-m "not slow")

SCRIPT = ROOT / "examples" / "train.py"
COMMON = ("--steps", "8", "--seq-len", "16", "--dim", "32", "--log-every", "1")
TOLERANCE = 1e-4  # FSDP and TP reduce in another order than one process: float32 rounding only


def torchrun(nproc: int, *flags: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    # gloo on the CPU, explicitly: on a GPU machine with fewer GPUs than processes, too.
    return run(nproc, ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(SCRIPT),
                       "--backend", "gloo", *flags], timeout)


def forked(nproc: int, *flags: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """train.py's ranks forked by ``fmesh.launch`` in one process (``--processes``): the same training, without an
    interpreter and a torch import per rank (a run that is not about torchrun)."""
    return run(nproc, [str(SCRIPT), "--processes", str(nproc), *flags], timeout)


def run(nproc: int, arguments: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, *arguments], capture_output=True, text=True,
                          timeout=patience(timeout, nproc), env=env, cwd=ROOT)


def succeeded(runs: dict[str, object], *names: str) -> pathlib.Path:
    """Check these runs exited 0; returns the runs' scratch folder."""
    for name in names:
        result = runs[name]
        assert isinstance(result, subprocess.CompletedProcess)
        assert result.returncode == 0, result.stderr[-3000:]
    tmp = runs["tmp"]
    assert isinstance(tmp, pathlib.Path)
    return tmp


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("train")
    common = COMMON
    parallel = torchrun(4, "--tp", "2", *common, "--losses-to", str(tmp / "four.json"))
    single = torchrun(1, *common, "--losses-to", str(tmp / "one.json"))
    # The checkpoint and the resume: forked ranks (the losses must equal torchrun's, bit for bit but rounding).
    first = forked(4, "--tp", "2", *common[:1], "4", *common[2:], "--checkpoint-dir", str(tmp / "ckpt"),
                   "--checkpoint-every", "2")
    resumed = forked(4, "--tp", "2", *common, "--checkpoint-dir", str(tmp / "ckpt"), "--resume",
                     "--losses-to", str(tmp / "resumed.json"))
    return {"tmp": tmp, "parallel": parallel, "single": single, "first": first, "resumed": resumed}


def test_loss_falls_and_matches_one_process(runs: dict[str, object]) -> None:
    tmp = succeeded(runs, "parallel", "single")
    _, four = losses(tmp / "four.json")
    _, one = losses(tmp / "one.json")
    assert len(four) == len(one) == 8
    assert four[-1] < four[0] - 1.0, f"the loss does not fall: {four}"
    for step, (a, b) in enumerate(zip(four, one, strict=True)):
        assert abs(a - b) <= TOLERANCE * max(1.0, abs(b)), f"step {step}: 4 ranks {a} vs 1 rank {b}"
    parallel = runs["parallel"]
    assert isinstance(parallel, subprocess.CompletedProcess)
    out = parallel.stdout
    assert "tp " in out and "fsdp_mesh(dp_shard_cp)" in out  # the plan
    assert "tokens/s" in out and "step    7" in out
    assert "groups created by the context: 2" in out  # tp and dp_shard: every other need is shared


def test_resumed_run_continues_with_the_same_losses(runs: dict[str, object]) -> None:
    tmp = succeeded(runs, "first", "resumed")
    start, resumed = losses(tmp / "resumed.json")
    _, straight = losses(tmp / "four.json")
    assert start == 4 and len(resumed) == 4
    assert resumed == pytest.approx(straight[4:], rel=1e-6, abs=1e-6)


@pytest.mark.parametrize(
    ("nproc", "flags", "message"),
    [
        (2, ["--tp", "3"], "world_size 2 is not divisible by"),
        (2, ["--tpp", "2"], "unrecognized arguments: --tpp 2"),
        # The same check on every rank (above): one process is enough for the other refusals' words.
        (1, ["--cp", "2"], "trains with pp=1 and cp=1"),
        (1, ["--resume"], "--resume needs --checkpoint-dir"),
    ],
)
def test_bad_input_is_one_line_on_rank_0_and_a_clean_exit(nproc: int, flags: list[str], message: str) -> None:
    result = torchrun(nproc, *flags, timeout=120) if nproc > 1 else run(1, [str(SCRIPT), *flags], 120)
    assert result.returncode != 0
    ours = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("train.py: error:")]
    assert len(ours) == 1 and message in ours[0], ours
    assert "SIGTERM" not in result.stderr and "Traceback" not in result.stdout


def test_a_checkpoint_from_another_mesh_is_refused(runs: dict[str, object]) -> None:
    tmp = succeeded(runs)
    result = torchrun(2, "--tp", "1", "--steps", "8", "--seq-len", "16", "--dim", "32",
                      "--checkpoint-dir", str(tmp / "ckpt"), "--resume", timeout=120)
    assert result.returncode != 0
    ours = [line for line in result.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(ours) == 1 and "was saved with" in ours[0] and "'tp': 2" in ours[0] and "'tp': 1" in ours[0], ours
    assert "SIGTERM" not in result.stderr


def test_hsdp_with_tensor_parallelism_on_eight_ranks_matches_one_process(runs: dict[str, object]) -> None:
    tmp = succeeded(runs, "single")
    result = forked(8, "--dp-replicate", "2", "--tp", "2", "--steps", "4", "--seq-len", "16", "--dim", "32",
                    "--losses-to", str(tmp / "eight.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "data parallel: hsdp" in result.stdout
    _, eight = losses(tmp / "eight.json")
    _, one = losses(tmp / "one.json")
    assert len(eight) == 4
    for step, (a, b) in enumerate(zip(eight, one, strict=False)):
        assert abs(a - b) <= TOLERANCE * max(1.0, abs(b)), f"step {step}: 8 ranks {a} vs 1 rank {b}"


def test_plain_python_runs_a_world_of_one_like_torchrun(runs: dict[str, object], tmp_path: pathlib.Path) -> None:
    tmp = succeeded(runs, "single")  # torchrun --nproc-per-node=1 with the same flags
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"  # as torchrun() runs it: another thread count sums in another order
    plain = subprocess.run([sys.executable, str(SCRIPT), "--backend", "gloo", *COMMON, "--losses-to",
                            str(tmp_path / "plain.json")], capture_output=True, text=True,
                           timeout=patience(120), env=env, cwd=ROOT)
    assert plain.returncode == 0, plain.stderr[-3000:]
    said = [line for line in plain.stderr.splitlines() if line.startswith("fmesh:")]
    assert len(said) == 1 and "a world of one process" in said[0]
    single = runs["single"]
    assert isinstance(single, subprocess.CompletedProcess)
    assert "a world of one" not in single.stderr  # torchrun's variables are there: no such line
    assert losses(tmp_path / "plain.json") == losses(tmp / "one.json")
