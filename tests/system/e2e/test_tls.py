"""End to end over TLS: a real `mwms server --tls-self-signed`, clients that trust its CA and clients that do not,
the CLI with MWMS_CA_FILE, two real agents with --ca-file running a 2-worker job, and the dashboard in Chromium."""

from __future__ import annotations

import base64
import hashlib
import os
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from mwms_testkit.cluster import MWMS, Cluster, Process, wait_until
from mwms_testkit.parallel import port_range

pytestmark = pytest.mark.e2e

ALLREDUCE_PROGRAM = """
import os
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
value = strategy.run(lambda: tf.constant(float(resolver.task_id + 1)))
print("REDUCED", float(strategy.reduce("SUM", value, axis=None)), flush=True)
"""


@dataclass
class TlsCluster(Cluster):
    """The shared Cluster, with the coordinator serving TLS from its own self-signed CA."""

    @property
    def ca_file(self) -> Path:
        return self.root / "data" / "tls" / "ca.pem"

    @property
    def api(self) -> str:
        return f"https://127.0.0.1:{self.http_port}"

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(
            base_url=self.api,
            timeout=30,
            headers=headers,
            trust_env=False,
            verify=ssl.create_default_context(cafile=str(self.ca_file)),
        )

    def server_args(self) -> list[str]:
        return ["--tls-self-signed"]

    def _healthy(self) -> bool:
        assert self.server is not None
        if self.server.popen.poll() is not None:
            raise AssertionError(f"coordinator exited:\n{self.server.log_tail()}")
        if not self.ca_file.exists():
            return False
        try:
            return self.client(None).get("/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def start_tls_agent(self, name: str, port_low: int) -> Process:
        args = ["agent", "--server", f"127.0.0.1:{self.grpc_port}", "--ca-file", str(self.ca_file)]
        args += ["--name", name, "--work-dir", str(self.root / name), "--slots", "1"]
        args += ["--advertise-address", "127.0.0.1", "--port-range", port_range(port_low)]
        agent = self._spawn(name, args, self.agent_environment())
        self.agents[name] = agent
        wait_until(lambda: self.agent_online(name), 60, f"agent {name} online\n{agent.log_tail()}")
        return agent


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    instance = TlsCluster(root=tmp_path_factory.mktemp("tls"))
    try:
        instance.start_server()
        yield instance
    finally:
        instance.stop()


def test_the_server_logs_its_ca_and_what_agents_and_the_cli_need(tls_cluster):
    ca = x509.load_pem_x509_certificate(tls_cluster.ca_file.read_bytes())
    fingerprint = hashlib.sha256(ca.public_bytes(serialization.Encoding.DER)).hexdigest().upper()
    log = tls_cluster.server.log_path.read_text()
    assert f"CA SHA-256 fingerprint: {':'.join(fingerprint[i : i + 2] for i in range(0, 64, 2))}" in log
    assert f"--ca-file {tls_cluster.ca_file.resolve()}" in log
    assert f"MWMS_CA_FILE={tls_cluster.ca_file.resolve()}" in log
    assert "Uvicorn running on https://" in log
    assert "WITHOUT TLS" not in log
    for key in ("ca-key.pem", "server-key.pem"):
        assert (tls_cluster.ca_file.parent / key).stat().st_mode & 0o777 == 0o600


def test_rest_answers_https_clients_that_trust_the_ca_and_no_one_else(tls_cluster):
    response = tls_cluster.http.get("/api/v1/agents")
    assert response.status_code == 200, response.text
    assert "max-age=" in response.headers["strict-transport-security"]

    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{tls_cluster.api}/healthz", timeout=5, trust_env=False)
    with pytest.raises(httpx.HTTPError):  # clear text to a TLS port: the server drops the connection
        httpx.get(f"http://127.0.0.1:{tls_cluster.http_port}/healthz", timeout=5, trust_env=False)


def test_grpc_completes_a_handshake_only_with_the_ca(tls_cluster):
    address = f"127.0.0.1:{tls_cluster.grpc_port}"

    def ready(channel: grpc.Channel) -> bool:
        try:
            grpc.channel_ready_future(channel).result(timeout=3)
            return True
        except grpc.FutureTimeoutError:
            return False
        finally:
            channel.close()

    ca = tls_cluster.ca_file.read_bytes()
    assert ready(grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca)))
    assert not ready(grpc.secure_channel(address, grpc.ssl_channel_credentials()))  # system roots only
    assert not ready(grpc.insecure_channel(address))


def test_the_cli_talks_https_with_mwms_ca_file(tls_cluster):
    env = dict(os.environ, MWMS_API=tls_cluster.api, MWMS_TOKEN=tls_cluster.admin_token)
    env["MWMS_CONFIG"] = str(tls_cluster.root / "cli-config.json")
    without_ca = subprocess.run([MWMS, "agents"], env=env, capture_output=True, text=True, timeout=60)
    assert without_ca.returncode == 3, without_ca
    assert "MWMS_CA_FILE" in without_ca.stderr or "--ca-file" in without_ca.stderr, without_ca.stderr

    env["MWMS_CA_FILE"] = str(tls_cluster.ca_file)
    with_ca = subprocess.run([MWMS, "agents"], env=env, capture_output=True, text=True, timeout=60)
    assert with_ca.returncode == 0, with_ca


def agent_has_ca_file_flag() -> bool:
    help_text = subprocess.run([MWMS, "agent", "--help"], capture_output=True, text=True, timeout=60).stdout
    return "--ca-file" in help_text


@pytest.mark.tf
def test_two_agents_with_the_ca_run_a_two_worker_job_over_tls(tls_cluster):
    if not agent_has_ca_file_flag():
        pytest.skip("awaits `mwms agent --ca-file` (agent-side TLS)")
    tls_cluster.start_tls_agent("tls-1", 23000)
    tls_cluster.start_tls_agent("tls-2", 23100)

    job_id = tls_cluster.submit({"train.py": ALLREDUCE_PROGRAM}, ["python", "train.py"], workers=2)
    job = tls_cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"] + "\n" + tls_cluster.logs_text(job_id)
    assert {t["agent_name"] for t in job["tasks"]} == {"tls-1", "tls-2"}
    for task in job["tasks"]:
        assert "REDUCED 3.0" in tls_cluster.logs_text(job_id, task["index"])


@pytest.mark.browser
def test_the_dashboard_works_over_tls_in_chromium(tls_cluster, playwright_instance, chromium_executable):
    # Trust exactly this server's key, not every certificate: Chromium's pin on the SPKI's SHA-256.
    server_cert = x509.load_pem_x509_certificate((tls_cluster.ca_file.parent / "server.pem").read_bytes())
    spki = server_cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pin = base64.b64encode(hashlib.sha256(spki).digest()).decode()
    args = ["--headless", "--no-sandbox", "--disable-gpu", f"--ignore-certificate-errors-spki-list={pin}"]
    browser = playwright_instance.chromium.launch(executable_path=chromium_executable, args=args)
    try:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        response = page.goto(f"{tls_cluster.api}/", wait_until="networkidle")
        assert response is not None and response.ok, response
        assert page.url.startswith("https://")
        assert "max-age=" in response.headers["strict-transport-security"]
        page.locator("[data-testid=login-token]").fill(tls_cluster.admin_token)
        page.locator("[data-testid=login-submit]").click()
        page.locator("[data-testid=login]").wait_for(state="hidden", timeout=10_000)
        cookie = next(c for c in page.context.cookies() if c["name"] == "mwms_session")
        assert cookie["secure"] and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        page.goto(f"{tls_cluster.api}/#/agents", wait_until="networkidle")
        assert not errors, errors
    finally:
        browser.close()
