"""The README's snippets (docs/snippets/*.py, shown verbatim in the README: tests/static/
test_readme_snippets.py) run as written against real servers, each as `python <file>` in a child
process with only `RELAY_MONGODB_URI` and `RELAY_KAFKA_BOOTSTRAP_SERVERS` set (what
`outbox-relay dev up` prints to export): the two writers' orders are published by the relay from
the snippets' database `app`; the sync inbox applies the first and stops on SIGTERM, then the
async inbox of the same group applies the second and stops the same way: each order once. Each
inbox prints that it started, each event it applied, and that it stopped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from relay.dev.processes import spawn
from tests.support.paths import ROOT
from tests.support.relays import RelayThread
from tests.support.waiting import wait_until

SNIPPETS = ROOT / "docs" / "snippets"


def _environ(env) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    return kept | {"RELAY_MONGODB_URI": env.servers.mongodb_uri,
                   "RELAY_KAFKA_BOOTSTRAP_SERVERS": env.servers.kafka_bootstrap, "PYTHONPATH": str(ROOT)}


def _run(env, name: str) -> None:
    result = subprocess.run([sys.executable, str(SNIPPETS / name)], env=_environ(env), capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"


def _serve_until(env, name: str, log: Path, applied: set[str]) -> list[str]:
    """Run an inbox snippet until the shipments hold `applied`, then SIGTERM it: it exits 0; the
    lines it printed."""
    with open(log, "wb") as out:
        proc = spawn([sys.executable, str(SNIPPETS / name)], env=_environ(env), stdout=out,
                     stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        shipments = env.client.app.shipments
        wait_until(lambda: {d["_id"] for d in shipments.find()} >= applied or proc.poll() is not None, 120,
                   f"{name} to apply {sorted(applied)}")
        assert proc.poll() is None, f"{name} ended:\n{log.read_text()[-3000:]}"
    finally:
        proc.terminate()
        code = proc.wait(timeout=60)
    assert code == 0, f"{name} exit {code} on SIGTERM:\n{log.read_text()[-3000:]}"
    return log.read_text().splitlines()


def test_the_readme_snippets_run_as_written_writers_relay_and_both_inboxes(env, tmp_path):
    env.client.drop_database("app")
    settings = env.settings.replace(database="app", outbox_collection="outbox",
                                    topic_template="outbox.event.{aggregateType}")
    try:
        env.client.app.create_collection("outbox")
        _run(env, "outbox.py")
        with RelayThread(settings) as relay:
            printed = {"inbox.py": _serve_until(env, "inbox.py", tmp_path / "inbox.log", {"o-1"})}
            _run(env, "async_outbox.py")  # the second order, for the async inbox alone
            printed["async_inbox.py"] = _serve_until(env, "async_inbox.py", tmp_path / "async_inbox.log",
                                                     {"o-1", "o-2"})
        assert {d["aggregateId"] for d in env.client.app.outbox.find()} == {"o-1", "o-2"}
        assert relay.error is None, relay.error
        shipments = {d["_id"]: d["orders"] for d in env.client.app.shipments.find()}
        assert shipments == {
            "o-1": [{"orderId": "o-1", "amount": 12.5, "step": 1}],
            "o-2": [{"orderId": "o-2", "amount": 20.0, "step": 1}],
        }, "each order applied once"
        for name, (order, amount) in {"inbox.py": ("o-1", 12.5), "async_inbox.py": ("o-2", 20.0)}.items():
            own = [line for line in printed[name] if line.startswith(("shipping: ", "applied "))]  # not log lines
            assert own == [
                "shipping: consuming outbox.event.order (Ctrl-C stops)",
                f"applied OrderCreated {order}: {{'orderId': '{order}', 'amount': {amount}, 'step': 1}}",
                "shipping: stopped",
            ], (name, printed[name])
    finally:
        env.client.drop_database("app")
