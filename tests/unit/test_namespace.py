"""An outbox as a `Namespace` (relay.core.namespace): parsed once, shown as it always was."""

from __future__ import annotations

import pytest

from relay.config import Settings
from relay.core.errors import ConfigError
from relay.core.namespace import Namespace, NamespaceError
from relay.core.partitions import Partition, Scope, route_of
from relay.mongo.pipeline import StreamPlan


def test_a_namespace_parses_at_the_first_dot_and_shows_as_its_text():
    ns = Namespace.parse("app.orders.v2")
    assert (ns.database, ns.collection) == ("app", "orders.v2")
    assert str(ns) == "app.orders.v2"
    assert Namespace.of("app.outbox") == Namespace("app", "outbox") == Namespace.of(Namespace("app", "outbox"))


@pytest.mark.parametrize(("text", "says"), [
    ("outbox", "expected database.collection, got 'outbox'"),
    ("app.", "no collection in app.''"),
    (".outbox", "not a database name: ''"),
    ("a$b.outbox", "not a database name: 'a$b'"),
])
def test_a_malformed_namespace_is_refused_naming_what_is_wrong(text, says):
    with pytest.raises(NamespaceError) as raised:
        Namespace.parse(text)
    assert says in str(raised.value)


def test_user_visible_strings_keep_their_text():
    scope = Scope("app.outbox", Partition(2, 4))  # a text is parsed
    assert scope.namespace == Namespace("app", "outbox")
    assert scope.lease_id == "app.outbox#2/4" and str(scope) == "app.outbox#2/4"
    assert Scope(Namespace("app", "outbox")).lease_id == "app.outbox"
    settings = Settings.load(env={"RELAY_OUTBOXES": "app.a, shop.b"})
    assert settings.outbox_namespaces == ("app.a", "shop.b")
    assert settings.namespaces == (Namespace("app", "a"), Namespace("shop", "b"))
    assert settings.parts().loop.outboxes == "app.a,shop.b" and settings.parts().loop.lease_id is None


def test_a_malformed_outbox_setting_names_the_setting():
    with pytest.raises(ConfigError, match="RELAY_OUTBOXES.*expected database.collection outboxes, got 'nodot'"):
        Settings.load(env={"RELAY_OUTBOXES": "app.a,nodot"}).parts()


def test_the_route_formula_is_outbox_index_times_partitions_plus_partition():
    plan = StreamPlan(("app.a", "app.b", "app.c"), 3, "app")
    assert [plan.route(Scope("app.c", Partition(k, 3))) for k in range(3)] == [route_of(2, 3, k) for k in range(3)]
    assert route_of(2, 3, 1) == 7
    assert plan.routes_of("app", "b") == [3, 4, 5], "a drop of b ends b's partitions only"
    assert plan.routes_of("app", None) == [-1], "a dropDatabase ends every route"
