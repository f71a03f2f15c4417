"""Ports for the servers the project starts: outside the kernel's ephemeral range, and reserved
so that no two processes on the machine are handed the same one.

Why (issue 50): a port the OS picks (`bind` to port 0, closed, its number handed on) lies in the
ephemeral range, from which every outgoing connection on the machine also takes its local port,
and the server binds it seconds later (a JVM's start, a storage format). On a busy machine some
other process had it by then: a Kafka controller port, 148 errors in one run of the suite.

How:
- **The range.** Ports come from 10000-65535 less the range the kernel hands out
  (`/proc/sys/net/ipv4/ip_local_port_range`; where it cannot be read, 32768-65535, which covers
  Linux's default and the IANA one BSD and macOS use). No outgoing connection takes them, and the
  servers users run on well-known ports (27017, 9092, 8080) are below it or answer the bind check.
- **The reservation.** A reserved port holds an exclusive `flock` on
  `/tmp/outbox-relay-ports/<port>.lock` (one folder for the machine: every pytest-xdist worker,
  clone, demo and user sees it), taken without waiting, and the port could be bound on loopback
  (with SO_REUSEADDR, as the servers bind) once the lock was held. A lock belongs to its open file
  description: the reserving process holds it, and a server started with the reservation's
  descriptor (`Ports.fds`, passed to the child) holds it too, so a detached `dev up` stack keeps
  its ports after the command exits. The kernel drops the lock when the last holder closes it or
  dies, a crash included: nothing stale to clean up.

Invariants:
- at most one reservation on the machine holds a port at a time (the lock); a reserved port was
  bindable on 127.0.0.1 after its lock was taken;
- a lock file is deleted only by a process holding its lock, and a lock counts only while the file
  it locked is still the one at its path (checked after locking), so a deletion never lets two
  reservations hold one port;
- a server that still fails to bind its port (a process outside the project took it after the
  check) is started again on fresh ports by its owner (relay.dev.processes.start_on_free_ports).

Considered and not taken: Google's `portpicker` (PyPI) reserves only through its port server, a
daemon every machine would have to run; without it, it checks a bind and (since 1.5.1) tries the
OS's pick first, in the ephemeral range. `ephemeral-port-reserve` leaves an ephemeral port in
TIME_WAIT, which keeps only other port-0 binds off it. testcontainers lets the container engine
bind the host port, held from the start: not available to a plain process. A lock file per port
is what Core Lightning's test framework moved to for pytest-xdist.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import random
import socket
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

from relay.dev.errors import DevStackError, PortTakenError

# One folder for the machine, whatever TMPDIR each process has: every user, clone and worker.
LOCK_DIR = Path("/tmp/outbox-relay-ports")
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_FALLBACK_EPHEMERAL = (32768, 65535)  # Linux's default range and IANA's dynamic ports together
_LOWEST = 10000  # below: the well-known defaults of servers a developer runs
_CANDIDATES = 400  # ports tried for one reservation before giving up


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), both included; 32768-65535 when `path`
    cannot be read or holds no range."""
    try:
        first, last = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return _FALLBACK_EPHEMERAL
    return (first, last) if 0 < first <= last <= 65535 else _FALLBACK_EPHEMERAL


def candidates(ephemeral: tuple[int, int] | None = None) -> list[int]:
    """Every port a reservation may hand out: 10000-65535 outside the ephemeral range (1024 and
    up when that leaves fewer than 1000). DevStackError when the range covers them all."""
    first, last = ephemeral if ephemeral is not None else ephemeral_range()
    for lowest in (_LOWEST, 1024):
        ports = [p for p in range(lowest, 65536) if not first <= p <= last]
        if len(ports) >= 1000:
            return ports
    if ports:
        return ports
    raise DevStackError(
        f"no port outside the ephemeral range {first}-{last} (net.ipv4.ip_local_port_range) is left for the servers"
    )


def bindable(port: int) -> bool:
    """Whether a server could bind `port` on 127.0.0.1 now (SO_REUSEADDR, as the servers set it:
    a port left in TIME_WAIT by a stopped server counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class Reservation:
    """One reserved port: its lock held through `fileno()` until `release()` (or this process's
    exit, or every server that inherited the descriptor ending)."""

    def __init__(self, port: int, fd: int) -> None:
        self.port = port
        self._fd: int | None = fd
        _live.add(self)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def fileno(self) -> int:
        if self._fd is None:
            raise DevStackError(f"port {self.port}'s reservation was released")
        return self._fd

    def release(self) -> None:
        """Let the port go; its lock file is deleted when no server holds the lock any more."""
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None
        again = _lock(self.port)
        if again is not None:  # nobody holds it: delete the file while holding its lock
            with contextlib.suppress(OSError):
                (LOCK_DIR / f"{self.port}.lock").unlink()
            os.close(again)

    def __repr__(self) -> str:
        return f"Reservation({self.port}, {'held' if self.held else 'released'})"


# Every reservation of this process not yet released: released at exit, so their lock files go
# too (a process that is killed leaves its files behind; the next reservation of the port reuses
# and deletes them).
_live: weakref.WeakSet[Reservation] = weakref.WeakSet()


@atexit.register
def _release_live() -> None:
    for reservation in list(_live):
        reservation.release()


def _lock_dir() -> Path:
    if not LOCK_DIR.is_dir():
        with contextlib.suppress(FileExistsError):
            LOCK_DIR.mkdir()
            LOCK_DIR.chmod(0o1777)  # every user reserves here; the sticky bit keeps files their owner's
    if not os.access(LOCK_DIR, os.W_OK | os.X_OK):
        raise DevStackError(f"cannot reserve server ports: {LOCK_DIR} is not writable (make it mode 1777)")
    return LOCK_DIR


def _open(path: Path) -> int | None:
    """A descriptor on the lock file, created if missing: an existing file is opened without
    O_CREAT (fs.protected_regular refuses O_CREAT on another user's file in a sticky folder).
    None if another user's file cannot be opened at all."""
    for _ in range(3):
        try:
            return os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            pass
        except PermissionError:
            return None
        try:
            return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue  # created by another process in between: open it
    return None


def _lock(port: int) -> int | None:
    """An open descriptor holding `port`'s lock, or None when another reservation holds it."""
    path = _lock_dir() / f"{port}.lock"
    for _ in range(3):
        fd = _open(path)
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # its holder deleted the file as we opened it: lock the one at the path now
    return None


def reserve_port(port: int, check: bool = True) -> Reservation | None:
    """`port` reserved, or None when another reservation holds it or (with `check`) something
    else is bound to it."""
    fd = _lock(port)
    if fd is None:
        return None
    if check and not bindable(port):
        os.close(fd)
        return None
    return Reservation(port, fd)


def reserve(count: int = 1, prefer: Sequence[int] = (), avoid: Sequence[int] = ()) -> list[Reservation]:
    """`count` ports reserved, outside the ephemeral range; the i-th is `prefer[i]` when that can
    be reserved (a port a stack used before), else a random free one, never one in `avoid`.
    DevStackError when no free port turns up in 400 tries."""
    pool = candidates()
    refused = set(avoid)
    got: list[Reservation] = []
    rng = random.Random()
    try:
        for i in range(count):
            wanted = prefer[i] if i < len(prefer) else 0
            reservation = reserve_port(wanted) if wanted and wanted not in refused else None
            for port in () if reservation is not None else rng.sample(pool, min(_CANDIDATES, len(pool))):
                if port in refused or any(r.port == port for r in got):
                    continue
                if (reservation := reserve_port(port)) is not None:
                    break
            if reservation is None:
                raise DevStackError(f"no free port among {_CANDIDATES} tried outside the ephemeral range")
            got.append(reservation)
    except BaseException:
        for reservation in got:
            reservation.release()
        raise
    return got


class Ports:
    """The ports one server holds (a replica set's members, a broker's listener and controller),
    reserved together and released together. `take` keeps what is held, so a server restarted
    after a kill keeps its ports; after `release()` the numbers are wanted again first."""

    def __init__(self) -> None:
        self._held: list[Reservation] = []
        self._refused: set[int] = set()

    @property
    def numbers(self) -> list[int]:
        return [r.port for r in self._held]

    @property
    def fds(self) -> tuple[int, ...]:
        """The descriptors a server started on these ports inherits, holding their locks as long
        as it runs."""
        return tuple(r.fileno() for r in self._held if r.held)

    def take(self, wanted: Sequence[int], what: str, exact: bool = False) -> list[int]:
        """The numbers of `len(wanted)` reserved ports: `wanted[i]` when held or free (0: any
        port), else a fresh one. With `exact` (a server whose data or clients know its ports)
        each wanted port is locked without the bind check, the server's own bind being the check
        (its log then says why), and one another reservation holds raises PortTakenError."""
        held = {r.port: r for r in self._held if r.held}
        keep: list[Reservation] = []
        try:
            for port in wanted:
                if port in held:
                    keep.append(held.pop(port))
                    continue
                if exact and port:
                    reservation = reserve_port(port, check=False)
                    if reservation is None:
                        raise PortTakenError(what, port, None, " (reserved there)")
                else:
                    prefer = [port] if port and port not in self._refused else []
                    avoid = [*self._refused, *(r.port for r in keep)]
                    reservation = reserve(1, prefer=prefer, avoid=avoid)[0]
                keep.append(reservation)
        except BaseException:
            for reservation in keep:
                if reservation not in self._held:
                    reservation.release()
            raise
        for leftover in held.values():
            leftover.release()
        self._held = keep
        return self.numbers

    def refuse(self, port: int) -> None:
        """Give up `port` (a server could not bind it): the next `take` picks another."""
        self._refused.add(port)
        for reservation in self._held:
            if reservation.port == port:
                reservation.release()
        self._held = [r for r in self._held if r.port != port]

    def release(self) -> None:
        for reservation in self._held:
            reservation.release()
        self._held = []


_kept: list[Reservation] = []
_kept_lock = threading.Lock()


def held_port() -> int:
    """A reserved port this process keeps until it exits: for a server started without a
    reservation of its own (a relay's HTTP port, Spark's daemons, a container's published port)
    and for an address nothing must answer on."""
    reservation = reserve(1)[0]
    with _kept_lock:
        _kept.append(reservation)
    return reservation.port
