"""`outbox-relay security role`: the least-privilege MongoDB role for these settings.

Prints the `createRole` command as a mongosh snippet (or, with `--json`, the bare document) for
the mode the settings select (clean-up, an inbox collection), so an operator does
not copy privileges by hand; `--create` creates the role (or sets its privileges when it exists)
as the user of RELAY_MONGODB_URI, who needs `createRole`/`updateRole` on `admin`.
Which privilege serves what: relay.mongo.privileges and docs/security.md.
"""

from __future__ import annotations

import json
from typing import Any

from relay.config import Settings
from relay.mongo.connection import check_mongodb, mongo_client
from relay.mongo.privileges import Privilege, required_for, role_document

DEFAULT_ROLE = "outboxRelay"


def privileges(settings: Settings, inbox: str | None = None) -> list[Privilege]:
    parts = settings.parts()
    return required_for(parts.mongo, parts.outboxes, parts.cleanup, inbox)


def role(settings: Settings, name: str = DEFAULT_ROLE, inbox: str | None = None, *, as_json: bool = False) -> str:
    """The role as a mongosh snippet, with each privilege's purpose and a `createUser` example
    (or as the bare `createRole` document)."""
    needed = privileges(settings, inbox)
    doc = role_document(name, needed)
    if as_json:
        return json.dumps(doc, indent=2)
    outboxes = ", ".join(str(n) for n in settings.namespaces)
    lines = [f"// outbox-relay: least privileges for {outboxes} (docs/security.md)"]
    lines += [f"//   {p.namespace}: {', '.join(p.actions)} ({p.why})" for p in needed]
    lines.append(f'db.getSiblingDB("admin").runCommand({json.dumps(doc, indent=2)})')
    lines.append(
        f'// then: db.getSiblingDB("admin").createUser({{user: "relay", pwd: passwordPrompt(), '
        f'roles: [{{role: "{name}", db: "admin"}}]}})'
    )
    return "\n".join(lines)


def create_role(settings: Settings, name: str = DEFAULT_ROLE, inbox: str | None = None) -> str:
    """Create the role on `admin`, or set its privileges to exactly these when it exists."""
    mongo = settings.parts().mongo
    doc = role_document(name, privileges(settings, inbox))
    client: Any
    with mongo_client(mongo) as client:
        check_mongodb(client, mongo)
        exists = client.admin.command({"rolesInfo": name})["roles"]
        if exists:
            client.admin.command({"updateRole": name, "privileges": doc["privileges"], "roles": []})
            return f"updated role {name} on admin: {len(doc['privileges'])} privileges"
        client.admin.command(doc)
        return f"created role {name} on admin: {len(doc['privileges'])} privileges"
