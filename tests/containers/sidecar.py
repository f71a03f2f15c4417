"""The relay image as a running container (testcontainers, host network) for the tests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from testcontainers.core.container import DockerContainer

from relay.config import Settings
from relay.dev.processes import free_port
from tests.support.relays import settings_env
from tests.support.waiting import wait_until


def container_env(settings: Settings) -> dict[str, str]:
    """The RELAY_* settings alone (the image sets PATH, the log format and its own defaults)."""
    return {k: v for k, v in settings_env(settings).items() if k.startswith("RELAY_") and k != "RELAY_LOG_FORMAT"}


class Sidecar:
    """One relay container: `outbox-relay run` as uid 10001 on a read-only root, host network."""

    def __init__(self, image: str, settings: Settings) -> None:
        self.port = free_port()
        self.settings = settings.replace(http_port=self.port)
        self.container = DockerContainer(image).with_kwargs(network_mode="host", read_only=True)
        for key, value in container_env(self.settings).items():
            self.container.with_env(key, value)

    def start(self, role: str | None = "leader") -> Sidecar:
        self.container.start()
        if role is not None:
            wait_until(lambda: self.health("/readyz")[1].get("role") == role, 90, f"the container to be {role}")
        return self

    @property
    def docker(self) -> Any:
        return self.container.get_wrapped_container()

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return 0, b"{}"

    def health(self, path: str) -> tuple[int, dict[str, Any]]:
        status, body = self.get(path)
        try:
            return status, dict(json.loads(body))
        except ValueError:
            return status, {}

    def healthcheck(self, test: list[str]) -> int:
        """Run the image's HEALTHCHECK `test` (["CMD", argv...]) in the container, as the engine
        does; its exit code."""
        assert test[0] == "CMD", test
        return int(self.docker.exec_run(test[1:]).exit_code)

    def logs(self) -> list[str]:
        return [line for line in self.docker.logs().decode(errors="replace").splitlines() if line.strip()]

    def signal(self, name: str) -> None:
        self.docker.kill(signal=name)

    def stop(self, grace: float = 60) -> int:
        """SIGTERM (the image's STOPSIGNAL), then the exit code (SIGKILL after `grace` s)."""
        self.docker.stop(timeout=int(grace))
        return int(self.docker.wait(timeout=grace + 30)["StatusCode"])

    def remove(self) -> None:
        try:
            self.docker.remove(force=True)
        except Exception:  # already gone  # noqa: BLE001
            pass
