"""One fake of the coordinator's REST API, for the CLI's, the Python client's and the dashboard's tests.

A real FastAPI app served over real HTTP (served_app.py) that answers with the coordinator's own response
models (mwms.server.schemas, as each route's response_model): a shape the coordinator would not send fails
the request with a 500, and tests/integration/test_fake_api_shapes.py checks every route against the real
coordinator's OpenAPI document. Modules, by resource:

- state.py: FakeState (tokens, sessions, jobs, agents, teams, switches, what was sent) and the fixed tokens
- fake_job.py: FakeJob, a job told as a story from its state; scripted_job.py: a submitted job's life
- seed.py: the dashboard's cluster (`FakeState(seeded=True)`)
- auth.py: who may call what, log-in, tokens; jobs.py and cluster.py: the other routes
- app.py: create_app(state), serve_fake_api()
"""

from mwms_testkit.fake_api.app import create_app, serve_fake_api
from mwms_testkit.fake_api.fake_job import T0, FakeJob, _iso, attempt_ending, attempt_events, fake_task
from mwms_testkit.fake_api.scripted_job import ScriptedJob
from mwms_testkit.fake_api.seed import NO_FIT, XSS_LOG, XSS_NAME
from mwms_testkit.fake_api.state import ADMIN_TOKEN, USER_TOKEN, VIEWER_TOKEN, FakeState, fake_agent

__all__ = [
    "ADMIN_TOKEN",
    "NO_FIT",
    "T0",
    "USER_TOKEN",
    "VIEWER_TOKEN",
    "XSS_LOG",
    "XSS_NAME",
    "FakeJob",
    "FakeState",
    "ScriptedJob",
    "_iso",
    "attempt_ending",
    "attempt_events",
    "create_app",
    "fake_agent",
    "fake_task",
    "serve_fake_api",
]
