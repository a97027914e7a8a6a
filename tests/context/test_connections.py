"""The sockets a group's creation notes as its own (:mod:`fmesh.context.store.connections`): what a failure cuts."""

from __future__ import annotations

import socket

import torch.distributed as dist

from fmesh.context.store.connections import apart_from_store, open_sockets


def test_a_groups_sockets_leave_out_the_stores_connections_of_this_process() -> None:
    # A group's sockets were every socket that appeared while it was created: with the store hosted in this process
    # (rank 0 of a tcp:// start), the server's side of another rank's new connection was one of them, and cutting the
    # group after a failure cut that rank's connection to the store (its heartbeat, its wait).
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    before = open_sockets()
    client = server.clone()  # another rank's connection, accepted by this process's server; and a client's own
    client.set("k", "v")
    listener = socket.create_server(("127.0.0.1", 0))  # a group's: a listener, a connection and its peer
    peer = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    appeared = open_sockets() - before
    group = apart_from_store(appeared, server.port)
    mine = {sock.fileno() for sock in (listener, peer, accepted)}
    assert {fd for fd, _ in group} == mine, (group, mine, appeared)
    assert len(appeared) == len(mine) + 2  # the store's client, and its server's side of it
    for sock in (peer, accepted, listener):
        sock.close()
