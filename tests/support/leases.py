"""The lease document as the tests see it: read once (`lease_doc`), polled in the background
(`CheckpointWatcher`), or every version of it from a change stream (`LeaseHistory`): the
checkpoints stored, and the one each fencing token resumed from."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

from pymongo.database import Database

from relay.config import Settings


def lease_doc(db: Database[Any], settings: Settings) -> dict[str, Any] | None:
    return db[settings.lease_collection].find_one({"_id": str(settings.namespaces[0])})


class CheckpointWatcher:
    """Polls the lease document in the background: every stored token it sees, in order, and
    each owner's first and last lease document seen."""

    def __init__(self, db: Database[Any], settings: Settings, interval: float = 0.05) -> None:
        self.db, self.settings, self.interval = db, settings, interval
        self.seen: list[str] = []
        self.first: dict[str, dict[str, Any]] = {}
        self.last: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                doc = lease_doc(self.db, self.settings) or {}
            except Exception:  # noqa: BLE001 - the server may be paused or electing
                doc = {}
            token = doc.get("resumeToken")
            if token and (not self.seen or self.seen[-1] != token["_data"]):
                self.seen.append(token["_data"])
            if doc.get("owner"):
                self.first.setdefault(doc["owner"], doc)
                self.last[doc["owner"]] = doc
            self._stop.wait(self.interval)

    def __enter__(self) -> CheckpointWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def assert_never_went_backwards(self) -> None:
        for a, b in zip(self.seen, self.seen[1:]):
            assert b > a, f"checkpoint went backwards: {a} -> {b}"


class LeaseHistory:
    """Every version of every lease document, exactly, from a change stream on the lease
    collection with post-images (the collection is created with `changeStreamPreAndPostImages`
    before the relays start; MongoDB 6.0+). Unlike polling, it cannot miss a checkpoint stored
    between two looks, so it gives, per lease, the checkpoint each fencing token resumed from.
    """

    def __init__(self, db: Database[Any], settings: Settings) -> None:
        name = settings.lease_collection
        if name not in db.list_collection_names():
            db.create_collection(name, changeStreamPreAndPostImages={"enabled": True})
        else:
            db.command("collMod", name, changeStreamPreAndPostImages={"enabled": True})
        self._coll = db[name]
        self.versions: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._stop = threading.Event()
        self._stream = self._coll.watch(full_document="required", max_await_time_ms=200)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                change = self._stream.try_next()
                if change is None or "fullDocument" not in change:
                    continue
                doc = change["fullDocument"]
                token = (doc.get("resumeToken") or {}).get("_data")
                self.versions[str(doc["_id"])].append(
                    {"owner": doc.get("owner"), "fencing": int(doc.get("fencingToken") or 0), "token": token})
        except BaseException as exc:  # noqa: BLE001 - reported by the checks
            self.error = exc

    def __enter__(self) -> LeaseHistory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.5)  # the last versions still on their way
        self._stop.set()
        self._thread.join()
        self._stream.close()

    def resumed_from(self, lease: str) -> dict[int, str | None]:
        """Fencing token -> the checkpoint the lease held when that token took it (None: none)."""
        out: dict[int, str | None] = {}
        for v in self.versions.get(lease, []):
            out.setdefault(v["fencing"], v["token"])
        return out

    def assert_never_went_backwards(self) -> int:
        """Every lease's stored checkpoint only ever moved forward; returns how many stores were seen."""
        assert self.error is None, self.error
        seen = 0
        for lease, versions in self.versions.items():
            tokens = [v["token"] for v in versions if v["token"] is not None]
            for a, b in zip(tokens, tokens[1:]):
                assert b >= a, f"checkpoint of {lease} went backwards: {a} -> {b}"
            seen += len(set(tokens))
        return seen
