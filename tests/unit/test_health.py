"""The readiness answers' wording (relay.ops.health.Health): a reason names its partition only
when the outbox is split, so a relay of unpartitioned outboxes answers as it always did."""

from __future__ import annotations

from relay.config import Settings
from relay.core.partitions import scopes
from relay.ops.health import Health


def test_an_outboxs_reason_names_the_partition_only_when_the_outbox_is_split():
    health = Health(Settings().parts().observer.health)
    [whole] = scopes(["db.a"], 1)
    split = scopes(["db.b"], 2)
    for scope in (whole, *split):
        health.loop(scope, lambda: 0.0).became("leader")
    health.loops[whole].restarting("TransientError")
    health.loops[split[1]].restarting("TransientError")
    answers = health.outboxes()
    assert answers["db.a"] == {"ok": False, "role": "leader", "reason": "restarting after TransientError"}
    assert answers["db.b"] == {"ok": False, "role": "leader", "reason": "db.b#1/2: restarting after TransientError"}
