"""Device telemetry in the dashboard, in Chromium, against a real coordinator, a real agent with two stand-in
GPUs (testkit/mwms_testkit/fake_gpus.py) and a real CPU agent: the agents page shows each GPU's utilisation, memory and
temperature; a GPU job's page charts each task's devices; a CPU job's page shows no devices panel.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mwms_testkit.cluster import Cluster
from mwms_testkit.fake_gpus import start_fake_gpu_agent, two_gpus, write_samples

from .conftest import WIDE, WatchedPage

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

SLEEP = "import time\nprint('on the GPUs', flush=True)\ntime.sleep({seconds})\n"


@pytest.fixture
def devices_cluster(tmp_path: Path):
    cluster = Cluster(root=tmp_path)
    samples = tmp_path / "samples.json"
    write_samples(samples, two_gpus(37.0, 64.0))
    try:
        cluster.start_server()
        start_fake_gpu_agent(cluster, "gpu-box", samples, port_low=23300)
        cluster.start_agent("cpu-box", 23400)
        yield cluster
    finally:
        cluster.stop()


def _admin_page(new_page, cluster: Cluster) -> WatchedPage:
    watched = new_page(WIDE)
    response = watched.page.request.post(f"{cluster.api}/api/v1/session", data={"token": cluster.admin_token})
    assert response.status == 200, response.text()
    return watched


def test_agents_and_job_pages_show_gpu_telemetry(devices_cluster, new_page) -> None:
    cluster = devices_cluster
    watched = _admin_page(new_page, cluster)
    page = watched.page

    page.goto(f"{cluster.api}/#/agents")
    [gpu_agent] = [a for a in cluster.http.get("/api/v1/agents").json() if a["name"] == "gpu-box"]
    readings = page.locator(f"tr[data-agent-id='{gpu_agent['id']}'] [data-testid=device-readings]")
    expect(readings.locator("li")).to_have_count(2)
    first = readings.locator("li[data-index='0']")
    expect(first.locator(".device-util-text")).to_have_text("37%")
    expect(first.locator(".device-mem")).to_have_text("4.0/80 GiB")
    expect(first.locator(".device-temp")).to_have_text("55 °C")
    expect(readings.locator("li[data-index='1'] .device-util-text")).to_have_text("64%")
    [cpu_agent] = [a for a in cluster.http.get("/api/v1/agents").json() if a["name"] == "cpu-box"]
    expect(
        page.locator(f"tr[data-agent-id='{cpu_agent['id']}'] [data-testid=device-readings]")
    ).to_have_count(0)
    watched.screenshot("agents-devices")

    gpu_job = cluster.submit(
        {"main.py": SLEEP.format(seconds=12)},
        ["python", "main.py"],
        workers=1,
        gpus_per_worker=2,
        name="on-gpus",
    )
    page.goto(f"{cluster.api}/#/jobs/{gpu_job}")
    panel = page.locator("[data-testid=job-devices]")
    expect(panel).to_be_visible(timeout=30_000)
    utilisation = panel.locator("figure.chart[data-metric='GPU utilisation %']")
    expect(utilisation).to_have_attribute("data-attempts", "2", timeout=30_000)  # task 0 on GPU 0 and GPU 1
    expect(utilisation.locator(".chart-legend")).to_contain_text("task 0 · GPU 1")
    expect(utilisation.locator(".chart-latest")).to_contain_text("after start")
    expect(panel.locator("figure.chart[data-metric='GPU memory used (GiB)']")).not_to_have_attribute(
        "data-points", "0"
    )
    watched.screenshot("job-devices")

    cpu_job = cluster.submit(
        {"main.py": SLEEP.format(seconds=1)}, ["python", "main.py"], workers=1, name="on-cpu"
    )
    cluster.wait_for(cpu_job, {"SUCCEEDED"}, timeout=60)
    page.goto(f"{cluster.api}/#/jobs/{cpu_job}")
    expect(page.locator("[data-testid=job-state]")).to_contain_text("SUCCEEDED")
    expect(page.locator("[data-testid=job-devices]")).to_be_hidden()
    watched.assert_clean()
