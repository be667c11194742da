"""The reads the REST routers hand to services (issue 17 item 4): the agents view and the overview, a
job's log page and its paging rules, the upload size rule, and refusals that close the connection,
mapped in server/api/errors.py only."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from sqlalchemy import inspect, select

from mwms.server.api.errors import closing_on_refusal, install_error_handlers
from mwms.server.api.views import agent_out, job_out
from mwms.server.app import create_app
from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Attempt, Task, utcnow
from mwms.server.errors import InvalidInput, NotFound, UploadTooLarge
from mwms.server.schemas import ATTEMPTS_SHOWN
from mwms.server.services.observing import stacks, telemetry
from mwms.server.services.observing.cluster_counts import ClusterOverview, count_overview
from mwms.server.services.observing.log_pages import read_log_page
from mwms.server.services.storage.uploads import MULTIPART_OVERHEAD, check_body_size
from mwms.server.services.views import agents_view, read_job_view, read_stacks_view
from mwms.server.settings import Settings
from mwms_testkit import STACK_DUMPS
from mwms_testkit.coordinator_rows import place_task, seeded_database

DIGEST = "d" * 64
ADMIN_TOKEN = "mwms_admin-token-for-read-view-tests-0123"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = seeded_database(tmp_path / "views.db", DIGEST, ("alpha", "beta", "gamma"))
    yield database
    database.dispose()


def agent_id(db: Database, name: str) -> str:
    with db.read() as session:
        return session.scalars(select(Agent.id).where(Agent.name == name)).one()


def test_agents_view_and_overview_count_devices_of_online_agents_and_live_jobs(db: Database) -> None:
    task = place_task(db, agent_id(db, "alpha"), digest=DIGEST)
    place_task(db, agent_id(db, "beta"), digest=DIGEST, state="ASSIGNED", job_state="SCHEDULED")
    with db.write() as session:
        session.get(Agent, agent_id(db, "gamma")).online_until = utcnow() - timedelta(seconds=1)

    with db.read() as session:
        views = agents_view(session)
        overview = count_overview(session)
        [alpha] = agents_view(session, agent_id(db, "alpha"))
    assert [(v.agent.name, v.online, v.devices_used, v.devices_free) for v in views] == [
        ("alpha", True, 1, 0),
        ("beta", True, 1, 0),
        ("gamma", False, 0, 1),
    ]
    assert [t.id for t in alpha.tasks] == [task.id] and alpha.job_names == {task.job_id: "j"}
    assert overview == ClusterOverview(
        agents_online=2, agents_lost=1, devices_busy=2, devices_free=0, jobs_running=2, jobs_pending=0
    )


def test_the_agents_view_reads_no_task_column_the_list_does_not_show(db: Database) -> None:
    """A gang's TF_CONFIG names every worker (kilobytes a task): the agents list of a cluster running one must
    not read it for every task, nor anything else it does not show."""
    place_task(db, agent_id(db, "alpha"), digest=DIGEST)
    with db.read() as session:
        [alpha] = agents_view(session, agent_id(db, "alpha"))
        [task] = alpha.tasks
        unread = inspect(task).unloaded
        shown = agent_out(alpha)
    assert {"tf_config", "message", "stop_reason", "environment_platform"} <= unread
    assert [(t.task_index, t.state, t.device_indices) for t in shown.tasks] == [(0, "RUNNING", [0])]


def test_a_job_view_carries_its_agents_names_and_says_not_found_for_an_unknown_id(db: Database) -> None:
    task = place_task(db, agent_id(db, "alpha"), digest=DIGEST)
    with db.read() as session:
        view = read_job_view(session, task.job_id)
        assert view.agent_names == {task.agent_id: "alpha"} and view.progress == (None, None)
        with pytest.raises(NotFound):
            read_job_view(session, "no-such-job")


def test_a_job_view_reads_only_the_attempts_it_shows(db: Database) -> None:
    """A job that failed many times (64 workers, 1,000 attempts: 4-5 s a GET when every task was read)."""
    task = place_task(db, agent_id(db, "alpha"), digest=DIGEST, state="FAILED")
    total = ATTEMPTS_SHOWN + 5
    with db.write() as session:
        for number in range(2, total + 1):
            attempt = Attempt(
                job_id=task.job_id, number=number, state="FAILED" if number < total else "ACTIVE"
            )
            session.add(attempt)
            session.flush()
            for index in range(2):
                session.add(
                    Task(
                        job_id=task.job_id,
                        attempt_id=attempt.id,
                        attempt_number=number,
                        index=index,
                        agent_id=task.agent_id,
                        host="127.0.0.1",
                        port=20000 + index,
                        device_kind="cpu",
                        device_indices=[0],
                        state="RUNNING" if number == total else "FAILED",
                    )
                )
    with db.read() as session:
        view = read_job_view(session, task.job_id)
        out = job_out(view)
        read = [o for o in session.identity_map.values() if isinstance(o, (Task, Attempt))]  # view holds them
    assert out.attempts == total
    assert [a.number for a in out.attempt_history] == list(range(6, total + 1))
    assert [(t.index, t.attempt, t.state) for t in out.tasks] == [
        (0, total, "RUNNING"),
        (1, total, "RUNNING"),
    ]
    assert len(read) == ATTEMPTS_SHOWN * 3  # the shown attempts and their two tasks each, no more


def test_a_log_page_is_the_tail_or_the_lines_after_a_cursor_with_the_next_cursor(db: Database) -> None:
    task = place_task(db, agent_id(db, "alpha"), digest=DIGEST)
    now_ms = int(utcnow().timestamp() * 1000)
    with db.write() as session:
        lines = [telemetry.IncomingLine(seq, "stdout", f"line {seq}", now_ms) for seq in range(1, 6)]
        telemetry.store_log_lines(session, session.get(Task, task.id), lines)

    def page(**kwargs: object) -> tuple[list[str], int, bool]:
        query = {"task": None, "attempt": None, "after": 0, "tail": 1000} | kwargs
        with db.read() as session:
            found = read_log_page(session, task.job_id, **query)  # type: ignore[arg-type]
        return [line.text for line in found.lines], found.next_after, found.job_ended

    texts, cursor, ended = page(tail=2)
    assert texts == ["line 4", "line 5"] and not ended
    everything, last, _ = page(task=0, attempt=1)
    assert everything == [f"line {seq}" for seq in range(1, 6)] and last == cursor
    with db.read() as session:
        first_id = read_log_page(session, task.job_id, task=None, attempt=None, after=0, tail=5).lines[0].id
    assert page(after=first_id, tail=2)[:2] == (["line 2", "line 3"], first_id + 2)
    assert page(after=cursor) == ([], cursor, False)  # no newer lines: the cursor stays
    with pytest.raises(NotFound, match="there is no task 3"):
        page(task=3)
    with pytest.raises(NotFound):
        page(attempt=2)


def test_the_upload_size_rule_allows_the_multipart_framing_and_not_a_byte_more() -> None:
    check_body_size(10 + MULTIPART_OVERHEAD, 10)
    with pytest.raises(UploadTooLarge, match="larger than the limit of 10 bytes"):
        check_body_size(11 + MULTIPART_OVERHEAD, 10)


def test_only_refusals_inside_closing_on_refusal_close_the_connection() -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/too-large")
    def too_large(request: Request) -> None:
        with closing_on_refusal(request):
            raise UploadTooLarge("over the limit")

    @app.get("/invalid-after")
    def invalid_after(request: Request) -> None:
        with closing_on_refusal(request):
            pass
        raise InvalidInput("refused after the body was read")

    @app.get("/missing")
    def missing(request: Request) -> None:
        with closing_on_refusal(request):
            raise NotFound("not an upload refusal")

    with TestClient(app) as client:
        answer = client.get("/too-large")
        assert (answer.status_code, answer.json(), answer.headers.get("connection")) == (
            413,
            {"detail": "over the limit"},
            "close",
        )
        answer = client.get("/invalid-after")
        assert (answer.status_code, answer.headers.get("connection")) == (400, None)
        answer = client.get("/missing")  # not a refusal of the body: no close
        assert (answer.status_code, answer.headers.get("connection")) == (404, None)


def test_refused_bundle_uploads_close_the_connection_and_other_errors_do_not(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "coordinator", grpc_port=0, admin_token=ADMIN_TOKEN, max_upload_bytes=1000
    )
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
        declared = client.post(
            "/api/v1/bundles",
            content=b"x" * (1001 + MULTIPART_OVERHEAD),
            headers={"Content-Type": "application/gzip"},
        )
        assert declared.status_code == 413 and declared.headers.get("connection") == "close"
        assert "larger than the limit of 1000 bytes" in declared.json()["detail"]
        malformed = client.post(
            "/api/v1/bundles",
            content=b"no parts",
            headers={"Content-Type": "multipart/form-data; boundary=b"},
        )
        assert malformed.status_code == 400 and malformed.headers.get("connection") == "close"
        unknown = client.get("/api/v1/jobs/no-such-job")
        assert unknown.status_code == 404 and unknown.headers.get("connection") is None


def test_a_stacks_view_names_each_dumps_agent_and_parses_its_threads(db: Database) -> None:
    task = place_task(db, agent_id(db, "alpha"), digest=DIGEST)
    text = (STACK_DUMPS / "py_spy_worker0_step_in_tf_function.txt").read_text()
    with db.read() as session:
        assert read_job_view(session, task.job_id).latest_stacks is None  # and its GET answers 404
    with db.write() as session:
        opened = stacks.open_stack_request(session, task.job_id, "request", "ann", any_owner=True)
    with db.read() as session:
        pending = read_stacks_view(session, task.job_id, None)
        assert read_job_view(session, task.job_id).latest_stacks == opened.request_id
    assert [(t.agent_name, t.answered) for t in pending.tasks] == [("alpha", False)] and not pending.complete
    with db.write() as session:
        [asked] = opened.asked
        incoming = stacks.IncomingStackDump(opened.request_id, asked.task_id, 1000, "py-spy", text, "")
        assert stacks.store_stack_dump(session, asked.agent_id, incoming)
    with db.read() as session:
        view = read_stacks_view(session, task.job_id, opened.request_id)
    [answered] = view.tasks
    assert view.complete and answered.agent_name == "alpha" and answered.dump.text == text
    assert answered.threads and answered.threads[0].frames
