"""The polled lists built once for every caller within a second (server/api/view_cache.py): an answer is
served again until it expires or a request that may write is answered, concurrent requests share one
build, what is kept is bounded, and through the real app a second poll reads nothing from the database
while a caller's own write shows at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mwms.server.api.view_cache import ViewCache
from mwms.server.app import create_app
from mwms.server.db.engine import Database
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.server.settings import Settings
from mwms_testkit.coordinator_rows import seeded_database
from mwms_testkit.sql_statements import recorded

ADMIN_TOKEN = "mwms_admin-token-for-view-cache-tests-0123"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Builds:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> bytes:
        self.count += 1
        return f"answer {self.count}".encode()


def test_an_answer_is_served_again_until_it_expires_or_a_write_is_answered() -> None:
    clock, build = Clock(), Builds()
    cache = ViewCache(1.0, clock)
    assert cache.get("agents", build) == b"answer 1"
    clock.now += 0.9
    assert cache.get("agents", build) == b"answer 1"
    assert cache.get(("jobs", (), 0, 50), build) == b"answer 2"  # another list is built on its own
    clock.now += 0.1
    assert cache.get("agents", build) == b"answer 3"  # a second old: built again
    cache.invalidate()
    assert cache.get("agents", build) == b"answer 4"  # a write answered here: built again at once
    assert cache.get("agents", build) == b"answer 4"


def test_an_answer_built_while_a_write_is_answered_is_not_served_after_it() -> None:
    cache = ViewCache(1.0, Clock())

    def build_during_a_write() -> bytes:
        cache.invalidate()  # a write is answered while the list is read: the answer may predate it
        return b"maybe before the write"

    cache.get("agents", build_during_a_write)
    assert cache.get("agents", lambda: b"after the write") == b"after the write"


def test_no_cache_builds_every_time() -> None:
    build = Builds()
    cache = ViewCache(0, Clock())
    assert [cache.get("agents", build) for _ in range(3)] == [b"answer 1", b"answer 2", b"answer 3"]


def test_requests_that_arrive_during_a_build_wait_for_it_instead_of_building() -> None:
    started, release = threading.Event(), threading.Event()
    builds: list[int] = []

    def slow_build() -> bytes:
        builds.append(1)
        started.set()
        release.wait(10)
        return b"the one build"

    cache = ViewCache(5.0)
    answers: list[bytes] = []
    first = threading.Thread(target=lambda: answers.append(cache.get("agents", slow_build)))
    first.start()
    assert started.wait(10)
    waiting = [
        threading.Thread(target=lambda: answers.append(cache.get("agents", slow_build))) for _ in range(5)
    ]
    for thread in waiting:
        thread.start()
    release.set()
    for thread in (first, *waiting):
        thread.join(10)
    assert answers == [b"the one build"] * 6 and len(builds) == 1


def test_what_is_kept_is_bounded_in_entries_and_bytes() -> None:
    clock = Clock()
    cache = ViewCache(60.0, clock, max_entries=3, max_bytes=100)
    for page in range(5):
        cache.get(("jobs", page), lambda page=page: f"page {page}".encode())
    # The two least recently used were dropped: asking for them builds again.
    assert cache.get(("jobs", 0), lambda: b"rebuilt") == b"rebuilt"
    assert cache.get(("jobs", 4), lambda: b"rebuilt") == b"page 4"
    cache.get("big", lambda: b"x" * 101)  # larger than the whole budget: served, never kept
    assert cache.get("big", lambda: b"small") == b"small"
    cache.get("half", lambda: b"y" * 60)
    cache.get("other half", lambda: b"z" * 60)  # over the byte budget together: the older one goes
    assert cache.get("half", lambda: b"gone") == b"gone"


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[tuple[TestClient, Database]]:
    (tmp_path / "coordinator").mkdir()
    seeded_database(tmp_path / "coordinator" / "mwms.db", None, ("alpha",)).dispose()
    settings = Settings(
        data_dir=tmp_path / "coordinator", grpc_port=0, admin_token=ADMIN_TOKEN, view_cache_s=10.0
    )
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
        yield client, client.app.state.wiring.db  # type: ignore[attr-defined]


def test_a_second_poll_reads_nothing_and_a_write_here_shows_at_once(
    app_client: tuple[TestClient, Database], tmp_path: Path
) -> None:
    client, db = app_client
    with recorded(db.engine, lambda statement: "FROM agents" in statement) as reads:
        first = client.get("/api/v1/agents")
        assert [a["name"] for a in first.json()] == ["alpha"] and first.headers["content-type"] == (
            "application/json"
        )
        read_once = len(reads)
        assert read_once > 0
        for path in ("/api/v1/agents", "/api/v1/overview", "/api/v1/jobs", "/api/v1/queue"):
            client.get(path)
        reads_before = len(reads)
        assert client.get("/api/v1/agents").content == first.content and len(reads) == reads_before
        assert client.get("/api/v1/overview").json()["agents_online"] == 1

        # What agents, loops and other replicas write shows once the answer expires; a write answered
        # here (removing an agent) shows at once, with what was written elsewhere meanwhile.
        other = Database(db.url)
        slot = [{"kind": "cpu", "index": 0, "name": "s"}]
        with other.write() as session:
            register_agent(session, Registration("beta", "beta", "127.0.0.1", 20100, 20110, slot, "t"), 30)
        other.dispose()
        assert [a["name"] for a in client.get("/api/v1/agents").json()] == ["alpha"]
        assert client.delete("/api/v1/agents/alpha").status_code == 200
        assert [a["name"] for a in client.get("/api/v1/agents").json()] == ["beta"]
        assert client.get("/api/v1/overview").json()["agents_online"] == 1


def test_each_query_of_a_list_is_its_own_answer(app_client: tuple[TestClient, Database]) -> None:
    client, _ = app_client
    assert client.get("/api/v1/jobs", params={"limit": 1}).json()["limit"] == 1
    assert client.get("/api/v1/jobs", params={"limit": 2}).json()["limit"] == 2
    assert client.get("/api/v1/jobs", params={"state": ["RUNNING", "PENDING"]}).json()["total"] == 0
    assert client.get("/api/v1/queue", params={"offset": 3}).json()["offset"] == 3
    refused = client.get("/api/v1/jobs", params={"limit": 0})
    assert refused.status_code == 422
    # Who asks is checked before any answer kept here is served.
    assert client.get("/api/v1/agents", headers={"Authorization": "Bearer mwms_wrong"}).status_code == 401


def test_only_an_api_only_replica_keeps_answers_unless_told(tmp_path: Path) -> None:
    def seconds(**given: Any) -> float:
        return Settings(data_dir=tmp_path, **given).view_cache_seconds

    # A replica holding agents' streams answers what they just said: its lists are built for each request.
    assert (seconds(), seconds(serve="agents"), seconds(serve="api")) == (0.0, 0.0, 1.0)
    assert (seconds(serve="both", view_cache_s=2), seconds(serve="api", view_cache_s=0)) == (2.0, 0.0)
    with pytest.raises(ValueError, match="view_cache_s"):
        Settings(data_dir=tmp_path, view_cache_s=float("inf"))
