"""What waiting costs the store host: per member, a constant number of store operations, however long a member is
late and however many members wait (threads of this process against one real ``TCPStore``, each member with its
own counting connection)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist
from support import in_threads

from fmesh.context.agreement import Agreement

BOUND = 16  # store operations per member, the bound (#27)


class MemberStore:
    """One member's connection to a shared store, counting its operations (its second connection's too)."""

    def __init__(self, inner: Any, counts: dict[int, int], rank: int) -> None:
        self.inner, self.counts, self.rank = inner, counts, rank

    def clone(self) -> MemberStore:
        return MemberStore(self.inner.clone(), self.counts, self.rank)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        call = getattr(self.inner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            with LOCK:
                self.counts[self.rank] = self.counts.get(self.rank, 0) + 1
            return call(*args, **kwargs)

        return counted


LOCK = threading.Lock()


def tcp_store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=120), wait_for_workers=False,
                         use_libuv=True)


def agreement_costs(size: int, late: float) -> dict[int, int]:
    """Each member's store operations for one agreement of ``size`` members in which the last is ``late``."""
    server, counts = tcp_store(), {}
    for rank in range(size):  # as every Context does at its start: its status is there before any agreement
        Agreement(server, "ops", rank, timedelta(seconds=120)).post("running")

    def member(rank: int) -> None:
        store = MemberStore(server.clone(), counts, rank)
        agreement = Agreement(store, "ops", rank, timedelta(seconds=120), grace=1.0)  # type: ignore[arg-type]
        if rank == size - 1:
            time.sleep(late)
        agreement.agree("group", range(size), "Mesh(dp=N)", "the dp group")

    in_threads(member, list(range(size)), timeout=120 + late)
    return counts


@pytest.mark.parametrize("size, late", [(64, 2.0), (2048, 2.0), pytest.param(64, 8.0, marks=pytest.mark.slow)])
def test_an_agreement_with_a_late_member_costs_each_member_a_constant_number_of_operations(size: int,
                                                                                          late: float) -> None:
    counts = agreement_costs(size, late)
    assert len(counts) == size
    assert max(counts.values()) <= BOUND, sorted(counts.items(), key=lambda kv: -kv[1])[:4]
