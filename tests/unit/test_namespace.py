"""An outbox as a `Namespace` (relay.core.namespace): parsed once, shown as it always was."""

from __future__ import annotations

import dataclasses

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
    assert Namespace.parse("app.outbox") == Namespace("app", "outbox")


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
    scope = Scope(Namespace("app", "outbox"), Partition(2, 4))
    assert scope.lease_id == "app.outbox#2/4" and str(scope) == "app.outbox#2/4"
    assert Scope(Namespace("app", "outbox")).lease_id == "app.outbox"
    settings = Settings.load(env={"RELAY_OUTBOXES": "app.a, shop.b"})
    assert settings.namespaces == (Namespace("app", "a"), Namespace("shop", "b"))
    assert [str(n) for n in settings.namespaces] == ["app.a", "shop.b"]
    assert Settings.load(env={"RELAY_DATABASE": "shop"}).namespaces == (Namespace("shop", "outbox"),)


def test_the_part_configs_hold_the_outboxes_once():
    """`PartConfigs.outboxes` is the one copy: no part's configuration holds the list again (the
    wiring hands a part the outboxes, or one of them: `encoding_for`)."""
    parts = Settings.load(env={"RELAY_OUTBOXES": "app.a, shop.b"}).parts()
    assert parts.outboxes == (Namespace("app", "a"), Namespace("shop", "b"))
    copies = [
        f"{part.name}.{f.name}"
        for part in dataclasses.fields(parts)
        if dataclasses.is_dataclass(config := getattr(parts, part.name))
        for f in dataclasses.fields(config)
        if f.name == "outboxes"
    ]
    assert copies == []
    assert parts.encoding_for(Namespace("shop", "b")).event_topic_template == "outbox.event.{aggregateType}"
    assert parts.encoding_for(Namespace("shop", "b")).cloudevents_source == "/outbox-relay/shop/b"


def test_the_security_role_is_titled_with_every_outbox():
    from relay.commands.security import role

    settings = Settings.load(env={"RELAY_OUTBOXES": "app.a, shop.b"})
    assert role(settings).splitlines()[0] == "// outbox-relay: least privileges for app.a, shop.b (docs/security.md)"


def test_a_malformed_outbox_setting_names_the_setting():
    with pytest.raises(ConfigError, match="RELAY_OUTBOXES.*expected database.collection outboxes, got 'nodot'"):
        Settings.load(env={"RELAY_OUTBOXES": "app.a,nodot"}).parts()


def test_the_route_formula_is_outbox_index_times_partitions_plus_partition():
    a, b, c = (Namespace("app", n) for n in "abc")
    plan = StreamPlan((a, b, c), 3, "app")
    assert [plan.route(Scope(c, Partition(k, 3))) for k in range(3)] == [route_of(2, 3, k) for k in range(3)]
    assert route_of(2, 3, 1) == 7
    assert plan.routes_of("app", "b") == [3, 4, 5], "a drop of b ends b's partitions only"
    assert plan.routes_of("app", None) == [-1], "a dropDatabase ends every route"
