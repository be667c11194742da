"""The alerting rules in deploy/prometheus with Prometheus's own promtool (the rules load, their unit tests
pass), what each rule is made of (a for:, a severity, what to do; the job label it assumes), and the series
they read on a real coordinator's metrics page (its collectors over a real database, checked by `promtool
check metrics`): there from the start, at 0, and mwms_agent_lost naming exactly the agents that are lost."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from datetime import timedelta
from typing import Any

import pytest
import yaml  # PyYAML: a dependency of schemathesis (the dev extra)
from prometheus_client.parser import text_string_to_metric_families

import mwms
from mwms.server import poison
from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, utcnow
from mwms.server.observability.cluster_gauges import cluster_registry, render
from mwms.server.observability.instruments import RESTART_CAUSES
from mwms.server.observability.lost_agents import MAX_LOST_AGENTS_LABELLED
from mwms.server.services.fleet.agents import Registration, register_agent, remove_agent, touch_agent
from mwms.server.states import TERMINAL_JOB_STATES
from mwms.v1 import agent_pb2 as pb
from mwms_testkit import REPO

REPO = REPO
RULES_DIR = REPO / "deploy" / "prometheus"
RULES = RULES_DIR / "mwms-alerts.yml"
RULE_TESTS = RULES_DIR / "mwms-alerts.test.yml"
JOB_SELECTOR = 'job="mwms"'
SEVERITIES = {"critical", "warning"}
# Series that Prometheus makes for every target, not the coordinator.
PROMETHEUS_SERIES = {"up"}
# Cluster gauges that describe the replica that answers; every other one is the same on every replica.
PER_REPLICA_GAUGES = {
    "mwms_agent_streams",
    "mwms_replica_leads_loop",
    "mwms_cluster_scrape_ok",
    "mwms_cluster_scrape_duration_seconds",
}


def promtool() -> str:
    """The promtool binary; a skip where it is missing, but a failure in CI (.ci/run installs it)."""
    found = shutil.which("promtool")
    if found is None:
        hint = "promtool is not installed: apt-get install prometheus (Debian's package brings promtool)"
        if os.environ.get("CI") == "true":
            pytest.fail(hint + "; .ci/run installs it")
        pytest.skip(hint)
    return found


def run_promtool(*args: str, stdin: str | None = None) -> tuple[int, str]:
    result = subprocess.run(
        [promtool(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=RULES_DIR,
    )
    return result.returncode, result.stdout + result.stderr


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def read_metrics(expr: str) -> set[str]:
    """The metric names an expression selects (each is followed by its label matchers)."""
    return set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{", expr))


def metrics_page(db: Database) -> str:
    """The coordinator's /metrics page over `db`: the process-wide instruments (the hang detector's counter
    included) and the cluster gauges of an app's own registry, as server/api/health.py renders it."""
    import mwms.server.live.hang_detector  # noqa: F401 - registers mwms_hang_detections_total, as the app does
    import mwms.server.services.scheduler.pass_check  # noqa: F401 - mwms_scheduler_invariant_violations_total

    return render(cluster_registry(db, lambda: 0)).decode()


def page_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def series(text: str, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels) in page_samples(text) if n == name]


def lost_agents(text: str) -> set[str]:
    return {labels["agent"] for labels in series(text, "mwms_agent_lost")}


def add_agent(db: Database, name: str) -> str:
    slot = [{"kind": "cpu", "index": 0, "name": "s"}]
    with db.write() as session:
        return register_agent(session, Registration(name, name, "127.0.0.1", 20000, 20010, slot, "t"), 30).id


def silence(db: Database, *agent_ids: str) -> None:
    """The agents' online_until has passed: lost by the derived rule, whether the reconciler acted yet."""
    with db.write() as session:
        for agent_id in agent_ids:
            agent = session.get(Agent, agent_id)
            assert agent is not None
            agent.online_until = utcnow() - timedelta(seconds=1)


# --- the rules, with promtool -------------------------------------------------------------------------------


def test_promtool_accepts_the_rules() -> None:
    code, output = run_promtool("check", "rules", str(RULES))
    assert code == 0, output
    assert f"SUCCESS: {len(alert_rules())} rules found" in output, output


def test_the_rules_pass_their_unit_tests() -> None:
    code, output = run_promtool("test", "rules", RULE_TESTS.name)
    assert code == 0, output
    assert "SUCCESS" in output, output


def test_every_alert_is_tested_firing_and_quiet() -> None:
    """Each rule has a unit test where it fires and one where it stays quiet (its healthy case)."""
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - fired == set(), f"never tested firing: {sorted(names - fired)}"
    assert names - quiet == set(), f"never tested quiet: {sorted(names - quiet)}"


def test_every_rule_waits_has_a_severity_and_says_what_to_do() -> None:
    rules = alert_rules()
    assert len(rules) >= 10
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"Mwms[A-Z]\w+", name), name
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: no `for:`"
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert annotations["summary"].strip(), name
        # What to do: a command to run or a place to look, not only what happened.
        assert len(annotations["description"]) > 150, f"{name}: the description says too little"


def test_every_selector_names_the_assumed_job() -> None:
    """Rules select only job="mwms" (the scrape job the README and the rules file say), so another job's
    `up` or a same-named metric does not set them off."""
    for rule in alert_rules():
        expr = rule["expr"]
        names = re.findall(r"\b(mwms_\w+|up)\b", expr)
        assert names, rule["alert"]
        for match in re.finditer(r"\b(?:mwms_\w+|up)\{([^}]*)\}", expr):
            assert JOB_SELECTOR in match.group(1), f"{rule['alert']}: {match.group(0)} without {JOB_SELECTOR}"
        bare = re.findall(r"\b(?:mwms_\w+|up)\b(?!\{)", expr)
        assert not bare, f"{rule['alert']}: {bare} selected without {JOB_SELECTOR}"


def test_rules_on_cluster_gauges_take_them_once_whatever_the_replicas(db: Database) -> None:
    """Every replica on one database exports the same cluster gauges: a rule on one keeps no `instance`
    (max by a few labels), so N replicas make one alert, not N."""
    cluster_wide = {
        family.name
        for family in text_string_to_metric_families(render(cluster_registry(db, lambda: 0)).decode())
        if family.name.startswith("mwms_") and family.type == "gauge"
    } - PER_REPLICA_GAUGES
    assert {"mwms_agent_lost", "mwms_agents", "mwms_jobs"} <= cluster_wide
    checked = 0
    for rule in alert_rules():
        if read_metrics(rule["expr"]) & cluster_wide:
            checked += 1
            by = re.search(r"\bmax by \(([^)]*)\)", rule["expr"])
            assert by and "instance" not in by.group(1), f"{rule['alert']}: take the gauge with max by"
    assert checked >= 1


# --- the series the rules read, on a real metrics page ---------------------------------------------------


def test_the_metrics_page_passes_promtool_and_has_every_series_the_rules_read(db: Database) -> None:
    text = metrics_page(db)
    code, output = run_promtool("check", "metrics", stdin=text)
    assert code == 0 and not output.strip(), output
    names = {sample_name for sample_name, _ in page_samples(text)}
    families = {family.name for family in text_string_to_metric_families(text)}
    read = set().union(*(read_metrics(rule["expr"]) for rule in alert_rules())) - PROMETHEUS_SERIES
    # mwms_agent_lost has no sample while no agent is lost: its family is there.
    missing = {name for name in read if name not in names and name not in families}
    assert not missing, f"the rules read series the coordinator does not export: {sorted(missing)}"


def test_labelled_series_exist_at_zero_from_the_start(db: Database) -> None:
    """Before the first event: increase() in a rule needs the 0, and a panel shows 0, not "No data"."""
    text = metrics_page(db)
    values = page_samples(text)

    def present(name: str, **labels: str) -> bool:
        return (name, frozenset(labels.items())) in values

    expected = (
        [("mwms_poison_total", {"kind": kind}) for kind in poison.KNOWN_KINDS]
        + [("mwms_job_restarts_total", {"cause": cause}) for cause in RESTART_CAUSES]
        + [("mwms_job_preemptions_total", {"cause": c}) for c in ("priority", "reclaim", "drain")]
        + [("mwms_agent_commands_sent_total", {"kind": kind}) for kind in ("start", "stop")]
        + [("mwms_job_duration_seconds_count", {"state": s.value}) for s in TERMINAL_JOB_STATES]
        + [("mwms_scheduling_latency_seconds_count", {"attempt": a}) for a in ("first", "restart")]
        + [("mwms_job_queue_wait_seconds_count", {"band": b}) for b in ("low", "normal", "high")]
        + [("mwms_hang_detections_total", {}), ("mwms_metric_update_failures_total", {})]
        + [("mwms_heartbeat_round_trip_seconds_count", {}), ("mwms_event_loop_lag_seconds_count", {})]
    )
    missing = [f"{name}{labels}" for name, labels in expected if not present(name, **labels)]
    assert not missing, "no series yet: " + ", ".join(missing)
    build = {"version": mwms.__version__, "python": platform.python_version()}
    assert values[("mwms_build_info", frozenset(build.items()))] == 1
    assert series(text, "mwms_build_info") == [build]
    assert lost_agents(text) == set()  # no agent: no series, and no "No data" either way


def test_every_poison_kind_the_code_names_starts_at_zero() -> None:
    """server/poison.py's KNOWN_KINDS holds every kind a loop or stream counts, as the code names them."""
    literal = re.compile(
        r"""count_poison\(\s*"(\w+)"
        |contain\(\s*\w+,\s*"(\w+)"
        |isolated\(\s*\w+,\s*\w+,\s*"(\w+)"
        |_insert_contained\([^()]*"(\w+)"\)""",
        re.VERBOSE,
    )
    named: set[str] = set()
    for path in (REPO / "server").rglob("*.py"):
        for match in literal.finditer(path.read_text()):
            named.add(next(group for group in match.groups() if group))
    # server/rpc/agent_stream.py counts f"agent_{body}" for a stream message it could not apply; heartbeats
    # are answered on the reader and never reach it.
    bodies = {field.name for field in pb.AgentMessage.DESCRIPTOR.oneofs_by_name["body"].fields}
    named |= {f"agent_{body}" for body in bodies - {"heartbeat"}}
    assert len(named) > 10
    assert named == set(poison.KNOWN_KINDS), (
        f"counted but not in KNOWN_KINDS: {sorted(named - set(poison.KNOWN_KINDS))}; "
        f"in KNOWN_KINDS but never counted: {sorted(set(poison.KNOWN_KINDS) - named)}"
    )


def test_lost_agents_are_named_until_they_come_back_or_are_removed(db: Database) -> None:
    online = add_agent(db, "gpu-1")
    lost = add_agent(db, "gpu-2")
    removed = add_agent(db, "gpu-3")
    silence(db, lost, removed)
    assert lost_agents(metrics_page(db)) == {"gpu-2", "gpu-3"}
    with db.write() as session:
        remove_agent(session, removed, backoff_base_s=1)
    text = metrics_page(db)
    assert lost_agents(text) == {"gpu-2"}
    assert page_samples(text)[("mwms_agent_lost", frozenset({("agent", "gpu-2")}))] == 1
    assert page_samples(text)[("mwms_agents", frozenset({("state", "lost")}))] == 1
    with db.write() as session:
        agent = session.get(Agent, lost)
        assert agent is not None
        touch_agent(agent, 30)  # heard from again
    assert lost_agents(metrics_page(db)) == set()
    assert online


def test_lost_agents_are_capped_by_name(db: Database) -> None:
    count = MAX_LOST_AGENTS_LABELLED + 5
    ids = [add_agent(db, f"node-{i:03d}") for i in range(count)]
    silence(db, *ids)
    text = metrics_page(db)
    assert lost_agents(text) == {f"node-{i:03d}" for i in range(MAX_LOST_AGENTS_LABELLED)}
    assert page_samples(text)[("mwms_agents", frozenset({("state", "lost")}))] == count
