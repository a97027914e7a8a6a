"""The corpus (``tests/spmd/spmd_corpus.py``): programs a researcher writes, each exact against one process
checked and unchecked (outputs and every gradient, on the simulated 4-rank world); and mistakes in them, each
refused in the forward pass with a message naming the value, its type and the axis, and printing the fix that
the right program applies (the test finds the printed fix in the right program's source and runs that program)."""

from __future__ import annotations

import inspect
import re

import pytest
from spmd_corpus import CORPUS, MISTAKES, OTHER_WAY
from spmd_harness import judge, run

import fmesh


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_each_program_equals_one_process_checked_and_unchecked(name: str) -> None:
    verdict, message = judge(CORPUS[name].program())
    assert verdict == "right", (verdict, message)


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 15 and len(MISTAKES) >= 40


def _normal(code: str) -> str:
    return re.sub(r"\s+", "", code).replace('"', "'")


@pytest.mark.parametrize("name,bug", sorted(MISTAKES))
def test_each_mistake_is_refused_naming_value_type_axis_and_the_fix_the_right_program_applies(
        name: str, bug: str) -> None:
    entry = CORPUS[name]
    named, fix = MISTAKES[(name, bug)]
    assert bug in inspect.getsource(entry.body)  # the mistake is one of the program's branches
    verdict, _ = judge(entry.program(bug))
    assert verdict in ("caught", "loud"), verdict  # wrong (or so wrong that torch refuses it unchecked)
    message = run(entry.program(bug), True, []).type_error  # checked: refused in the forward pass
    assert message is not None
    for word in named:
        assert word in message, (word, message)
    printed = message[message.index("fix:"):]
    assert fix in printed, (fix, message)
    code = fix.split("(")[0] + "(" if "(" in fix else None
    # the collective the fix names is in the right program
    if code is not None and code.startswith("ax.") and (name, bug) not in OTHER_WAY:
        assert _normal(code) in _normal(inspect.getsource(entry.body)), (fix, name)
    assert judge(entry.program())[0] == "right"  # the fixed program equals the reference


def test_a_mistake_raises_in_the_check_before_any_collective() -> None:
    entry = CORPUS["tensor_parallel_mlp"]
    outcome = run(entry.program("bias before the psum"), True, [])
    assert outcome.type_error is not None and "fix:" in outcome.type_error
    assert issubclass(fmesh.SpmdTypeError, ValueError)
