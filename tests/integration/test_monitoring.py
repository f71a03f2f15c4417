"""The monitoring kit (deploy/monitoring/) on a real Prometheus 2.42 (Debian's package,
tests/prometheus_server.py): the alerting rules and the Grafana dashboard.

- `promtool check rules` accepts the rules, and `promtool test rules` evaluates each alert on
  synthetic series (tests/integration/prometheus_rules_cases.yml): it fires on its condition,
  with the labels an operator routes on, after its `for`, and not otherwise.
- A real Prometheus scrapes a relay publishing two outboxes (scrape and evaluation every 1 s, the
  rules' `for` shortened to 0 s): the rules load healthy; no alert is active while the relay
  publishes; a poison event dead-lettered in one outbox fires OutboxRelayDeadLetters for that
  outbox alone; the relay no longer answering adds exactly OutboxRelayDown.
- The dashboard is Grafana JSON whose every query parses and evaluates on that server, returns
  data where the relay has the series, and names only series the relay exposes (its /metrics).
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from relay.dev.stack import free_port
from tests.prometheus_server import Prometheus, PrometheusServer, installed
from tests.support.paths import ROOT
from tests.support.relays import RelayThread
from tests.support.topics import topic_size
from tests.support.waiting import wait_until
from tests.support.writes import write_events

MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "prometheus-rules.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
CASES = Path(__file__).with_name("prometheus_rules_cases.yml")
JOB = "outbox-relay"  # the job the rules expect (deploy/monitoring/README.md)
SEVERITIES = {"critical", "warning"}


@pytest.fixture(scope="session")
def prometheus() -> Prometheus:
    return installed()


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _render_rules(target: Path, for_: str | None = None, annotations: bool = True) -> Path:
    """The rules file, with every `for` set to `for_` and without annotations if asked, at `target`."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if for_ is not None:
                rule["for"] = for_
            if not annotations:
                rule.pop("annotations", None)
    target.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


# ---- PromQL: the series an expression names ------------------------------------------------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects: its identifiers outside strings, label matchers, ranges
    and label lists that are neither functions nor keywords."""
    text = _LABEL_LISTS.sub(" ", _RANGES.sub(" ", _MATCHERS.sub(" ", _STRINGS.sub(" ", expr))))
    return {m.group(1) for m in _IDENTIFIER.finditer(text) if not m.group(2) and m.group(1).lower() not in _KEYWORDS}


def test_metric_names_finds_the_series_and_nothing_else():
    expr = ('max by (outbox, partition, replica) ((relay_fencing_token{outbox=~"a|b"} > 0) * on (job, instance) '
            'group_left (replica) relay_info) or histogram_quantile(0.99, sum by (le) (rate(x_bucket{le!="1"}[5m])))'
            ' unless absent(up{job="j"} == 1) and vector(1) offset 5m')
    assert metric_names(expr) == {"relay_fencing_token", "relay_info", "x_bucket", "up"}


# ---- the relay's exposition ------------------------------------------------------------------------

_SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}


def exposed(port: int) -> tuple[set[str], set[str]]:
    """The relay's /metrics: every sample name its families may have (a labelled counter with no
    child yet still declares `<name>_total`), and the names with a sample now."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    declared, sampled = set(), set()
    for family in text_string_to_metric_families(text):
        declared |= {family.name + suffix for suffix in _SAMPLE_SUFFIXES.get(family.type, ("",))}
        sampled |= {s.name for s in family.samples}
    return declared | sampled, sampled


# ---- the rules, without a server ---------------------------------------------------------------

def test_promtool_accepts_the_rules(prometheus):
    done = prometheus.promtool_run("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout


def test_each_alert_fires_on_its_condition_with_its_labels_and_only_then(prometheus, tmp_path):
    cases = yaml.safe_load(CASES.read_text())
    cases["rule_files"] = [_render_rules(tmp_path / "rules.yml", annotations=False).name]
    tested = {test["alertname"] for case in cases["tests"] for test in case["alert_rule_test"] if test.get("exp_alerts")}
    assert tested >= {rule["alert"] for rule in _rules()}, "every alert has a case where it fires"
    (tmp_path / "cases.yml").write_text(yaml.safe_dump(cases, sort_keys=False))
    done = prometheus.promtool_run("test", "rules", "cases.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of `markdown`."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in markdown.splitlines() if line.startswith("#")}


def test_every_alert_has_a_severity_says_what_to_do_and_names_its_outbox():
    rules, anchors = _rules(), _anchors((MONITORING / "README.md").read_text())
    assert len({rule["alert"] for rule in rules}) == len(rules)
    for rule in rules:
        labels, notes = rule.get("labels", {}), rule.get("annotations", {})
        assert labels.get("severity") in SEVERITIES, rule["alert"]
        assert notes.get("summary") and notes.get("description"), rule["alert"]
        page, _, anchor = notes.get("runbook_url", "").partition("#")
        assert page == "deploy/monitoring/README.md" and anchor in anchors, (rule["alert"], anchor)
        if metric_names(rule["expr"]) != {"up"}:  # relay series: each has `outbox`, which the alert keeps
            kept = re.findall(r"\bby \(([^)]*)\)", rule["expr"])
            assert all("outbox" in labels for labels in kept), (rule["alert"], kept)
            assert "$labels.outbox" in notes["summary"] and "$labels.outbox" in notes["description"], rule["alert"]


# ---- the dashboard, without a server -------------------------------------------------------------

def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row's


def _targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, query) of every query of the dashboard."""
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def test_the_dashboard_is_grafana_json_with_the_datasource_and_outbox_variables():
    dashboard = _dashboard()
    assert dashboard["schemaVersion"] >= 39 and dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    outbox = variables["outbox"]
    assert outbox["type"] == "query" and outbox["multi"] and outbox["includeAll"]
    assert outbox["datasource"]["uid"] == "${datasource}"
    assert re.fullmatch(r"label_values\(relay_\w+, outbox\)", outbox["definition"]), "a per-outbox series"
    ids, cells = set(), set()
    for panel in _panels(dashboard):
        assert panel["id"] not in ids, f"panel id {panel['id']} twice"
        ids.add(panel["id"])
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel.get("description"), panel["title"]
        for target in panel["targets"]:
            assert target["refId"] and target["expr"], panel["title"]
            assert target["datasource"] == panel["datasource"], panel["title"]
            if "outbox" in target["expr"]:
                assert "$outbox" in target["expr"], f"{panel['title']}: not filtered by the outbox variable"
    shown = set().union(*(metric_names(expr) for _, expr in _targets(dashboard)))
    wanted = {"relay_events_published_total", "relay_bytes_published_total", "relay_delivery_latency_seconds_bucket",
              "relay_read_to_ack_seconds_bucket", "relay_checkpoint_lag_seconds", "relay_lease_held",
              "relay_fencing_token", "relay_restarts_total", "relay_errors_total", "relay_dead_letters_total",
              "relay_producer_queue_messages", "relay_outbox_documents",
              "relay_outbox_oldest_undelivered_age_seconds", "relay_outbox_ttl_headroom_seconds",
              "process_cpu_seconds_total", "process_resident_memory_bytes"}
    assert wanted <= shown, f"no panel for {sorted(wanted - shown)}"


def _grafana_regex(values: list[str]) -> str:
    """`$outbox` as Grafana's Prometheus data source writes a multi-value variable into a query:
    each value regex-escaped (a backslash doubled inside the PromQL string), joined by `|`."""
    return "(" + "|".join(re.sub(r"([\\$^*{}\[\]'+?.()|])", r"\\\\\1", v) for v in values) + ")"


def _interpolated(expr: str, outboxes: list[str]) -> str:
    """`expr` with the dashboard's variables as Grafana fills them in ("All" outboxes)."""
    text = expr.replace("$__rate_interval", "1m").replace("$outbox", _grafana_regex(outboxes))
    assert "$" not in text, f"a variable the test does not fill in: {expr}"
    return text


# ---- a real Prometheus scraping a running relay --------------------------------------------------

def _group(server: PrometheusServer) -> dict[str, Any]:
    [group] = server.api("rules", {"type": "alert"})["groups"]
    return dict(group)


def _active(server: PrometheusServer) -> list[dict[str, Any]]:
    """Every pending or firing alert."""
    return list(server.api("alerts")["alerts"])


def _firing(alerts: list[dict[str, Any]]) -> set[str]:
    return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}


def _none_active_for_evaluations(server: PrometheusServer, count: int) -> None:
    """No rule pending or firing at each of the next `count` evaluations of the rule group."""
    seen = _group(server)["lastEvaluation"]
    for _ in range(count):
        group = wait_until(lambda: (g := _group(server))["lastEvaluation"] != seen and g, 30,
                           "the next evaluation of the rules")
        seen = group["lastEvaluation"]
        active = [(rule["name"], alert["labels"], alert["value"]) for rule in group["rules"] for alert in rule["alerts"]]
        assert active == [], f"alerts active while the relay publishes normally: {active}"


def _rendered(alert: dict[str, Any]) -> dict[str, str]:
    notes = dict(alert["annotations"])
    for text in notes.values():
        assert "<no value>" not in text and "error expanding" not in text, notes
    return notes


def _dashboard_runs_on(server: PrometheusServer, relay_port: int, outboxes: list[str]) -> None:
    """The outbox variable lists `outboxes`; every query evaluates; none names a series the relay
    does not expose; each returns data once the relay has every series it names."""
    dashboard = _dashboard()
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "outbox")
    found = re.fullmatch(r"label_values\((\w+), outbox\)", variable["definition"])
    assert found, variable["definition"]
    assert server.api("label/outbox/values", {"match[]": found.group(1)}) == outboxes
    names, sampled = exposed(relay_port)
    wait_until(lambda: {row["metric"]["__name__"] for row in server.query(f'count by (__name__) ({{job="{JOB}"}})')}
               >= sampled, 30, "Prometheus to scrape every series the relay has")
    for title, expr in _targets(dashboard):
        query = _interpolated(expr, outboxes)
        assert metric_names(expr) <= names, f"{title}: {sorted(metric_names(expr) - names)} not exposed"
        if metric_names(expr) <= sampled:
            wait_until(lambda q=query: server.query(q), 30, f"{title}: data for {query}")
        else:
            server.query(query)  # parses and evaluates, to nothing (no restart yet, no TTL index)
    for rule in _rules():
        assert metric_names(rule["expr"]) <= names | {"up"}, f"{rule['alert']} names a series the relay lacks"


def test_a_real_prometheus_scraping_a_relay_alerts_only_on_trouble_and_runs_the_dashboard(env, prometheus,
                                                                                            tmp_path):
    db, prefix = env.settings.database, env.settings.topic_template.split(".", 1)[0]
    a, b = f"{db}.a", f"{db}.b"
    for name in ("a", "b"):
        env.db.create_collection(name)
    port = free_port()
    settings = env.settings.replace(
        outboxes=f"{a},{b}", topic_template=prefix + ".{collection}.{aggregateType}", http_host="127.0.0.1",
        http_port=port, on_poison="dead-letter", dead_letter_topic=f"{prefix}.dead", outbox_check_interval_s=1.0,
    )
    bootstrap = env.servers.kafka_bootstrap
    relay = RelayThread(settings)
    http = relay.relay.observer.serve()
    assert http is not None
    running = True
    relay.start()
    server = PrometheusServer(prometheus, tmp_path / "prometheus")
    server.base_dir.mkdir()
    try:
        # The relay first takes its leases and publishes an event per outbox (its producers'
        # start-up in the first batch's latency); Prometheus starts after, so its rates cover
        # only what the relay publishes while it watches.
        for name in ("a", "b"):
            write_events(env.db, name, total=1, writers=1)
        wait_until(lambda: all(topic_size(bootstrap, f"{prefix}.{name}.order") for name in ("a", "b")), 90,
                   "the first events", alive=relay.check_alive)
        _render_rules(server.base_dir / "rules.yml", for_="0s")
        server.start({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yml"],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        })
        for name in ("a", "b"):
            write_events(env.db, name, total=20, writers=2, seed=2)
        published = {a: 21.0, b: 21.0}

        def scraped() -> dict[str, float]:
            rows = server.query(f'sum by (outbox) (relay_events_published_total{{job="{JOB}"}})')
            return {row["metric"]["outbox"]: float(row["value"][1]) for row in rows}

        wait_until(lambda: scraped() == published, 90, f"Prometheus to scrape {published}", alive=relay.check_alive)

        group = _group(server)  # the rules loaded, healthy
        assert [rule["name"] for rule in group["rules"]] == [rule["alert"] for rule in _rules()]
        assert all(rule["health"] == "ok" and not rule.get("lastError") for rule in group["rules"]), group["rules"]
        _dashboard_runs_on(server, port, [a, b])

        # Publishing normally: nothing pending, nothing firing.
        _none_active_for_evaluations(server, 3)

        # A poison event in b goes to the dead-letter topic: b's alert, and only b's.
        env.db["b"].insert_one({"aggregateType": "order", "aggregateId": "k2"})  # no eventType
        wait_until(lambda: relay.metric("relay_dead_letters_total", outbox=b) == 1, 60, "the dead letter",
                   alive=relay.check_alive)
        alerts = wait_until(lambda: (found := _active(server)) and _firing(found) and found, 60, "the dead-letter alert")
        assert [x["labels"] for x in alerts] == [{"alertname": "OutboxRelayDeadLetters", "outbox": b,
                                                  "severity": "warning"}]
        assert _rendered(alerts[0])["summary"].startswith(f"{b}: ")

        # The relay stops (its HTTP server first, as when its process ends): the stop adds
        # exactly OutboxRelayDown (the dead-letter alert lasts its 10-minute window).
        http.shutdown()
        http.server_close()
        running = False
        assert relay.stop(), "the relay did not stop"
        alerts = wait_until(lambda: "OutboxRelayDown" in _firing(found := _active(server)) and found, 60,
                            "the relay-down alert")
        assert sorted(_firing(alerts)) == ["OutboxRelayDeadLetters", "OutboxRelayDown"], alerts
        [down] = [x for x in alerts if x["labels"]["alertname"] == "OutboxRelayDown"]
        assert down["labels"] == {"alertname": "OutboxRelayDown", "severity": "critical"}
        assert "No outbox relay answers" in _rendered(down)["summary"]
    finally:
        server.stop()
        if running:
            http.shutdown()
            http.server_close()
            assert relay.stop(), "the relay did not stop"
    assert relay.error is None, relay.error
