"""Side by side: fmesh's typed manual region, ``spmd-types`` and a reading of JAX's ``shard_map(check_vma=True)``,
on the corpus of ``tests/spmd/spmd_corpus.py`` (20 correct programs over a (dp=2, tp=2) mesh, 43 mistakes in them).

Three columns per program:

* **fmesh** (run): the program on the simulated 4-rank world, checked and unchecked, against one process
  (``tests/spmd/spmd_harness.py``'s ``judge``): ``caught`` (refused, and the unchecked program is wrong),
  ``passed`` (a correct program, accepted and exact), ``false positive``, ``silently wrong``. A mistake marked †
  is one torch itself refuses unchecked (a shape, an index out of range); its verdict is the checked run's.
* **spmd-types** (run, optional: ``pip install spmd-types``; without it the column says so): the same body, its
  ``ax`` calls translated to spmd-types' collectives (``pvary`` -> ``reinterpret(I -> V)``, ``psum`` ->
  ``all_reduce(-> I)``, ``all_gather`` -> ``all_gather(S(dim) -> R)`` (R: used beside varying values, its gradient
  reduce-scattered back, as JAX's ``all_gather``), ``pmax`` -> ``all_gather(V -> R).amax(0)``, ``psum_scatter`` ->
  ``reduce_scatter(-> S(dim))``, ``all_to_all`` -> ``all_to_all(S(concat) -> S(split))``), run in spmd-types'
  ``typecheck()`` (strict, local types) on rank 0 of a fake 4-rank process group; each input typed from its spec
  (a split axis ``S(dim)``, a partial one ``P``, any other ``I``: fmesh's inputs want complete gradients). Forward
  only. Then the outputs' inferred types against the out specs (split: ``V``; partial: ``V`` or ``P``; else ``I``
  or ``R``), as a region boundary would check them: spmd-types' local mode has no out specs of its own, so that
  check is this script's, and its verdict says so (``caught (out types)``). spmd-types has no ``ppermute`` and no
  scan over an axis: a program that needs one is ``not expressible``, with the reason. ``torch error``: torch
  itself refused the translated program on rank 0 (a shape, an index out of range), before any type verdict.
* **JAX check_vma (reading, not run)**: what JAX's rules say, derived from the mistake's kind by the table
  :data:`JAX_RULES` below (JAX is not installed). The rules read (``jax/_src/lax/parallel.py``, ``jax/_src/core.py``,
  ``shard_map``): a value is varying or invariant per axis, nothing finer (no pending-sum type, no split
  dimension); a binary op meeting an invariant and a varying operand inserts ``pvary`` on the invariant one itself
  (its transpose is a ``psum``: the gradient comes out summed, so a "missing pvary" is no mistake in JAX);
  ``pvary`` of a value already varying over the axis raises ("pvary is a invariant->variant collective");
  ``lax.psum`` of an invariant value ``pvary``s it first (``bind_psum_invariant``) and ``psum_scatter`` too
  (``insert_collective_pvary``): no error, the result is multiplied by the axis size; ``out_specs`` that leave an
  axis unmentioned need the output invariant over it, else ``shard_map`` raises. ``check_vma`` has no partial
  (pending-sum) in or out specs. The reading is of the vma rules alone: a mistake marked † (torch refuses the
  unchecked program: a shape, an index out of range) may meet a shape error in JAX's tracing first.

    python bench/spmd_side_by_side.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (os.path.join(ROOT, "tests", "spmd"), ROOT):
    if _path not in sys.path:
        sys.path.insert(0, _path)

INSTALL = "pip install spmd-types, or pip install 'fmesh[spmd-types]'"

# JAX's check_vma, read: each kind of mistake -> (the verdict, the rule that gives it)
JAX_RULES: dict[str, tuple[str, str]] = {
    "missing pvary": ("no error, right", "a binary op pvary-s the invariant operand itself; its transpose psums "
                      "the gradient"),
    "pvary twice": ("caught", "pvary of a value already varying over the axis raises"),
    "output varying": ("caught", "out_specs leave the axis unmentioned but the output varies over it"),
    "pending sum used": ("passed (silently wrong)", "no pending-sum type: a partial sum is just varying"),
    "wrong reduction": ("passed (silently wrong)", "psum and pmean both take varying, give invariant"),
    "collective of an invariant": ("passed (silently wrong)", "psum_scatter pvary-s an invariant operand first "
                                   "(insert_collective_pvary): the sum counts it axis-size times"),
    "split dimension": ("passed (silently wrong)", "varying/invariant only: no split dimension is tracked"),
    "local positions": ("passed (silently wrong)", "an index built without axis_index is just invariant"),
    "wrong global shape": ("passed (wrong global shape)", "an invariant output under a split out spec is "
                           "allowed"),
    "partial spec": ("not expressible", "check_vma has no partial (pending-sum) in or out specs"),
}

MISTAKE_KINDS: dict[tuple[str, str], str] = {
    ("attention_by_hand", "temperature not pvary-ed"): "missing pvary",
    ("attention_by_hand", "temperature pvary-ed over tp only"): "missing pvary",
    ("attention_one_head_per_member", "output gathered over the heads"): "wrong global shape",
    ("buffer_filled_by_index", "written at the same place on every member"): "local positions",
    ("context_parallel_attention", "causal mask from local positions"): "local positions",
    ("context_parallel_attention", "is_causal with a split sequence"): "split dimension",
    ("context_parallel_attention", "keys not gathered"): "split dimension",
    ("data_parallel_loss", "loss not reduced over dp"): "output varying",
    ("data_parallel_loss", "psum of the members' means"): "wrong reduction",
    ("data_parallel_loss", "weight not pvary-ed"): "missing pvary",
    ("einsum_and_addmm_mlp", "addmm bias on the pending sum"): "pending sum used",
    ("einsum_and_addmm_mlp", "weights not pvary-ed over dp"): "missing pvary",
    ("micro_batch_of_one", "weight not pvary-ed over dp"): "missing pvary",
    ("micro_batch_of_one", "weight pvary-ed twice"): "pvary twice",
    ("norm_over_a_split_hidden", "layer norm over the split dimension"): "split dimension",
    ("pipeline_shift", "loss averaged over the stages"): "wrong reduction",
    ("pipeline_shift", "loss not reduced over the stages"): "output varying",
    ("ring_reduce_scatter", "the pending sum scattered by hand, with no ring"): "partial spec",
    ("row_parallel_partial_output", "weight not pvary-ed over dp"): "partial spec",
    ("running_sum_over_a_split_sequence", "local cumsum"): "split dimension",
    ("sequence_parallel_layer_norm", "weight not pvary-ed"): "missing pvary",
    ("sequence_parallel_layer_norm", "weight pvary-ed over dp only"): "missing pvary",
    ("sequence_parallel_layer_norm", "weight pvary-ed over tp only"): "missing pvary",
    ("sequence_parallel_layer_norm", "weight pvary-ed twice"): "pvary twice",
    ("sequence_parallel_mlp", "all_gather where psum_scatter belongs"): "pending sum used",
    ("sequence_parallel_mlp", "gather at the wrong dimension"): "split dimension",
    ("sequence_parallel_mlp", "no sequence gather"): "split dimension",
    ("sequence_parallel_mlp", "psum then psum_scatter"): "collective of an invariant",
    ("tensor_parallel_mlp", "bias before the psum"): "pending sum used",
    ("tensor_parallel_mlp", "bias not pvary-ed over dp"): "missing pvary",
    ("tensor_parallel_mlp", "input not pvary-ed over tp"): "missing pvary",
    ("tensor_parallel_mlp", "input pvary-ed twice"): "pvary twice",
    ("tensor_parallel_mlp", "pmean for psum"): "wrong reduction",
    ("tensor_parallel_mlp", "psum over the wrong axis"): "output varying",
    ("token_count", "each member's own count"): "output varying",
    ("token_count", "pmean of the sum"): "wrong reduction",
    ("ulysses_all_to_all", "all_to_all dimensions swapped"): "split dimension",
    ("vocab_parallel_cross_entropy", "cross_entropy on the split logits"): "output varying",
    ("vocab_parallel_cross_entropy", "exponentials not summed"): "output varying",  # tp never reduced
    ("vocab_parallel_cross_entropy", "max not reduced"): "split dimension",
    ("vocab_parallel_cross_entropy", "psum of the mean over dp"): "wrong reduction",
    ("vocab_parallel_cross_entropy", "target logit from global positions"): "local positions",
    ("vocab_parallel_embedding", "global ids into the local rows"): "local positions",
}

# The correct programs JAX's check_vma cannot state (every other one: it passes)
JAX_NOT_EXPRESSIBLE = {"ring_reduce_scatter": "partial spec", "row_parallel_partial_output": "partial spec"}


def jax_reading(name: str, bug: str | None) -> tuple[str, str]:
    """JAX check_vma's verdict, read from the rules (not run), and the rule that gives it."""
    if name in JAX_NOT_EXPRESSIBLE:
        verdict, why = JAX_RULES[JAX_NOT_EXPRESSIBLE[name]]
        return verdict, why
    if bug is None:
        return "passed", ""
    return JAX_RULES[MISTAKE_KINDS[(name, bug)]]


def fmesh_verdict(name: str, bug: str | None) -> tuple[str, str, bool]:
    """fmesh's checker, run: the program against one process, checked and unchecked; and whether torch itself
    refuses the unchecked program (a shape or an index out of range: the verdict is then the checked run's)."""
    from spmd_corpus import CORPUS
    from spmd_harness import judge, run

    program = CORPUS[name].program(bug)
    verdict, message = judge(program)
    loud = verdict == "loud"
    if loud:  # torch refuses the unchecked run; does the check refuse it first?
        outcome = run(program, True, [])
        verdict, message = ("caught", outcome.type_error) if outcome.type_error is not None else (
            "torch error", outcome.other_error or "")
    if verdict == "right":
        verdict = "passed"
    first = message.splitlines()[0] if message else ""
    return verdict, first, loud


class _SpmdTypesAx:
    """fmesh's ``ax`` for a body, each call made with spmd-types' collectives (rank 0 of a fake world)."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes

    @staticmethod
    def _axes(axes: str | Sequence[str]) -> tuple[str, ...]:
        return (axes,) if isinstance(axes, str) else tuple(axes)

    @staticmethod
    def _type(x: Any, axis: str) -> Any:
        import spmd_types as st

        return st.get_local_type(x).get(st.current_mesh_names()[axis])  # type: ignore[index]

    def _pending(self, x: Any, axis: str) -> Any:
        import spmd_types as st

        return st.P if self._type(x, axis) is st.P else st.V  # what the program means to reduce: P or V

    def pvary(self, x: Any, axes: str | Sequence[str]) -> Any:
        import spmd_types as st

        for a in self._axes(axes):
            x = st.reinterpret(x, a, src=st.I, dst=st.V)
        return x

    def psum(self, x: Any, axes: str | Sequence[str]) -> Any:
        import spmd_types as st

        for a in self._axes(axes):
            x = st.all_reduce(x, a, src=self._pending(x, a), dst=st.I)
        return x

    def pmean(self, x: Any, axes: str | Sequence[str]) -> Any:
        n = 1
        for a in self._axes(axes):
            n *= self.sizes[a]
        return self.psum(x, axes) / n

    def all_gather(self, x: Any, axis: str, dim: int = 0) -> Any:
        import spmd_types as st

        # R, not I: the gathered value is used beside varying ones (JAX's all_gather returns varying), and its
        # gradient arrives partial, reduce-scattered back (fmesh's and JAX's backward)
        return st.all_gather(x, axis, src=st.S(dim), dst=st.R)

    def psum_scatter(self, x: Any, axis: str, dim: int = 0) -> Any:
        import spmd_types as st

        return st.reduce_scatter(x, axis, src=self._pending(x, axis), dst=st.S(dim))

    def all_to_all(self, x: Any, axis: str, split_dim: int, concat_dim: int) -> Any:
        import spmd_types as st

        return st.all_to_all(x, axis, src=st.S(concat_dim), dst=st.S(split_dim))

    def axis_index(self, axis: str) -> int:
        return 0  # rank 0's coordinate

    def axis_size(self, axis: str) -> int:
        return self.sizes[axis]

    def pmax(self, x: Any, axes: str | Sequence[str]) -> Any:
        import spmd_types as st

        for a in self._axes(axes):  # no max all-reduce in spmd-types: the members' values stacked, then max
            x = st.all_gather(x, a, src=st.V, dst=st.R).amax(0)
        return x

    def ppermute(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("no ppermute")

    def cumsum(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("no scan over an axis")

    def reinterpret(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("no ppermute (the ring's declaration follows one)")


@contextlib.contextmanager
def _fake_world() -> Iterator[None]:
    """A fake 4-rank process group and the (dp=2, tp=2) mesh as spmd-types' current mesh."""
    import spmd_types as st
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    made = not dist.is_initialized()
    if made:
        dist.init_process_group(backend="fake", rank=0, world_size=4, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        with st.set_current_mesh(mesh):
            yield
    finally:
        if made:
            dist.destroy_process_group()


def _spec_types(spec: Any, axes: Sequence[str]) -> dict[str, Any]:
    import spmd_types as st

    types: dict[str, Any] = {}
    for a in axes:
        split = [d for d, e in enumerate(spec.entries) if e == a or (isinstance(e, tuple) and a in e)]
        types[a] = st.S(split[0]) if split else st.P if a in spec.partial else st.I
    return types


def spmd_types_verdict(name: str, bug: str | None) -> tuple[str, str]:
    """spmd-types' verdict on the body, translated (see the module's docstring); raises ImportError without it."""
    import spmd_types as st
    import torch
    from spmd_corpus import CORPUS
    from spmd_harness import block
    from spmd_types.checker import typecheck

    entry = CORPUS[name]
    axes = ("dp", "tp")
    ax = _SpmdTypesAx({"dp": 2, "tp": 2})
    wrong = "passed (silently wrong)" if bug is not None else "passed"
    local = [block(x, spec, 0).clone().requires_grad_(grad)  # rank 0's blocks, made before the types are on
             for x, spec, grad in zip(entry.inputs, entry.in_specs, entry.grads, strict=True)]
    with _fake_world():
        try:
            with typecheck():
                blocks = [st.assert_type(b, _spec_types(spec, axes)) for b, spec in zip(local, entry.in_specs,
                                                                                      strict=True)]
                out = entry.body(ax, *blocks, bug=bug)
                outs = [out] if isinstance(out, torch.Tensor) else list(out)
                for o, spec in zip(outs, entry.out_specs, strict=True):
                    for a in axes:
                        got = ax._type(o, a)
                        want = {st.V} if a in spec.axes else {st.V, st.P} if a in spec.partial else {st.I, st.R}
                        if got not in want:
                            return ("caught (out types)" if bug is not None else "false positive (out types)",
                                    f"output {got!r} over {a!r}, its spec {spec!r}")
        except NotImplementedError as e:  # an operation spmd-types does not have
            return "not expressible", str(e)
        except st.SpmdTypeError as e:
            message = str(e).splitlines()[0].replace("PerMeshAxisLocalSpmdType.", "")
            return ("caught" if bug is not None else "false positive"), message
        except Exception as e:  # torch refused the translated program (a shape, an index out of range)
            return "torch error", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return wrong, ""


def programs(only: Sequence[str] = ()) -> list[tuple[str, str | None]]:
    """Every correct program and every mistake of the corpus (or of the programs named)."""
    from spmd_corpus import CORPUS, MISTAKES

    names = sorted(CORPUS) if not only else list(only)
    out: list[tuple[str, str | None]] = []
    for name in names:
        out.append((name, None))
        out.extend((name, bug) for n, bug in sorted(MISTAKES) if n == name)
    return out


def rows(which: Sequence[tuple[str, str | None]], spmd_types: bool | None = None) -> list[dict[str, str]]:
    """One row per program: its name, mistake, and each column's verdict with the reason."""
    if spmd_types is None:
        try:
            import spmd_types as _  # noqa: F401
            spmd_types = True
        except ImportError:
            spmd_types = False
    out = []
    for name, bug in which:
        fm, _why, loud = fmesh_verdict(name, bug)
        st, st_why = spmd_types_verdict(name, bug) if spmd_types else ("not installed", INSTALL)
        jx, jx_why = jax_reading(name, bug)
        mistake = (bug + (" †" if loud else "")) if bug else "(correct)"
        out.append({"program": name, "mistake": mistake, "fmesh": fm, "spmd-types": st, "spmd-types why": st_why,
                    "jax": jx, "jax why": jx_why,
                    "kind": MISTAKE_KINDS.get((name, bug), "") if bug else ""})
    return out


def _cell(verdict: str, why: str, width: int = 90) -> str:
    why = why.replace("|", "\\|").replace("\n", " ")
    if len(why) > width:
        why = why[:width - 1] + "…"
    return f"{verdict}: {why}" if why else verdict


def table(found: list[dict[str, str]], spmd_types: bool) -> str:
    head = ["program", "mistake", "fmesh (run)"]
    if spmd_types:
        head.append("spmd-types (run)")
    head.append("JAX check_vma (reading, not run)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in found:
        cells = [f"`{r['program']}`", r["mistake"], r["fmesh"]]
        if spmd_types:
            cells.append(_cell(r["spmd-types"], r["spmd-types why"]))
        cells.append(_cell(r["jax"], r["jax why"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(found: list[dict[str, str]], spmd_types: bool) -> str:
    columns = [("fmesh (run)", "fmesh")] + ([("spmd-types (run)", "spmd-types")] if spmd_types else []) + [
        ("JAX check_vma (reading)", "jax")]
    lines = ["| column | on the correct programs | on the mistakes |", "|---|---|---|"]
    for title, key in columns:
        parts = []
        for correct in (True, False):
            counts = Counter(r[key] for r in found if (r["mistake"] == "(correct)") == correct)
            parts.append(", ".join(f"{v} {n}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1])))
        lines.append(f"| {title} | {parts[0]} | {parts[1]} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--only", nargs="*", default=(), help="corpus programs (default: all)")
    args = parser.parse_args(argv)
    try:
        import spmd_types as _  # noqa: F401
        have = True
    except ImportError:
        have = False
        print(f"spmd-types is not installed ({INSTALL}): the fmesh and JAX columns only.\n")
    found = rows(programs(args.only), have)
    print(table(found, have))
    print()
    print(summary(found, have))
    return 0


if __name__ == "__main__":
    sys.exit(main())
