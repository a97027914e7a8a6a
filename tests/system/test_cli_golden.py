"""The manifest file and the CLI's output, byte for byte, against tests/data/cli_golden.json.

The fixture was written by the code before plans became typed records
(``PYTHONPATH=tests python tests/system/test_cli_golden.py`` rewrites it; do that only when a change of output is
meant): the ``fmesh.manifest/1`` files a job wrote yesterday must read the same today.
"""

from __future__ import annotations

import io
import json
import pathlib
import sys

import pytest
from paths import DATA

from fmesh.cli import main
from fmesh.plan.manifest import Manifest

FIXTURE = DATA / "cli_golden.json"
PLANS = (
    "--world-size 16 --gpus-per-node 8 --tp 8",
    "--world-size 64 --gpus-per-node 8 --dp-replicate 2 --cp 2 --tp 4 --backend gloo",
    "--world-size 4096 --gpus-per-node 8 --pp 4 --cp 2 --tp 8 --ep 8 --rank-order cyclic",
    "--world-size 1048576 --gpus-per-node 8 --pp 8 --cp 2 --tp 8 --ep 32",
    "--world-size 256 --gpus-per-node 8 --tp 16 --cost-bytes 1GiB --links loopback",
    "--world-size 48 --gpus-per-node 4 --dp-replicate 3 --tp 2 --ep 4 --etp 1",
)
DIFFS = ((0, 1), (2, 3), (3, 2), (1, 5), (5, 5))


def _run(args: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = main(args, stdout=out, stderr=err)
    return f"exit {code}\n{out.getvalue()}{err.getvalue()}"


def outputs(directory: pathlib.Path) -> dict[str, str]:
    """Every output of the CLI on ``PLANS`` and ``DIFFS``, by command line (files named by plan index)."""
    found: dict[str, str] = {}
    for index, plan in enumerate(PLANS):
        flags = plan.split()
        found[f"plan {plan} --json"] = _run(["plan", *flags, "--json"])
        path = directory / f"{index}.json"
        text = _run(["plan", *flags, "--manifest", str(path)])
        found[f"plan {plan} --manifest FILE"] = text.replace(str(path), "FILE")
        found[f"manifest file of {plan}"] = path.read_text()
    for a, b in DIFFS:
        for mode in ([], ["--json"]):
            label = f"diff {a}.json '{PLANS[b]}' {' '.join(mode)}"
            found[label] = _run(["diff", str(directory / f"{a}.json"), PLANS[b], *mode])
    return found


@pytest.mark.parametrize("label", sorted(json.loads(FIXTURE.read_text())))
def test_output_is_unchanged(label: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    expected = json.loads(FIXTURE.read_text())
    directory = tmp_path_factory.getbasetemp() / "golden"
    if not directory.exists():
        directory.mkdir()
        (directory / "outputs.json").write_text(json.dumps(outputs(directory)))
    assert json.loads((directory / "outputs.json").read_text())[label] == expected[label]


@pytest.mark.parametrize("plan", PLANS)
def test_a_file_written_before_reads_back_as_the_same_record(plan: str) -> None:
    text = json.loads(FIXTURE.read_text())[f"manifest file of {plan}"]
    manifest = Manifest.from_json(json.loads(text), plan)
    assert json.dumps(manifest.to_json(), indent=1) + "\n" == text
    assert manifest.per_rank_communicators == len(manifest.communicators) > 0


def test_fixture_covers_every_case() -> None:
    assert len(json.loads(FIXTURE.read_text())) == 3 * len(PLANS) + 2 * len(DIFFS)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        FIXTURE.write_text(json.dumps(outputs(pathlib.Path(scratch)), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)
