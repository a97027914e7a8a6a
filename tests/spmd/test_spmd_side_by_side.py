"""Smoke test: ``bench/spmd_side_by_side.py``'s rows on three corpus entries, without spmd-types: the fmesh column
is produced and equals the corpus's verdicts (a correct program passes, a mistake is caught), and the JAX reading
is given from its table."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent.parent


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spmd_side_by_side", ROOT / "bench" / "spmd_side_by_side.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fmesh_column_matches_the_corpus_and_the_jax_column_is_read() -> None:
    bench = _bench()
    which = [("tensor_parallel_mlp", None), ("tensor_parallel_mlp", "bias before the psum"),
             ("data_parallel_loss", "weight not pvary-ed")]
    rows = bench.rows(which, spmd_types=False)
    assert [r["fmesh"] for r in rows] == ["passed", "caught", "caught"]
    assert [r["spmd-types"] for r in rows] == ["not installed"] * 3
    assert [r["jax"] for r in rows] == ["passed", "passed (silently wrong)", "no error, right"]
    table = bench.table(rows, spmd_types=False)
    assert "JAX check_vma (reading, not run)" in table and "spmd-types" not in table.splitlines()[0]
    assert "| fmesh (run) | passed 1 | caught 2 |" in bench.summary(rows, spmd_types=False)


def test_every_mistake_of_the_corpus_has_a_kind_with_a_jax_rule() -> None:
    from spmd_corpus import MISTAKES

    bench = _bench()
    assert set(bench.MISTAKE_KINDS) == set(MISTAKES)
    assert set(bench.MISTAKE_KINDS.values()) <= set(bench.JAX_RULES)
