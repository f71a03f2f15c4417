"""rabbitmq-server for the dev stack, the demo and the tests: RabbitMQ 3.10.8 and Erlang/OTP 25 from
Debian 12's packages, fetched into the cache once (set-up time), unpacked with `dpkg-deb -x` (no
root, nothing installed) and run as local processes.

Invariants:
- each .deb is used only when its SHA-256 is the one pinned here (relay.dev.debian); they are
  unpacked into `<cache>/rabbitmq-server-<version>/root`, complete only with its `.complete`
  marker (relay.dev.cached.made_once), written once the unpacked Erlang ran and printed its
  release. The Erlang start scripts (`erl`, `start`) name `/usr/lib/erlang`: that path is
  rewritten to the unpacked folder;
- a server is two processes, stopped by their pids: its own `epmd` (Erlang's port mapper, on a
  port of its own: the node does not start a shared one) and the node (`rabbitmq-server`, a shell
  script waiting on the Erlang VM, both in one process group, which `kill()` SIGKILLs whole);
- everything a server writes is in its folder: the node's database (`mnesia/`: its queues'
  messages, so a restart on the same folder finds them), logs, config, the Erlang cookie (HOME);
  its ports and node name are kept across restarts (the database is the node name's);
- its three ports (AMQP, Erlang distribution, epmd) are reserved loopback ports outside the
  ephemeral range (relay.dev.ports), their locks inherited by epmd and the node; a first start
  whose port turns out taken (the node's log says `eaddrinuse` or `dist_port_already_used`, epmd's
  that another epmd answers there) starts again on fresh ports (relay.dev.processes.start_on_free_ports);
- `start()` returns only once the server takes an AMQP connection; a server that does not come up
  in time raises DevStackError naming its log.

Debian's pool keeps the point release's build of each package (`+deb12uN`); a later point release
replaces it there, and the pins below are updated with it (the download then fails naming the URL).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.cachedir import cache_dir
from relay.dev import debian
from relay.dev.cached import made_once
from relay.dev.ports import Ports
from relay.dev.processes import (
    DevStackError,
    ManagedProcess,
    PortTakenError,
    port_open,
    start_on_free_ports,
    wait_until,
)

VERSION = "3.10.8"
_ERLANG = "1:25.2.3+dfsg-1+deb12u4"
_ERTS = "erts-13.1.5"
_START_TIMEOUT_S = 120.0  # about 15 s on an idle machine; much more beside a busy test suite
_EPMD_TIMEOUT_S = 30.0
_USER, _PASSWORD = "guest", "guest"  # RabbitMQ's default user, allowed from loopback only


def _erlang(name: str, sha256: str) -> debian.DebianPackage:
    return debian.DebianPackage(name, _ERLANG.partition(":")[2], "amd64", "main/e/erlang", sha256)


PACKAGES = (
    debian.DebianPackage(
        "rabbitmq-server",
        "3.10.8-1.1+deb12u1",
        "all",
        "main/r/rabbitmq-server",
        "b88e03a102134e3dbc1ba563e6f678eec29a500a933c00c68c71b45b778cd5b0",
    ),
    _erlang("erlang-base", "71731cddaf081836028de905052c69135a4d288fa804fdae5982ea83bf5b8b61"),
    _erlang("erlang-crypto", "130d7dd83071a2ec545ba1c4f2e9e77be847554b7c04316a870b2e11b5e30e39"),
    _erlang("erlang-eldap", "7fc71b7b4156cd9662bb38ff0f2b423d97d257c092f010902302d684299ed466"),
    _erlang("erlang-inets", "068079f01742b9ebe457ba7285910a2d5c6d8c61895c076fcaaf7ff752548815"),
    _erlang("erlang-mnesia", "94b059c51c41db8b3592e6a070b9341112da4c084d5642c1abffb5069cc642ac"),
    _erlang("erlang-os-mon", "5257825484519284e1fca4a23de511ef30e92f329f14f7aae853c6c5883d1a8b"),
    _erlang("erlang-parsetools", "1a5660cec4ee2a480391d5d7e55e8b4cc49ee05284d34fe6a38327089b6f947f"),
    _erlang("erlang-public-key", "37cb5fcaafa3745918d65c6bafc66a161069944d996074996762697b93128031"),
    _erlang("erlang-runtime-tools", "0bbb1db788ecb8b004470c39ae76a07ceec4c28aa519e548ade1d22781833f6b"),
    _erlang("erlang-ssl", "98c91964be7a4c7f8be1f05ce12318e9dc7aa268ea2814e495c3d0dd54f8a2fe"),
    _erlang("erlang-syntax-tools", "b0b955b477d0a83c39dd96af53053f90d426d110cae6c452fd5b17f4c4dacf4f"),
    _erlang("erlang-tools", "d36612337928437f2ce5bbeebb4bc1013449db8e8efb65affec265039ee4d267"),
    _erlang("erlang-xmerl", "9948872c1e4cfa34cfb273643e02c97acde54a14573cd607aeee6568a29bdc1e"),
    _erlang("erlang-asn1", "a35e1f628f9ee52616be4a00560f9a9a8a0ba484b1b1e1b02696325d0c32ec41"),
    _erlang("erlang-snmp", "b3c995b0a6e0c3eb3955444e83dc07a2dbfc253c280255b68463c1cae6734f83"),
)


@dataclass(frozen=True)
class Installation:
    """The unpacked packages: Erlang's `bin/` and RabbitMQ's `sbin/`."""

    root: Path

    @property
    def erlang_bin(self) -> Path:
        return self.root / "usr/lib/erlang/bin"

    @property
    def server(self) -> Path:
        return self.root / f"usr/lib/rabbitmq/lib/rabbitmq_server-{VERSION}/sbin/rabbitmq-server"


def installed(fetch: bool = True) -> Installation:
    """RabbitMQ and Erlang from the cache, fetched, checked and unpacked first when missing."""
    home = cache_dir() / f"rabbitmq-server-{VERSION}"
    if not (home / ".complete").exists():
        if not fetch:
            raise DevStackError(f"rabbitmq-server {VERSION} not in {home}: run `python -m relay.dev.rabbitmq_server`")
        made_once(home, _install)
    return Installation(home / "root")


def _install(staging: Path) -> str:
    downloads, root = staging / "download", staging / "root"
    with ThreadPoolExecutor(4) as pool:  # 33 MB in 16 files: a few at once
        debs = list(pool.map(lambda p: debian.download(p, downloads), PACKAGES))
    for deb in debs:
        debian.unpack(deb, root)
    shutil.rmtree(downloads)
    erlang = root / "usr/lib/erlang"
    for script in ("bin/erl", "bin/start", f"{_ERTS}/bin/erl", f"{_ERTS}/bin/start"):
        path = erlang / script
        path.write_text(path.read_text().replace("/usr/lib/erlang", str(_final(staging) / "root/usr/lib/erlang")))
    _check_erlang(Installation(root), staging)
    return " ".join(p.filename for p in PACKAGES)


def _final(staging: Path) -> Path:
    """Where `staging` ends up (relay.dev.cached.made_once renames it into place)."""
    return staging.parent / staging.name.rpartition(".partial-")[0]


def _check_erlang(installation: Installation, staging: Path) -> None:
    """The unpacked Erlang runs (through the staging folder: the rewritten scripts name the final one)."""
    erts = installation.root / f"usr/lib/erlang/{_ERTS}/bin/erlexec"
    env = dict(
        os.environ,
        ROOTDIR=str(installation.root / "usr/lib/erlang"),
        BINDIR=str(erts.parent),
        EMU="beam",
        PROGNAME="erl",
    )
    done = subprocess.run(
        [str(erts), "-noshell", "-eval", 'io:format("~s", [erlang:system_info(otp_release)]), halt().'],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    if done.stdout.strip() != "25":
        raise DevStackError(f"the unpacked Erlang in {staging} does not run: {(done.stdout + done.stderr)[-1000:]}")


@dataclass
class RabbitServer:
    """A RabbitMQ node on loopback ports, everything it writes in `base_dir`; its user is RabbitMQ's
    default `guest` (an administrator, allowed from loopback only)."""

    base_dir: Path
    port: int = 0  # AMQP
    dist_port: int = 0
    epmd_port: int = 0
    process: ManagedProcess | None = None
    epmd: ManagedProcess | None = None
    _reserved: Ports = field(default_factory=Ports, repr=False, compare=False)

    @property
    def node(self) -> str:
        return f"rabbit-{self.port}@localhost"

    @property
    def url(self) -> str:
        return self.url_for(_USER, _PASSWORD)

    @property
    def address(self) -> str:
        """The URL without credentials: clients then log in as `guest` (pika's default), so `dev
        up` prints no password."""
        return f"amqp://127.0.0.1:{self.port}/%2F"

    def url_for(self, user: str, password: str) -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{self.port}/%2F"

    def start(self) -> None:
        """Start epmd and the node (on its earlier ports and database after a `kill`); returns once
        the node takes an AMQP connection."""
        installation = installed()
        start_on_free_ports(lambda: self._start_once(installation), fresh=self.process is None)

    def _start_once(self, installation: Installation) -> None:
        """One start on the server's reserved ports; nothing left running if it fails."""
        wanted = [self.port, self.dist_port, self.epmd_port]
        self.port, self.dist_port, self.epmd_port = self._reserved.take(
            wanted, "rabbitmq-server", exact=self.process is not None
        )
        try:
            if self.epmd is None or not self.epmd.alive:  # it outlives a kill of the node
                self._start_epmd(installation)
            self.process = ManagedProcess(
                "rabbitmq-server",
                [str(installation.server)],
                self.base_dir / "rabbitmq.log",
                env=self._environ(installation),
                pass_fds=self._reserved.fds,
            )
            self.process.start()
            wait_until(f"rabbitmq-server on port {self.port}", lambda: port_open(self.port) and self._answers(),
                       _START_TIMEOUT_S, self.process, [self.port, self.dist_port])  # fmt: skip
        except BaseException as exc:
            self.stop_processes()
            if isinstance(exc, PortTakenError):
                self._reserved.refuse(exc.port)
                self.process = self.epmd = None  # never served: the next start is a first start
            raise

    def _start_epmd(self, installation: Installation) -> None:
        """epmd on the server's epmd port (`-d`: its log then says when another answers there)."""
        port = self.epmd_port
        argv = [str(installation.erlang_bin / "epmd"), "-d", "-port", str(port), "-address", "127.0.0.1"]
        self.epmd = ManagedProcess("epmd", argv, self.base_dir / "epmd.log", pass_fds=self._reserved.fds)
        self.epmd.start()
        wait_until(f"epmd on port {port}", lambda: port_open(port), _EPMD_TIMEOUT_S, self.epmd, [port])

    def _environ(self, installation: Installation) -> dict[str, str]:
        folder = self.base_dir
        (folder / "home").mkdir(parents=True, exist_ok=True)
        (folder / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\n")
        (folder / "enabled_plugins").write_text("[].\n")
        (folder / "rabbitmq-env.conf").write_text("")
        return dict(
            os.environ,
            PATH=os.pathsep.join([str(installation.erlang_bin), os.environ.get("PATH", "")]),
            HOME=str(folder / "home"),
            ERL_EPMD_PORT=str(self.epmd_port),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_BASE=str(folder),
            RABBITMQ_MNESIA_BASE=str(folder / "mnesia"),
            RABBITMQ_LOG_BASE=str(folder / "log"),
            RABBITMQ_LOGS="-",  # to stdout: the log file
            RABBITMQ_CONFIG_FILE=str(folder / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(folder / "enabled_plugins"),
            RABBITMQ_CONF_ENV_FILE=str(folder / "rabbitmq-env.conf"),
            RABBITMQ_PID_FILE=str(folder / "rabbitmq.pid"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-start_epmd false",  # its own epmd, started above
        )

    def _answers(self) -> bool:
        import pika

        pika.BlockingConnection(pika.URLParameters(self.url + "?connection_attempts=1&socket_timeout=2")).close()
        return True

    def kill(self) -> None:
        """SIGKILL to the node's process group (the script and the Erlang VM): nothing flushed, the
        database as the crash left it. epmd stays: a restart registers the node again."""
        if self.process is not None and self.process.pid is not None and self.process.alive:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.kill()

    def stop_processes(self) -> None:
        """SIGTERM (the script stops the node cleanly), then epmd; the ports stay reserved."""
        for process in (self.process, self.epmd):
            if process is not None:
                process.stop()

    def stop(self) -> None:
        """Stop the node and epmd, and let the ports go."""
        self.stop_processes()
        self._reserved.release()

    def state(self) -> dict[str, Any]:
        """What `dev up` remembers of it: its URL, ports, both pids and its log."""
        return {
            "url": self.address,
            "port": self.port,
            "dist_port": self.dist_port,
            "epmd_port": self.epmd_port,
            "pid": self.process.pid if self.process else None,
            "epmd_pid": self.epmd.pid if self.epmd else None,
            "log": str(self.process.log_path) if self.process else None,
        }

    def detach(self) -> None:
        """Let the node and epmd outlive this process (`dev up`)."""
        for process in (self.process, self.epmd):
            if process is not None:
                process.detach()


def main() -> int:
    """`python -m relay.dev.rabbitmq_server`: fetch and unpack the packages (set-up), print where."""
    try:
        print(f"rabbitmq-server {VERSION} at {installed().server}")
    except DevStackError as exc:
        print(f"relay.dev.rabbitmq_server: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
