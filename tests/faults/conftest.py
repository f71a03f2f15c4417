"""Fixtures the fault tests share: a three-member replica set (elections, step-downs)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymongo
import pytest
from pymongo.errors import AutoReconnect, WriteConcernError
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from tests.conftest import Env
from tests.support.servers import replica_set


@pytest.fixture(scope="module")
def rs3(session_servers: Any) -> Iterator[Any]:
    """A three-member replica set of the module's own, stopped by process id at its end."""
    with replica_set("outbox-relay-rs3-", members=3) as rs:
        yield rs


@pytest.fixture
def env3(env: Env, rs3: Any) -> Iterator[Env]:
    """The test's settings on the three-member replica set (the outbox there, and an inbox too)."""
    settings = env.settings.replace(mongodb_uri=rs3.uri)
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(rs3.uri, tz_aware=True)
    client[settings.database].create_collection(settings.outbox_collection)
    try:
        yield Env(env.servers, settings, client)
    finally:
        # A test that stepped the primary down may leave an election settling: the drop (idempotent)
        # is interrupted (InterruptedDueToReplStateChange, a write concern error) or finds no
        # primary for a moment, so it is tried again for up to 30 s.
        try:
            for attempt in Retrying(stop=stop_after_delay(30), wait=wait_fixed(0.5), reraise=True,
                                    retry=retry_if_exception_type((AutoReconnect, WriteConcernError))):
                with attempt:
                    client.drop_database(settings.database)
        finally:
            client.close()
