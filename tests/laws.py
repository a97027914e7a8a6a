"""Property tests that count: a law must be checked on enough examples, never skipped by an early exit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st


def holds(law: Callable[..., None], *strategies: st.SearchStrategy[Any], at_least: int = 100) -> int:
    """Check ``law`` on examples drawn from ``strategies`` (examples it rejects with ``assume`` are
    redrawn); fail unless it ran to its end on ``at_least`` of them. Returns that count."""
    checked: list[None] = []

    def check(*example: Any) -> None:
        law(*example)
        checked.append(None)

    # @given needs a fixed signature (no *args): one wrapper per arity.
    if len(strategies) == 1:
        given(strategies[0])(lambda a: check(a))()
    elif len(strategies) == 2:
        given(strategies[0], strategies[1])(lambda a, b: check(a, b))()
    else:
        raise TypeError(f"holds() takes one or two strategies, got {len(strategies)}")
    assert len(checked) >= at_least, f"{law.__name__} was checked on only {len(checked)} examples"
    return len(checked)
