"""Benchmark: what creating one group puts through the store, per member, against the group's size.

    python bench/group_creation.py            # 2 to 8,192 members (about a minute)
    python bench/group_creation.py --quick    # 2 to 512 members, torch up to 4 processes

(a) fmesh's agreement (``fmesh/context/store/agreement.py``) for one group of G members, on a real
    ``TCPStore`` (server and client in this process): every member's ``arrive`` (post a status,
    compare a digest that carries the description, count the arrival), then every member's ``settle``
    (read the verdict). The
    members are simulated one after another, so the figures are the store work alone, with no
    waiting. Beside it, the protocol fmesh used before (each member publishes its description, which
    lists the group's ranks, and reads every other member's), up to 512 members (its bytes per member
    grow with G squared).
(b) What torch's own gloo group creation (``_new_process_group_helper``, the rendezvous every gloo
    group makes, fmesh's included) puts through the store, measured on real processes with a
    counting store, and the same pattern replayed on the TCPStore up to 2,048 members.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import torch
import torch.distributed as dist
from support import CountingStore as Counting  # the tests' counting store: one definition

from fmesh.context.launch import free_port
from fmesh.context.store.agreement import arrive, settle
from fmesh.context.store.board import Board

DESCRIPTION = ("Mesh(pp=8, dp_replicate=16, dp_shard=256, cp=2, tp=16; world=1048576) over Universe(world=1048576, "
               "'cuda', id=f3c2a1b0e9d8c7b6), layouts pp=(8,):(131072,);dp_shard=(256,):(32,); axes ('dp_shard',); "
               "backend nccl; options none; timeout 600s")


def _per_member(counted: list[Counting], seconds: float) -> tuple[float, float, float]:
    """Mean distinct keys and bytes of a member, and µs of store work per member."""
    members = len(counted)
    keys = statistics.mean(len(c.all_keys) for c in counted)
    return keys, statistics.mean(c.all_bytes for c in counted), seconds / members * 1e6


def fmesh_agreement(tcp: dist.Store, members: int, tag: str) -> tuple[float, float, float]:
    """Per member: distinct keys, bytes and µs of fmesh's agreement."""
    for rank in range(members):  # what a Context posts when it starts, not part of creating a group
        Board(tcp, f"bench/{tag}", rank, timedelta(seconds=600)).post("running")
    counted = [Counting(tcp) for _ in range(members)]
    agreements = [Board(counted[rank], f"bench/{tag}", rank, timedelta(seconds=600)) for rank in range(members)]
    started = time.perf_counter()
    for agreement in agreements:
        arrive(agreement, "group", range(members), DESCRIPTION, "the group")
    for agreement in agreements:
        settle(agreement, "group", range(members), DESCRIPTION, "the group")
    return _per_member(counted, time.perf_counter() - started)


def previous_agreement(tcp: dist.Store, members: int, tag: str) -> tuple[float, float, float]:
    """The protocol before: each member sets its description (with the group's ranks) and reads all others'."""
    counted = [Counting(tcp) for _ in range(members)]
    description = f"{DESCRIPTION}, group {list(range(members))}"
    started = time.perf_counter()
    for rank in range(members):
        counted[rank].set(f"bench/{tag}/old/{rank}", description)
    for rank in range(members):
        others = [f"bench/{tag}/old/{m}" for m in range(members) if m != rank]
        counted[rank].wait(others, timedelta(seconds=600))
        counted[rank].multi_get(others)
    return _per_member(counted, time.perf_counter() - started)


def gloo_pattern(tcp: dist.Store, members: int, tag: str, address_bytes: int) -> tuple[float, float, float]:
    """torch's gloo rendezvous replayed: each member publishes its address, then reads every other's."""
    counted = [Counting(tcp) for _ in range(members)]
    started = time.perf_counter()
    for rank in range(members):
        counted[rank].set(f"bench/{tag}/gloo/{rank}", b"x" * address_bytes)
    for rank in range(members):
        counted[rank].multi_get([f"bench/{tag}/gloo/{other}" for other in range(members) if other != rank])
    return _per_member(counted, time.perf_counter() - started)


def _torch_member(ctx: Any) -> dict[str, float]:
    """On a launched rank: create one gloo group of the whole world with torch, through a counting store."""
    from torch.distributed import distributed_c10d as c10d

    import fmesh

    store = Counting(dist.distributed_c10d._get_default_store())
    c10d._new_process_group_helper(ctx.world_size, ctx.rank, list(range(ctx.world_size)), "gloo", store,
                                   "bench-torch-gloo", timeout=timedelta(seconds=60))
    # No rank leaves before every rank's set-up returned: gloo's set-up is done on one side of a pair before the
    # other, and a member that exits then breaks a peer still connecting ("Connection closed by peer", under load).
    ctx.all_reduce(torch.zeros(1), fmesh.make_mesh((ctx.world_size,), ("all",)), "all")
    return {"ops": store.ops, "keys": len(store.all_keys), "bytes": store.all_bytes}


def torch_gloo(worlds: list[int]) -> list[dict[str, float]]:
    import fmesh

    rows = []
    for world in worlds:
        results = fmesh.launch(_torch_member, world, timeout=300)
        rows.append({"members": world, **{k: statistics.mean(r[k] for r in results) for k in results[0]}})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller groups (a smoke run)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    sizes = [2, 8, 32, 128, 512] if args.quick else [2, 8, 32, 128, 512, 2048, 8192]
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}\n")
    torch_rows = torch_gloo([2, 4] if args.quick else [2, 4, 8, 16])
    address = max(1, round(torch_rows[-1]["bytes"] / torch_rows[-1]["members"] / 2 - 40))
    port = free_port()
    tcp = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=600))
    rows = []
    for size in sizes:
        ours = fmesh_agreement(tcp, size, f"f{size}")
        # The others grow with G squared in all: replayed up to where they stay within a minute here.
        before = previous_agreement(tcp, size, f"p{size}") if size <= 512 else None
        gloo = gloo_pattern(tcp, size, f"g{size}", address) if size <= 2048 else None
        rows.append({"members": size, "fmesh": ours, "before": before, "gloo": gloo})

    print("### (a) agreeing on one group, per member, on a real TCPStore (members simulated in one process)\n")
    print("| members | fmesh keys | fmesh bytes | fmesh µs | before: keys | before: bytes | before: µs "
          "| torch gloo rendezvous: keys | bytes | µs |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        keys, nbytes, micros = row["fmesh"]
        before = row["before"]
        old = " | ".join(f"{v:,.0f}" for v in before) if before else "— | — | —"
        gloo = " | ".join(f"{v:,.0f}" for v in row["gloo"]) if row["gloo"] else "— | — | —"
        print(f"| {row['members']:,} | {keys:.0f} | {nbytes:,.0f} | {micros:,.0f} | {old} | {gloo} |")
    print("\nfmesh: post a status, compare a 32-byte digest and the description (one compare_set), count the arrival "
          "(add), read the "
          "verdict; the last to arrive writes it. 'before': the protocol of fmesh 0.1 (each member reads every "
          "other's description). torch gloo rendezvous: each member's address published and every other read "
          f"({address} bytes an address, as measured below), replayed on the same store with one multi_get. "
          "µs: store work per member, all members one after another in this process.\n")
    print("### (b) torch's own gloo group creation, measured on real processes (per member)\n")
    print("| processes | store operations | keys | bytes |")
    print("| ---: | ---: | ---: | ---: |")
    for row in torch_rows:
        print(f"| {row['members']:.0f} | {row['ops']:.0f} | {row['keys']:.0f} | {row['bytes']:,.0f} |")
    print("\nEvery gloo group pays (b) on top of fmesh's agreement, which stays constant; NCCL's rendezvous "
          "instead passes one unique id from the group's first rank to the others.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"agreement": rows, "torch_gloo": torch_rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
