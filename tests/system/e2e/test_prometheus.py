"""/metrics of a real coordinator (the shared cluster: `mwms server` and two real agents on loopback).

A scrape needs a token (any role) and passes `promtool check metrics`; every query of the Grafana dashboard
in deploy/grafana and of the alerting rules in deploy/prometheus names a metric that /metrics exports; the
dashboard imports with a data-source input and shows the coordinators chosen, never summing a cluster gauge
over replicas; the metric list in docs/operators.md is the exported list; labelled series and the build info are
there before any event; and a real two-worker job moves the numbers: jobs by state, agents online,
heartbeat round trips, ingested points and lines, scheduling latency, job duration, commands sent and
request latency by route template.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml  # PyYAML: a dependency of schemathesis (the dev extra)
from prometheus_client.parser import text_string_to_metric_families

import mwms
from mwms.server import poison
from mwms_testkit import REPO
from mwms_testkit.cluster import free_port, wait_until

pytestmark = pytest.mark.e2e
ROOT = REPO
DASHBOARD = ROOT / "deploy" / "grafana" / "mwms-dashboard.json"
ALERT_RULES = ROOT / "deploy" / "prometheus" / "mwms-alerts.yml"
# Series Prometheus makes for every target it scrapes; queries may read them too.
PROMETHEUS_SERIES = {"up"}
# Cluster gauges that describe the replica that answers; the other gauges are the same on every replica.
PER_REPLICA_GAUGES = {
    "mwms_agent_streams",
    "mwms_replica_leads_loop",
    "mwms_cluster_scrape_ok",
    "mwms_cluster_scrape_duration_seconds",
}
METRICS_DOC = ROOT / "docs" / "operators.md"
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "unknown": ("",),
}
# PromQL words that look like names: aggregations, functions (always followed by "("), modifiers.
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
PROMQL_WORDS |= {"and", "or", "unless", "inf", "nan"}
# Defined by the hang detector (server/live/hang_detector.py, issue 11 item 2), not by server/observability:
# exported once the coordinator starts that detector, which this tolerates until it does.
HANG_DETECTIONS = "mwms_hang_detections_total"


def defined_elsewhere_and_not_started() -> set[str]:
    return set() if "hang_detector" in (ROOT / "server" / "app.py").read_text() else {HANG_DETECTIONS}


WRITES_METRICS = """
import json, os, time
with open(os.environ["MWMS_METRICS_FILE"], "a") as out:
    for step in range(1, 6):
        out.write(json.dumps({"name": "loss", "step": step, "value": 1.0 / step, "time": time.time()}) + "\\n")
for line in range(5):
    print("line", line, flush=True)
time.sleep(2)  # a few heartbeats while running
"""


def scrape(cluster: Any, token: str | None = None) -> tuple[int, str]:
    with cluster.client(token or cluster.admin_token) as http:
        response = http.get("/metrics")
    return response.status_code, response.text


def families(text: str) -> dict[str, str]:
    """Family name -> type, as the Prometheus text parser reads the page."""
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def series_names(text: str) -> set[str]:
    """Every series name a query may use: each family's name with its type's suffixes."""
    return {name + suffix for name, kind in families(text).items() for suffix in SUFFIXES.get(kind, ("",))}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples(text).items() if n == name and wanted <= set(ls))


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: label matchers, ranges, by-clauses, strings and function
    names removed; what is left and looks like a name is a metric."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings, e.g. inside label matchers
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges, e.g. [$__rate_interval], [5m]
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w$.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in PROMQL_WORDS:
            continue
        names.add(name)
    return names


def dashboard_queries() -> Iterator[tuple[str, str]]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for panel in panels:
            for target in panel.get("targets", []):
                yield panel["title"], target["expr"]
            yield from walk(panel.get("panels", []))

    yield from walk(json.loads(DASHBOARD.read_text())["panels"])


def alert_expressions() -> Iterator[tuple[str, str]]:
    for group in yaml.safe_load(ALERT_RULES.read_text())["groups"]:
        for rule in group["rules"]:
            yield rule["alert"], rule["expr"]


def prometheus_tool(name: str = "promtool") -> str:
    """Prometheus's `promtool` or `prometheus` binary; a skip where it is missing, but a failure in CI
    (.ci/run installs it)."""
    found = shutil.which(name)
    if found is None:
        hint = f"{name} is not installed: apt-get install prometheus (Debian's package brings both binaries)"
        if os.environ.get("CI") == "true":
            pytest.fail(hint + "; .ci/run installs it")
        pytest.skip(hint)
    return found


def dashboard_promql(expr: str, job: str) -> str:
    """A dashboard query as Grafana sends it with `job` and every coordinator chosen."""
    return expr.replace("$__rate_interval", "1m").replace('"$job"', f'"{job}"').replace('"$instance"', '".*"')


def test_the_name_extraction_reads_what_the_dashboard_writes() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, route) (rate(mwms_api_request_duration_seconds_bucket{route!="a{b}"}'
        '[$__rate_interval]))) / clamp_min(sum without (kind) (mwms_devices{kind=~"gpu|cpu"} offset 5m), 1)'
        " and on (state) mwms_jobs"
    )
    assert metric_names(expr) == {"mwms_api_request_duration_seconds_bucket", "mwms_devices", "mwms_jobs"}


def test_scraping_needs_a_token_and_any_role_may_scrape(cluster: Any) -> None:
    with cluster.client(None) as anonymous:
        refused = anonymous.get("/metrics")
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Bearer")
    with cluster.client("mwms_not-a-token-of-this-coordinator") as wrong:
        assert wrong.get("/metrics").status_code == 401
    status, text = scrape(cluster, cluster.create_token("prometheus", role="viewer"))
    assert status == 200, text[:500]
    assert "# HELP mwms_jobs " in text and "# TYPE mwms_jobs gauge" in text
    # The refused scrapes are timed too, under no route (they never reached one), not under their path.
    assert value(text, "mwms_api_request_duration_seconds_count", route="unmatched", status="4xx") >= 2


def test_every_exported_mwms_metric_has_help_text(cluster: Any) -> None:
    _, text = scrape(cluster)
    helps = dict(re.findall(r"^# HELP (mwms_\w+) (.*)$", text, flags=re.MULTILINE))
    mwms = [name for name in families(text) if name.startswith("mwms_")]
    assert mwms
    for name in mwms:
        # A counter's HELP line names it with _total.
        documented = helps.get(name) or helps.get(name + "_total")
        assert documented and documented.strip(), f"{name} has no HELP text"


def test_every_dashboard_query_names_a_metric_that_metrics_exports(cluster: Any) -> None:
    _, text = scrape(cluster)
    exported = series_names(text) | defined_elsewhere_and_not_started() | PROMETHEUS_SERIES
    queries = list(dashboard_queries())
    assert len(queries) >= 20
    assert any(metric_names(expr) == {"up"} for _, expr in queries), "no panel shows Prometheus's `up`"
    missing = []
    for title, expr in queries:
        names = metric_names(expr)
        assert names, f"panel {title!r}: no metric in {expr!r}"
        missing += [f"{title!r}: {name}" for name in sorted(names) if name not in exported]
    assert not missing, "dashboard queries name metrics /metrics does not export:\n" + "\n".join(missing)


def test_every_alert_rule_names_a_metric_that_metrics_exports(cluster: Any) -> None:
    _, text = scrape(cluster)
    exported = series_names(text) | defined_elsewhere_and_not_started() | PROMETHEUS_SERIES
    rules = list(alert_expressions())
    assert len(rules) >= 10
    missing = [f"{alert}: {name}" for alert, expr in rules for name in sorted(metric_names(expr) - exported)]
    assert not missing, "alert rules name metrics /metrics does not export:\n" + "\n".join(missing)


def test_the_scrape_passes_promtool_and_has_its_series_before_any_event(cluster: Any) -> None:
    """What a fresh coordinator shows: the build info, and a series for each known label value (values may
    have moved: the cluster is shared with the other end-to-end tests)."""
    _, text = scrape(cluster)
    result = subprocess.run(
        [prometheus_tool(), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )
    build = (("python", platform.python_version()), ("version", mwms.__version__))
    assert samples(text)[("mwms_build_info", build)] == 1
    present = samples(text)
    expected = [("mwms_poison_total", (("kind", kind),)) for kind in poison.KNOWN_KINDS]
    expected += [("mwms_job_queue_wait_seconds_count", (("band", b),)) for b in ("low", "normal", "high")]
    expected += [("mwms_metric_update_failures_total", ())]
    missing = [f"{name}{dict(labels)}" for name, labels in expected if (name, labels) not in present]
    assert not missing, "no series on a fresh coordinator: " + ", ".join(missing)
    assert families(text)["mwms_agent_lost"] == "gauge"  # a family without series while no agent is lost


def test_the_dashboard_imports_with_a_data_source_input() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    inputs = {i["name"]: i for i in dashboard["__inputs"]}
    assert [(i["type"], i["pluginId"]) for i in inputs.values()] == [("datasource", "prometheus")]
    used = set(re.findall(r"\$\{(DS_\w+)\}", DASHBOARD.read_text()))
    assert used == set(inputs), f"inputs {sorted(inputs)}, referenced {sorted(used)}"
    required = {(r["type"], r["id"]) for r in dashboard["__requires"]}
    assert {("grafana", "grafana"), ("datasource", "prometheus")} <= required

    def panel_types(panels: list[dict[str, Any]]) -> set[str]:
        return {p["type"] for p in panels} | {t for p in panels for t in panel_types(p.get("panels", []))}

    missing = {("panel", kind) for kind in panel_types(dashboard["panels"]) - {"row"}} - required
    assert not missing, f"__requires misses {sorted(missing)}"


def test_every_dashboard_query_shows_the_chosen_coordinators(cluster: Any) -> None:
    """The `instance` variable picks one replica or all; a gauge that every replica exports alike is never
    summed over them (taken with max), so two coordinators do not show twice the cluster."""
    variables = {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    instance = variables["instance"]
    assert instance["type"] == "query" and instance["includeAll"] and instance["allValue"] == ".*"
    assert "mwms_build_info" in instance["definition"] and "$job" in instance["definition"]
    _, text = scrape(cluster)
    cluster_wide = {
        name for name, kind in families(text).items() if kind == "gauge" and name.startswith("mwms_")
    } - PER_REPLICA_GAUGES
    summed = re.compile(r"\bsum\s*(?:by\s*\([^)]*\)\s*)?\(\s*(\w+)\{")
    for title, expr in dashboard_queries():
        for match in re.finditer(r"\b(\w+)\{([^}]*)\}", expr):
            assert 'instance=~"$instance"' in match.group(2), f"{title!r}: {match.group(0)} ignores $instance"
            assert 'job=~"$job"' in match.group(2), f"{title!r}: {match.group(0)} ignores $job"
        doubled = [name for name in summed.findall(expr) if name in cluster_wide]
        assert not doubled, f"{title!r}: {doubled} summed over replicas that export the same value"


def test_a_real_prometheus_loads_the_rules_and_answers_every_dashboard_query(
    cluster: Any, tmp_path: Path
) -> None:
    """Prometheus scrapes the coordinator as docs/operators.md says (job mwms, a viewer token in a file) with the
    rules file loaded: every rule evaluates without error, the dashboard's variables find the coordinator
    and each panel's query is valid PromQL that returns series (lost agents aside: there may be none)."""
    binary = prometheus_tool("prometheus")
    token_file = tmp_path / "mwms-token"
    token_file.write_text(cluster.create_token("prometheus", role="viewer"))
    token_file.chmod(0o600)
    shutil.copy(ALERT_RULES, tmp_path / ALERT_RULES.name)
    target = f"127.0.0.1:{cluster.http_port}"
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [ALERT_RULES.name],
                "scrape_configs": [
                    {
                        "job_name": "mwms",
                        "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                        "static_configs": [{"targets": [target]}],
                    }
                ],
            }
        )
    )
    port = free_port()
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as log:
        prometheus = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    api = f"http://127.0.0.1:{port}/api/v1"

    def get(path: str, **params: Any) -> Any:
        try:
            response = httpx.get(f"{api}/{path}", params=params, timeout=10, trust_env=False)
        except httpx.TransportError:
            return None
        body = response.json()
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def log_tail() -> str:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])

    try:
        up = 'up{job="mwms"}'

        def scraped_twice() -> bool:
            data = get("query", query=f"count_over_time({up}[1m])")
            return bool(data and data["result"] and float(data["result"][0]["value"][1]) >= 3)

        wait_until(scraped_twice, 60, "three scrapes of the coordinator", observed=log_tail)
        assert float(get("query", query=up)["result"][0]["value"][1]) == 1, get("targets")

        def evaluated() -> list[dict[str, Any]] | None:
            rules = [rule for group in get("rules")["groups"] for rule in group["rules"]]
            done = all(not rule["lastEvaluation"].startswith("0001") for rule in rules)
            return rules if rules and done else None

        rules = wait_until(evaluated, 30, "every rule evaluated once", observed=log_tail)
        assert {rule["name"] for rule in rules} == {alert for alert, _ in alert_expressions()}
        unhealthy = [(rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"]
        assert not unhealthy, unhealthy
        instances = get("label/instance/values", **{"match[]": 'mwms_build_info{job=~"mwms"}'})
        assert instances == [target]
        assert get("label/job/values", **{"match[]": "mwms_build_info"}) == ["mwms"]
        empty = []
        for title, expr in dashboard_queries():
            result = get("query", query=dashboard_promql(expr, "mwms"))["result"]
            if not result and "mwms_agent_lost" not in expr:
                empty.append(f"{title!r}: {expr}")
        assert not empty, "dashboard queries with no data:\n" + "\n".join(empty)
    finally:
        prometheus.terminate()
        try:
            prometheus.wait(10)
        except subprocess.TimeoutExpired:
            prometheus.kill()
            prometheus.wait()


def test_the_readme_lists_exactly_the_exported_metrics(cluster: Any) -> None:
    _, text = scrape(cluster)
    kinds = families(text)
    exported = {
        name + ("_total" if kind == "counter" else ""): kind
        for name, kind in kinds.items()
        if name.startswith("mwms_")
    }
    for name in defined_elsewhere_and_not_started():
        exported.setdefault(name, "counter")
    section = METRICS_DOC.read_text().split("## Operating: Prometheus and Grafana", 1)[1].split("\n## ", 1)[0]
    listed = dict(re.findall(r"^\| `(mwms_\w+)` \| (\w+) \|", section, flags=re.MULTILINE))
    assert listed == exported, (
        f"docs/operators.md lists {sorted(set(listed) - set(exported))} that /metrics does not export, and misses "
        f"{sorted(set(exported) - set(listed))}; types differ for "
        f"{sorted(n for n in set(listed) & set(exported) if listed[n] != exported[n])}"
    )


def test_a_real_job_moves_the_metrics(cluster: Any) -> None:
    _, before = scrape(cluster)
    job_id = cluster.submit({"train.py": WRITES_METRICS}, ["python", "train.py"], workers=2, name="prom")
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    assert job["state"] == "SUCCEEDED", job["reason"] + cluster.logs_text(job_id)
    assert len(cluster.metrics(job_id, name="loss")) == 10

    def moved() -> str | None:
        _, after = scrape(cluster)

        def grew(name: str, by: float = 1.0, **labels: str) -> bool:
            return value(after, name, **labels) >= value(before, name, **labels) + by

        checks = {
            "SUCCEEDED jobs": grew("mwms_jobs", state="SUCCEEDED"),
            "agents online": value(after, "mwms_agents", state="online") >= 2,
            "open agent streams": value(after, "mwms_agent_streams") >= 2,
            "cpu slots": value(after, "mwms_devices", kind="cpu") >= 2,
            "heartbeat round trips": value(after, "mwms_heartbeat_round_trip_seconds_count") > 0,
            "metric points ingested": grew("mwms_metric_points_ingested_total", 10),
            "log lines ingested": grew("mwms_log_lines_ingested_total", 10),
            "scheduling latency": grew("mwms_scheduling_latency_seconds_count", attempt="first"),
            "job duration": grew("mwms_job_duration_seconds_count", state="SUCCEEDED"),
            "start commands": grew("mwms_agent_commands_sent_total", 2, kind="start"),
            "job page by template": grew(
                "mwms_api_request_duration_seconds_count",
                route="/api/v1/jobs/{job_id}",
                method="GET",
                status="2xx",
            ),
        }
        failing = [name for name, ok in checks.items() if not ok]
        return None if failing else after

    try:
        after = wait_until(moved, 30, "the job's metrics", interval=0.25)
    except AssertionError:
        _, after = scrape(cluster)
        shown = [line for line in after.splitlines() if line.startswith("mwms_") and "_bucket" not in line]
        raise AssertionError("metrics did not move as expected:\n" + "\n".join(shown)) from None
    # Latency labels carry templates, never raw paths with ids.
    assert job_id not in after
    assert value(after, "mwms_scheduling_latency_seconds_sum", attempt="first") > 0
    assert value(after, "mwms_cluster_scrape_ok") == 1
