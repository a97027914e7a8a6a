"""The connections of a Context's groups: how many file descriptors they hold, and how to cut them at once.

A gloo group of ``n`` ranks holds a socket per peer (and a listener); torch's ``abort`` of a gloo group
neither wakes a thread blocked in one of its collectives nor tells the peers, who wait the collective
timeout. So :class:`Connections` notes the sockets each group opened (the sockets that appeared while
it was created, with their inodes, so a number the kernel hands out again is never touched), and
:meth:`Connections.sever` shuts them down: the collective this rank is blocked in fails at once, and so
do the peers' (their connection closes), who then name this rank. Listening sockets are left alone
(gloo's listener thread dies on them).

It also keeps the process from running out of file descriptors silently: :func:`descriptor_budget`
says how many are open and the limit, and :meth:`Connections.check_room` warns past 80% of the limit
and raises :class:`~fmesh.errors.FileDescriptorLimitError` before a group that would not fit.

>>> connections = Connections()
>>> connections.halted.is_set(), len(connections)
(False, 0)
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import stat
import struct
import threading
import warnings
from collections.abc import Callable
from typing import TypeVar

from fmesh.errors import FileDescriptorLimitError, FileDescriptorWarning

WARN_SHARE = 0.8  # warn once the open descriptors pass this share of what groups may use
RESERVE = 32  # descriptors left for the program itself (files, logs, the store) when a group is refused
_FD_DIR = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"

Socket = tuple[int, int]  # (file descriptor, inode)
T = TypeVar("T")


def open_sockets() -> frozenset[Socket]:
    """The sockets this process has open, as ``(fd, inode)``.

    >>> isinstance(open_sockets(), frozenset)
    True
    """
    found = set()
    for name in os.listdir(_FD_DIR):
        with contextlib.suppress(OSError, ValueError):
            info = os.stat(f"{_FD_DIR}/{name}")
            if stat.S_ISSOCK(info.st_mode):
                found.add((int(name), info.st_ino))
    return frozenset(found)


def _read_socket(fd: int, read: Callable[[socket.socket], T]) -> T | None:
    """``read`` of an internet stream socket made over a duplicate of ``fd`` (this process's own stays as it is);
    None where ``fd`` is no such socket, or the read fails."""
    try:
        duplicate = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        if duplicate.type != socket.SOCK_STREAM or duplicate.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        return read(duplicate)
    except OSError:
        return None
    finally:
        duplicate.close()


def local_port(fd: int) -> int | None:
    """The port a socket ``fd`` of this process is bound to, or None (not an internet stream socket).

    >>> local_port(-1) is None
    True
    """
    return _read_socket(fd, lambda duplicate: int(duplicate.getsockname()[1]))


def apart_from_store(sockets: frozenset[Socket], port: int | None) -> frozenset[Socket]:
    """Those of ``sockets`` that are not a store's connections at ``port``: neither a client's (it reaches that
    port) nor, in the process that hosts the store, a server's (it is bound to it). What appeared while a group
    was created holds the connections other threads opened to the store meanwhile (a heartbeat's, a wait's), and,
    where this process hosts the store, those its server accepted from other ranks: cutting the group must leave
    them alone.

    >>> apart_from_store(frozenset(), 29500)
    frozenset()
    """
    if port is None:
        return sockets
    return frozenset((fd, inode) for fd, inode in sockets
                     if local_port(fd) != port and ((peer := peer_of(fd)) is None or peer[1] != port))


def descriptor_budget() -> tuple[int, int]:
    """``(open, limit)``: file descriptors open in this process, and its soft limit (``ulimit -n``).

    >>> used, limit = descriptor_budget(); 0 < used <= limit
    True
    """
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return len(os.listdir(_FD_DIR)), (limit if limit != resource.RLIM_INFINITY else 1 << 30)


def group_cost(size: int) -> int:
    """The file descriptors a gloo group of ``size`` ranks is estimated to take on each member (a socket per
    peer and one to listen, with room for the backend's own).

    >>> group_cost(4)
    10
    """
    return 2 * size + 2


def shut(sockets: frozenset[Socket]) -> None:
    """Shut down every connected socket of ``sockets`` still open under the same inode; never raises."""
    for fd, inode in sockets:
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino != inode:
                continue  # closed, and the number given to something else
            duplicate = socket.socket(fileno=os.dup(fd))
            try:
                if not duplicate.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    duplicate.shutdown(socket.SHUT_RDWR)
            finally:
                duplicate.close()


def peer_of(fd: int) -> tuple[str, int] | None:
    """The address and port a connected socket ``fd`` of this process reaches (IPv4 mapped into IPv6 shown as
    IPv4), or None (not a connected stream socket).

    >>> peer_of(-1) is None
    True
    """
    def peer(duplicate: socket.socket) -> tuple[str, int]:
        address, port = duplicate.getpeername()[:2]
        return str(address).removeprefix("::ffff:"), int(port)

    return _read_socket(fd, peer)


def sockets_to(host: str, port: int) -> frozenset[Socket]:
    """The connected sockets of this process that reach ``host:port`` (a store's clients).

    >>> sockets_to("127.0.0.1", 1)
    frozenset()
    """
    try:
        addresses = {str(info[4][0]).removeprefix("::ffff:") for info in socket.getaddrinfo(host, port)}
    except (OSError, UnicodeError):
        return frozenset()
    return frozenset((fd, inode) for fd, inode in open_sockets()
                     if (peer := peer_of(fd)) is not None and peer[1] == port and peer[0] in addresses)


def bound_replies(sockets: frozenset[Socket], seconds: float) -> None:
    """Make a read on each of ``sockets`` that waits ``seconds`` for a byte fail (``SO_RCVTIMEO``), and a write too;
    never raises. A store client blocked on a host that stopped answering fails then, instead of waiting as long as
    the host stays stopped (torch's client timeout bounds only its waits for keys)."""
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
    for fd, inode in sockets:
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino != inode:
                continue
            duplicate = socket.socket(fileno=os.dup(fd))
            try:
                duplicate.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
                duplicate.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
            finally:
                duplicate.close()


class Connections:
    """The sockets of each group of one Context (by group name), and whether the Context was aborted."""

    def __init__(self) -> None:
        self._sockets: dict[str, frozenset[Socket]] = {}
        self._cut: set[str] = set()  # groups severed: broken for good (shrunk by a recovery, or aborted; never reused)
        self._warned = False
        # Set by ctx.abort() (any thread, a signal handler): every wait of the Context ends at its next poll.
        self.halted = threading.Event()

    def note(self, name: str, sockets: frozenset[Socket]) -> None:
        """The group ``name`` opened ``sockets`` (those that appeared while it was created: :func:`open_sockets`)."""
        self._sockets[name] = sockets

    def check_room(self, size: int, held: int, what: str) -> None:
        """Warn once past :data:`WARN_SHARE` of the descriptor limit; :class:`~fmesh.errors.FileDescriptorLimitError`
        if a group of ``size`` would leave fewer than :data:`RESERVE` (``held`` groups exist)."""
        used, limit = descriptor_budget()
        need = group_cost(size)
        advice = (f"raise the limit (ulimit -n {max(4 * limit, 65536)} before starting, or resource.setrlimit("
                  "resource.RLIMIT_NOFILE, ...)), or use fewer distinct groups (ctx.plan(...) lists them)")
        if used + need > limit - RESERVE:
            raise FileDescriptorLimitError(
                f"creating {what} needs about {need} more file descriptors, but this process has {used} open of its "
                f"limit of {limit} ({held} groups held by this context); {advice}")
        if not self._warned and used + need > WARN_SHARE * (limit - RESERVE):
            self._warned = True
            warnings.warn(f"fmesh: {used + need} of this process's {limit} file descriptors in use after creating "
                          f"{what} ({held + 1} groups); at the limit fmesh refuses new groups: {advice}",
                          FileDescriptorWarning, stacklevel=4)

    def sever(self, name: str) -> None:
        """Cut the group ``name``'s connections (see the module docstring); never raises, never waits. The group is
        broken for good (:meth:`was_cut`)."""
        self._cut.add(name)
        shut(self._sockets.pop(name, frozenset()))

    def was_cut(self, name: str) -> bool:
        """Whether the group ``name`` was cut (:meth:`sever`): a failure broke it, so it is never used again, nor
        destroyed in the orderly way (which would wait for its broken members): only aborted, or shrunk by a
        recovery (NCCL's ``SHRINK_ABORT`` ends its work first)."""
        return name in self._cut

    def sever_all(self) -> None:
        """Cut every group's connections."""
        for name in list(self._sockets):
            self.sever(name)

    def take(self, name: str) -> frozenset[Socket]:
        """The sockets of group ``name``, no longer tracked here (a recovered context tracks them)."""
        return self._sockets.pop(name, frozenset())

    def forget(self, name: str) -> None:
        """The group ``name`` was destroyed in the orderly way: its sockets are closed (their numbers reused)."""
        self._sockets.pop(name, None)

    def __len__(self) -> int:
        return len(self._sockets)
