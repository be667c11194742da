"""/metrics of a real coordinator (the shared cluster: `mwms server` and two real agents on loopback).

A scrape needs a token (any role); every query of the Grafana dashboard in deploy/grafana names a metric
that /metrics exports; the README's metric list is the exported list; and a real two-worker job moves
the numbers: jobs by state, agents online, heartbeat round trips, ingested points and lines, scheduling
latency, job duration, commands sent and request latency by route template.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster import wait_until

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "mwms-dashboard.json"
README = ROOT / "README.md"
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
    exported = series_names(text) | defined_elsewhere_and_not_started()
    queries = list(dashboard_queries())
    assert len(queries) >= 20
    missing = []
    for title, expr in queries:
        names = metric_names(expr)
        assert names, f"panel {title!r}: no metric in {expr!r}"
        missing += [f"{title!r}: {name}" for name in sorted(names) if name not in exported]
    assert not missing, "dashboard queries name metrics /metrics does not export:\n" + "\n".join(missing)


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
    section = README.read_text().split("## Operating: Prometheus and Grafana", 1)[1].split("\n## ", 1)[0]
    listed = dict(re.findall(r"^\| `(mwms_\w+)` \| (\w+) \|", section, flags=re.MULTILINE))
    assert listed == exported, (
        f"README lists {sorted(set(listed) - set(exported))} that /metrics does not export, and misses "
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
