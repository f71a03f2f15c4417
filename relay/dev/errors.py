"""The dev tooling's errors: a local server that cannot be prepared or started, a port another
process took, a machine without Java. Every message is one line (the command line prints it as
its stop line; a test fixture fails its tests with it)."""

from __future__ import annotations

from pathlib import Path

from relay.core.errors import EXIT_CONFIG, Action, RelayError


class DevStackError(RelayError):
    """Raised when a local server (mongod, Kafka, a Schema Registry) cannot be prepared or started."""

    action = Action.STOP


class PortTakenError(DevStackError):
    """Raised when a server could not bind a port reserved for it (another process bound it
    between the reservation's check and the server's bind), or a restart needs a port another
    process now holds; names the port and the server's log."""

    def __init__(self, what: str, port: int, log: Path | None, note: str = "") -> None:
        where = f"; log {log}" if log is not None else ""
        super().__init__(f"{what} could not start: port {port} is taken by another process{note}{where}")
        self.what, self.port, self.log = what, port, log

    def after(self, tries: int) -> PortTakenError:
        """The same failure, saying that `tries` starts, each on fresh ports, met a taken port."""
        return PortTakenError(self.what, self.port, self.log, f" (the last of {tries} starts, each on fresh ports)")

    def kept(self) -> PortTakenError:
        """The same failure of a restart, which keeps its ports."""
        return PortTakenError(self.what, self.port, self.log, " (a restart keeps the ports its data and clients know)")


class JavaMissingError(DevStackError):
    """Raised before anything is fetched or started when the Kafka broker or the Schema Registry
    needs a Java 17+ that the machine lacks; exits 2 like any other missing prerequisite."""

    exit_code = EXIT_CONFIG
