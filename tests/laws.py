"""Property tests that count: a law must be checked on enough examples, never skipped by an early exit, and must
reach its branches often enough (:class:`Reached`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

# A law whose branches are counted (Reached.floor) draws the same examples every run: its floors judge the strategy,
# not a run's luck (dp_shard reached in 4 of 150 examples against a floor of 7.5, once in a loaded run).
COUNTED = settings(derandomize=True)


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


class Reached:
    """The branches a property's examples reach. Inside the property, :meth:`example` counts one valid example and
    the branches it took (each also a hypothesis ``event``, listed by ``--hypothesis-show-statistics``); after the
    run, :meth:`floor` fails unless each branch was reached in at least its share of the examples, so a strategy
    that drifts away from a branch fails loudly instead of testing less."""

    def __init__(self) -> None:
        self.examples = 0
        self.branches: Counter[str] = Counter()

    def example(self, *branches: str) -> None:
        self.examples += 1
        for branch in set(branches):
            self.branches[branch] += 1
            event(branch)

    def floor(self, shares: dict[str, float]) -> None:
        low = {branch: f"{self.branches[branch]}/{self.examples}" for branch, least in shares.items()
               if self.branches[branch] < least * self.examples}
        assert self.examples and not low, f"branches reached too rarely: {low}, floors {shares}"
