"""The corpus (``tests/spmd/spmd_corpus.py``): programs a researcher writes, each exact against one process
checked and unchecked (outputs and every gradient, on the simulated 4-rank world); and mistakes in them, each
refused in the forward pass with a message naming the value, its type and the axis, and printing a fix, which the
test applies (``tests/spmd/spmd_fixes.py``: the fix is the error's record, the message made from it): the
program with every fix it is told made, one after another until the check passes, equals the reference."""

from __future__ import annotations

import inspect

import pytest
from spmd_corpus import CORPUS, MISTAKES
from spmd_fixes import fixed
from spmd_harness import judge, run

import fmesh
from fmesh.spmd.fix import Fix


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_each_program_equals_one_process_checked_and_unchecked(name: str) -> None:
    verdict, message = judge(CORPUS[name].program())
    assert verdict == "right", (verdict, message)


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 15 and len(MISTAKES) >= 40


@pytest.mark.parametrize("name,bug", sorted(MISTAKES))
def test_each_mistake_is_refused_naming_value_type_axis_and_a_fix_that_applied_gives_the_reference(
        name: str, bug: str) -> None:
    entry = CORPUS[name]
    named, fix = MISTAKES[(name, bug)]
    assert bug in inspect.getsource(entry.body)  # the mistake is one of the program's branches
    verdict, _ = judge(entry.program(bug))
    assert verdict in ("caught", "loud"), verdict  # wrong (or so wrong that torch refuses it unchecked)
    outcome = run(entry.program(bug), True, [])  # checked: refused in the forward pass
    message, error = outcome.type_error, outcome.error
    assert message is not None and error is not None
    for word in named:
        assert word in message, (word, message)
    printed = message[message.index("fix:"):]
    assert fix in printed, (fix, message)
    assert isinstance(error.fix, Fix) and error.fix.action != "text", message  # a fix a tool can make ...
    assert printed == f"fix: {error.fix}", (printed, error.fix)  # ... which the message prints
    program, fixes = fixed(entry.program(bug))  # every fix printed, applied, until the check passes
    assert fixes[0] == str(error.fix)
    verdict, why = judge(program)
    assert verdict == "right", (verdict, why, fixes)


def test_a_mistake_raises_in_the_check_before_any_collective() -> None:
    entry = CORPUS["tensor_parallel_mlp"]
    outcome = run(entry.program("bias before the psum"), True, [])
    assert outcome.type_error is not None and "fix:" in outcome.type_error
    assert issubclass(fmesh.SpmdTypeError, ValueError)
