"""A store server this process hosts for others (the launcher's, as torchrun's agent hosts one).

>>> from fmesh.context.launch import free_port
>>> store = host_store(free_port(), 1, timeout=10)
>>> store.set("k", "v"); store.get("k")
b'v'
"""

from __future__ import annotations

import ipaddress
import socket
from datetime import timedelta

import torch.distributed as dist


def host_store(port: int, world_size: int, timeout: float, host: str = "127.0.0.1") -> dist.Store:
    """A store server for ``world_size`` clients, as torchrun's agent hosts one (``host``: the address its clients
    reach it at; loopback by default).

    On an IPv4 loopback address it listens on an IPv4 socket of that address alone: torch's own socket (IPv6, every
    interface) sees each client as ``::ffff:127.0.0.1``, a name no ``/etc/hosts`` has, and asks the name server for
    it at each connection, on the server's one thread: where the name server drops a query, every client's
    operations wait the resolver's timeout (5 s by default). ``127.0.0.1``'s name is in ``/etc/hosts``.
    """
    listener = loopback_listener(host, port)
    return dist.TCPStore(host, port, world_size, is_master=True, timeout=timedelta(seconds=timeout),
                         wait_for_workers=False, master_listen_fd=listener)


def loopback_listener(host: str, port: int) -> int | None:
    """A listening IPv4 socket at ``host``:``port``, its descriptor handed over (the store closes it), where ``host``
    is an IPv4 loopback address; else ``None`` (torch makes its own)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a host name
        return None
    if address.version != 4 or not address.is_loopback:
        return None
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own
        listener.bind((host, port))
        listener.listen(socket.SOMAXCONN)
    except OSError as error:
        listener.close()
        raise dist.DistNetworkError(f"the store could not listen at {host}:{port}: {error}") from error
    return listener.detach()
