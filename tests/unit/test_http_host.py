"""RELAY_HTTP_HOST: the address the HTTP server binds (default 0.0.0.0, as before)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from relay.config import Settings
from relay.core.errors import ConfigError
from relay.dev.processes import free_port
from relay.ops.health import Health, serve


def test_the_default_binds_every_interface_as_before() -> None:
    settings = Settings()
    assert settings.http_host == "0.0.0.0"
    assert settings.parts().observer.http_host == "0.0.0.0"
    assert Settings.load(env={"RELAY_HTTP_HOST": "127.0.0.1"}).parts().observer.http_host == "127.0.0.1"


def test_the_server_binds_the_configured_address_and_shows_no_configuration() -> None:
    port = free_port()
    server = serve(port, Health(Settings().parts().observer.health), CollectorRegistry(), "127.0.0.1")
    assert server is not None
    try:
        assert server.server_address == ("127.0.0.1", port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5) as answer:
            assert set(json.loads(answer.read())) == {"ok", "role", "lastTurnSecondsAgo"}
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("host", ["192.0.2.1", "no-such-host.invalid"])
def test_an_address_that_cannot_be_bound_names_the_setting(host: str) -> None:
    with pytest.raises(ConfigError) as refused:
        serve(free_port(), Health(Settings().parts().observer.health), CollectorRegistry(), host)
    assert refused.value.setting == "RELAY_HTTP_HOST"
    assert host in str(refused.value)
