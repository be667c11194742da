"""Untrusted text never reaches a terminal raw (mwms/cli/safe_text.py).

First `terminal_safe` and the SafeConsole over edge values. Then the real `mwms` CLI as a subprocess whose
stdout and stderr are a pseudo-terminal (TERM=xterm-256color, COLUMNS=200): against a real coordinator and
agent (testkit/mwms_testkit/cluster.py) holding a job, a user, a token, an agent, log lines and a metric with hostile names,
and against the fake API (testkit/mwms_testkit/fake_api/) for what a real coordinator refuses to hold or
only makes up itself (escape sequences in agent names, reasons, task messages, stack frames). The bytes read
from the pty master must hold nothing of the payloads' sequences: with rich's own colours (SGR) taken out,
no ESC at all, no BEL, no C1 control, no bidi override; and `[/]` and `[link=…]` come out literally.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import random
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest
from rich.table import Table

from mwms.cli.doctor import doctor_table
from mwms.cli.output import jobs_table, log_line_text, raw_log_line
from mwms.cli.safe_text import SafeConsole, safe_text, terminal_safe
from mwms_testkit.cluster import Cluster, pack, wait_until
from mwms_testkit.fake_api import ADMIN_TOKEN, USER_TOKEN, FakeJob, FakeState, fake_agent, fake_task

MWMS = [sys.executable, "-m", "mwms.cli.main"]

TITLE = "\x1b]0;pwned-title\x07"
LINK = "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"
DECRQSS = "\x1bP$qm\x1b\\"  # asks the terminal to type its SGR state back, as if the user typed it
CLEAR = "\x1b[2J\x1b[H"
C1 = "\x9b2J\x9d0;c1-title\x9c"
BIDI = "\u202egnp.exe\u202c"
MARKUP = "[/][link=http://evil.example]y[/link][bold]b"
HOSTILE = f"name{TITLE}{LINK}{DECRQSS}{CLEAR}{C1}{BIDI}{MARKUP}\x07\x08end"
HOSTILE_SHOWN = "nameclickgnp.exe[/][link=http://evil.example]y[/link][bold]bend"
# A real coordinator keeps agent names printable; markup is printable. (testkit/mwms_testkit/cluster.py names files after
# the agent: no "/", so a link that is opened and never closed.)
AGENT_NAME = "agent[link=https:evil.example]x[bold]y"
# It keeps user and token names printable too.
USER = "mallory[/][link=https:evil.example]"
TOKEN_NAME = "laptop[/][bold]"
METRIC = f"loss{TITLE}[/]{CLEAR}"

SGR = re.compile(rb"\x1b\[[0-9;]*m")
FORBIDDEN = [
    *(chr(code).encode() for code in (*range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A))),
    *(bytes([code]) for code in (*range(0x00, 0x09), *range(0x0B, 0x0D), *range(0x0E, 0x20), 0x7F)),
]


def assert_terminal_safe(output: bytes) -> None:
    """No payload sequence: after rich's SGR colours, no ESC; no BEL, C0 (but \\t\\r\\n), C1 or bidi."""
    for sequence in (b"\x1b]0;", b"\x1b]8;", b"\x1bP", b"\x1b[2J", b"\x07"):
        assert sequence not in output, f"{sequence!r} reached the terminal: {output!r}"
    rest = SGR.sub(b"", output)
    assert b"\x1b" not in rest, f"an escape sequence that is not a colour: {rest!r}"
    # \r is the pty's own: its line discipline writes \n as \r\n.
    found = [character for character in FORBIDDEN if character in rest]
    assert not found, f"{found!r} reached the terminal: {output!r}"


# -- terminal_safe ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain", "plain"),
        ("a\x1b]0;window title\x07b", "ab"),  # OSC ended by BEL
        ("a\x1b]0;window title\x1b\\b", "ab"),  # OSC ended by ST
        ("a\x1b]8;;http://x/\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),  # OSC 8 hyperlink
        ("a\x1bP$qm\x1b\\b", "ab"),  # DCS (DECRQSS)
        ("a\x1bXsos\x1b\\b\x1b^pm\x1b\\c\x1b_apc\x1b\\d", "abcd"),  # SOS, PM, APC
        ("a\x1b[2Jb\x1b[1;31mc\x1b[?1049hd\x1b[0 qe", "abcde"),  # CSI with parameters, private, intermediate
        ("a\x1bcb\x1b7c\x1b8d\x1b#8e\x1b(Bf\x1bMg", "abcdefg"),  # two-character and nF sequences
        ("a\x9b2Jb\x9d0;t\x9cc\x90q\x9cd", "abcd"),  # 8-bit CSI, OSC, DCS
        ("a\x85b\x9fc\x80d", "abcd"),  # other C1 controls
        ("end\x1b", "end"),  # lone ESC at the end
        ("a\x1b\nb", "a\nb"),  # ESC before a byte that starts no sequence
        ("a\x1b]0;never ended", "a0;never ended"),  # unterminated OSC: its text stays, harmless
        ("a\x1bP$q never ended", "a$q never ended"),
        ("a\x1b[12", "a12"),  # unterminated CSI
        ("a\x07b\x08c\rd\x0be\x0cf\x00g\x7fh\x1ci", "abcdefghi"),
        ("\u202eevil\u202c \u2066iso\u2069 \u202a\u202b\u202d\u2067\u2068", "evil iso "),
        ("tab\tand\nnewline", "tab\tand\nnewline"),
        ("[/]", "[/]"),
        ("[link=http://x]y[/link]", "[link=http://x]y[/link]"),
        ("[bold]b[/bold] :thumbs_up:", "[bold]b[/bold] :thumbs_up:"),
        ("héllo wörld ✓ 日本語 😀 👩‍🔬 ‏", "héllo wörld ✓ 日本語 😀 👩‍🔬 ‏"),
        ("lone \ud800 surrogate", "lone \ufffd surrogate"),
        ("", ""),
        (None, ""),
        (42, "42"),
    ],
)
def test_terminal_safe(text: object, shown: str) -> None:
    assert terminal_safe(text) == shown


def test_terminal_safe_leaves_no_controls_and_is_idempotent() -> None:
    alphabet = ["\x1b", "[", "]", "P", "\\", "\x07", "\x9c", "\x9b", "0", ";", "m", "J", "x", "é", "\n", "\t"]
    alphabet += ["\r", "\x00", "\x7f", "\u202e", "\u2066", "#", "(", " ", "?", "😀", "\x85"]
    rng = random.Random(16)
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        safe = terminal_safe(text)
        bad = [c for c in safe if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]
        assert not bad and "\u202e" not in safe and "\u2066" not in safe, (text, safe)
        assert terminal_safe(safe) == safe, text


# -- rendering in-process, on a console that believes it is a terminal ----------------------------------


def render(*renderables: object) -> bytes:
    buffer = io.StringIO()
    console = SafeConsole(file=buffer, force_terminal=True, color_system="truecolor", width=200)
    for renderable in renderables:
        console.print(renderable)
    return buffer.getvalue().encode("utf-8", "surrogatepass")


def test_the_console_prints_markup_and_sequences_literally_even_when_given_raw_strings() -> None:
    """The net under the explicit calls: a raw f-string, a table of raw str cells, a Text."""
    table = Table()
    table.add_column(METRIC)
    table.add_row(HOSTILE)
    printed = render(f"reason: {HOSTILE}", table, safe_text(HOSTILE, "bold"), ":thumbs_up:")
    assert_terminal_safe(printed)
    assert SGR.sub(b"", printed).count(HOSTILE_SHOWN.encode()) == 3
    assert b":thumbs_up:" in printed


def test_tables_and_log_lines_of_hostile_values() -> None:
    job = {"id": f"j1{CLEAR}", "name": "[/]", "submitted_by": USER, "state": f"RUNNING{TITLE}"}
    jobs = jobs_table([job, {**job, "name": HOSTILE, "attempts": DECRQSS}])
    line = {"task": f"0{TITLE}", "stream": "stderr", "text": HOSTILE + "\n"}
    printed = render(jobs, log_line_text(line, prefix=True), log_line_text(line, prefix=False))
    assert_terminal_safe(printed)
    assert f"[task 0] {HOSTILE_SHOWN}".encode() in SGR.sub(b"", printed)
    rows = [
        {
            "worker": 0,
            "agent": HOSTILE,
            "address": f"10.0.0.1{CLEAR}",
            "ok": False,
            "message": HOSTILE,
            "peers_reachable": [1],
            "tcp": None,
            "allreduce": [],
            "collective": TITLE,
        }
    ]
    assert_terminal_safe(render(doctor_table(rows)))


def test_a_raw_log_line_keeps_every_byte() -> None:
    line = {"task": 1, "text": HOSTILE}
    assert raw_log_line(line, prefix=True) == f"[task 1] {HOSTILE}\n".encode()
    assert raw_log_line({"task": 1, "text": "ends\n"}, prefix=False) == b"ends\n"


# -- the real CLI on a pseudo-terminal ----------------------------------------------------------------------


def cli_env(token: str) -> dict[str, str]:
    """This process's environment (its private config home), none of its MWMS_*, a colour terminal."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MWMS_")}
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(name, None)
    return {**env, "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "50", "MWMS_TOKEN": token}


@dataclass
class Printed:
    code: int
    output: bytes

    @property
    def text(self) -> str:
        """What was printed, colours taken out and the pty's \\r\\n read as \\n."""
        return SGR.sub(b"", self.output).replace(b"\r\n", b"\n").decode("utf-8", "replace")


def run_on_pty(args: list[str], env: dict[str, str], timeout: float = 60) -> Printed:
    """Runs `mwms ARGS` with stdin, stdout and stderr on a new pty (200x50); returns its exit code and
    every byte read from the master side."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    try:
        process = subprocess.Popen(
            [*MWMS, *args], stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
    finally:
        os.close(slave)
    output = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                process.kill()
                raise AssertionError(
                    f"mwms {args} did not end within {timeout} s; printed: {bytes(output)!r}"
                )
            ready, _, _ = select.select([master], [], [], remaining)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the CLI exited and closed the slave side
                break
            if not chunk:
                break
            output += chunk
        return Printed(process.wait(timeout=30), bytes(output))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)


def run_piped(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*MWMS, *args], env=env, capture_output=True, timeout=60, check=False)


PROGRAM = f"""
import json, os, sys
hostile = {HOSTILE!r}
print(hostile, flush=True)
print("a plain line", flush=True)
print(hostile, file=sys.stderr, flush=True)
with open(os.environ["MWMS_METRICS_FILE"], "a") as metrics:
    metrics.write(json.dumps({{"name": {METRIC!r}, "step": 1, "value": 0.5}}) + "\\n")
    metrics.write(json.dumps({{"name": "accuracy", "step": 1, "value": 0.75}}) + "\\n")
sys.exit(3)
"""


@dataclass
class HostileCluster:
    api: str
    admin_token: str
    job_id: str


@pytest.fixture(scope="module")
def hostile_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileCluster]:
    """A real coordinator and agent; a user, a token, an agent, a job, its log lines and a metric with
    hostile names. The job printed its lines, reported its metrics and FAILED (exit 3)."""
    cluster = Cluster(root=tmp_path_factory.mktemp("hostile"))
    try:
        cluster.start_server()
        cluster.start_agent(AGENT_NAME, port_low=24400)
        created = cluster.http.post("/api/v1/tokens", json={"user": USER, "role": "user", "name": TOKEN_NAME})
        assert created.status_code == 201, created.text
        with cluster.client(created.json()["token"]) as mallory:
            uploaded = mallory.post(
                "/api/v1/bundles", files={"file": ("bundle.tar.gz", pack({"main.py": PROGRAM}))}
            )
            assert uploaded.status_code in (200, 201), uploaded.text
            spec = {
                "name": HOSTILE,
                "bundle_digest": uploaded.json()["digest"],
                "command": ["python", "main.py"],
                "workers": 1,
                "restart": {"max_restarts": 0},
            }
            submitted = mallory.post("/api/v1/jobs", json=spec)
            assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]
        cluster.wait_for(job_id, {"FAILED", "SUCCEEDED", "CANCELLED"}, timeout=120)
        wait_until(lambda: len(cluster.logs(job_id)) >= 3, 30, "the job's three log lines")
        wait_until(lambda: len(cluster.metrics(job_id)) >= 2, 30, "the job's two metric points")
        yield HostileCluster(cluster.api, cluster.admin_token, job_id)
    finally:
        cluster.stop()


@pytest.mark.e2e
def test_jobs_and_status_of_a_hostile_job_on_a_terminal(hostile_cluster: HostileCluster) -> None:
    env = cli_env(hostile_cluster.admin_token)
    listed = run_on_pty(["jobs", "--api", hostile_cluster.api], env)
    assert listed.code == 0, listed.output
    assert_terminal_safe(listed.output)
    assert "[/]" in listed.text and "mallory" in listed.text and hostile_cluster.job_id in listed.text

    shown = run_on_pty(["status", hostile_cluster.job_id, "--api", hostile_cluster.api], env)
    assert shown.code == 0, shown.output
    assert_terminal_safe(shown.output)
    assert HOSTILE_SHOWN in shown.text and "FAILED" in shown.text
    assert f"submitted by: {USER}" in shown.text


@pytest.mark.e2e
def test_logs_are_made_safe_on_a_terminal_and_in_a_pipe(hostile_cluster: HostileCluster) -> None:
    env = cli_env(hostile_cluster.admin_token)
    api = ["--api", hostile_cluster.api]
    for extra in ([], ["--follow"], ["--task", "0"]):
        printed = run_on_pty(["logs", hostile_cluster.job_id, *api, *extra], env)
        assert printed.code == 0, printed.output
        assert_terminal_safe(printed.output)
        assert printed.text.count(HOSTILE_SHOWN) == 2 and "a plain line" in printed.text
    piped = run_piped(["logs", hostile_cluster.job_id, *api], env)
    assert piped.returncode == 0, piped.stderr
    assert b"\x1b" not in piped.stdout and b"\x07" not in piped.stdout
    assert piped.stdout.decode().count(f"[task 0] {HOSTILE_SHOWN}\n") == 2


@pytest.mark.e2e
def test_logs_raw_writes_the_stored_bytes(hostile_cluster: HostileCluster) -> None:
    env = cli_env(hostile_cluster.admin_token)
    api = ["--api", hostile_cluster.api]
    raw = run_piped(["logs", hostile_cluster.job_id, "--raw", *api], env)
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout.count(f"[task 0] {HOSTILE}\n".encode()) == 2
    assert b"[task 0] a plain line\n" in raw.stdout
    bare = run_piped(["logs", hostile_cluster.job_id, "--raw", "--task", "0", *api], env)
    assert bare.stdout.count(f"{HOSTILE}\n".encode()) == 2 and b"[task" not in bare.stdout


@pytest.mark.e2e
def test_metrics_agents_and_tokens_on_a_terminal(hostile_cluster: HostileCluster) -> None:
    env = cli_env(hostile_cluster.admin_token)
    api = ["--api", hostile_cluster.api]
    metrics = run_on_pty(["metrics", hostile_cluster.job_id, *api], env)
    assert metrics.code == 0, metrics.output
    assert_terminal_safe(metrics.output)
    assert "LOSS[/]" in metrics.text and "0.5" in metrics.text

    agents = run_on_pty(["agents", *api], env)
    assert agents.code == 0, agents.output
    assert_terminal_safe(agents.output)
    assert AGENT_NAME in agents.text

    tokens = run_on_pty(["token", "list", *api], env)
    assert tokens.code == 0, tokens.output
    assert_terminal_safe(tokens.output)
    assert USER in tokens.text and TOKEN_NAME in tokens.text


@pytest.mark.e2e
def test_an_error_message_quoting_user_text_is_made_safe(hostile_cluster: HostileCluster) -> None:
    printed = run_on_pty(
        ["status", f"nosuchjob{TITLE}{CLEAR}", "--api", hostile_cluster.api],
        cli_env(hostile_cluster.admin_token),
    )
    assert printed.code == 4, printed.output
    assert_terminal_safe(printed.output)
    assert "error:" in printed.text and "nosuchjob" in printed.text


# -- against the fake API: what a real coordinator only makes up itself -------------------------------------


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def hostile_job(job_id: str) -> FakeJob:
    task = fake_task(
        job_id,
        0,
        attempt=1,
        state="FAILED",
        agent=HOSTILE,
        started_at=datetime.now(timezone.utc),
        exit_code=3,
        workers=1,
        agent_id="a1",
        address=f"10.0.0.1:2000{CLEAR}",
        message=f"exited with code 3; last lines:\n{HOSTILE}",
        device_kind="CPU",
    )
    return FakeJob(
        job_id,
        HOSTILE,
        "FAILED",
        datetime.now(timezone.utc),
        reason=f"task 0 exited with code 3; last lines:\n{HOSTILE}\n{DECRQSS}",
        submitted_by=USER,
        cancelled_by=HOSTILE,
        workers=1,
        gpus_per_worker=0,
        metrics=[{"name": "loss", "step": 1, "value": 0.5, "wall_time": _now(), "attempt": 1}],
        # The coordinator refuses a hostile communication implementation (an enum), so none is shown here.
        spec={
            "command": ["python", HOSTILE],
            "bundle_digest": "ab" * 32,
            "env_names": [METRIC],
            "communication": {"implementation": "RING"},
            "restart": {"max_restarts": 0},
            "startup_timeout_seconds": None,
            "max_runtime_seconds": None,
        },
        tasks=[task],
        events=[{"from_state": "RUNNING", "to_state": "FAILED", "reason": HOSTILE, "at": _now()}],
    )


def test_status_of_hostile_reasons_events_and_task_messages(fake_api: tuple[str, FakeState]) -> None:
    url, state = fake_api
    state.jobs["jobhostile"] = hostile_job("jobhostile")
    printed = run_on_pty(["status", "jobhostile", "--api", url], cli_env(USER_TOKEN))
    assert printed.code == 0, printed.output
    assert_terminal_safe(printed.output)
    assert printed.text.count("[/]") >= 6


def test_agents_with_escape_sequences_in_their_names(fake_api: tuple[str, FakeState]) -> None:
    url, state = fake_api
    task = {"job_id": "j1", "job_name": HOSTILE, "task_index": 0, "attempt": 1, "state": "RUNNING"}
    state.agents = [
        fake_agent(
            f"a1{TITLE}",
            HOSTILE,
            hostname=HOSTILE,
            address=f"127.0.0.1{CLEAR}",
            devices=[{"kind": f"CPU{DECRQSS}", "index": 0, "name": "cpu:0"}],
            devices_used=1,
            devices_free=0,
            tasks=[{**task, "device_indices": [0]}],
        )
    ]
    printed = run_on_pty(["agents", "--api", url], cli_env(USER_TOKEN))
    assert printed.code == 0, printed.output
    assert_terminal_safe(printed.output)
    assert "[/]" in printed.text


def test_tokens_with_escape_sequences_in_their_names(fake_api: tuple[str, FakeState]) -> None:
    url, state = fake_api
    state.add_token("mwms_hostile-secret", HOSTILE, "user", name=HOSTILE, created_by=f"alice{TITLE}")
    printed = run_on_pty(["token", "list", "--api", url], cli_env(ADMIN_TOKEN))
    assert printed.code == 0, printed.output
    assert_terminal_safe(printed.output)
    assert "[/]" in printed.text


def test_stacks_with_hostile_frames(fake_api: tuple[str, FakeState]) -> None:
    url, state = fake_api
    state.jobs["jobhostile"] = hostile_job("jobhostile")
    state.stack_dumps["jobhostile"] = {
        "id": f"dump1{TITLE}",
        "job_id": "jobhostile",
        "attempt": 1,
        "cause": "request",
        "requested_by": USER,
        "requested_at": _now(),
        "complete": False,
        "tasks": [
            {
                "task_index": 0,
                "task_id": "jobhostile-0",
                "agent_id": "a1",
                "agent_name": HOSTILE,
                "pid": 123,
                "method": f"py-spy{CLEAR}",
                "answered": True,
                "error": HOSTILE,
                "in_collective": True,
                "received_at": _now(),
                "text": HOSTILE,
                "threads": [
                    {
                        "title": f"Thread 1 ({HOSTILE})",
                        "in_collective": True,
                        "frames": [f"train ({HOSTILE}.py:1)", f"{DECRQSS}[/]"],
                    }
                ],
            }
        ],
    }
    for refresh in ("--refresh", "--no-refresh"):
        printed = run_on_pty(["stacks", "jobhostile", refresh, "--api", url], cli_env(USER_TOKEN))
        assert printed.code == 0, printed.output
        assert_terminal_safe(printed.output)
        assert f"train ({HOSTILE_SHOWN}.py:1)" in printed.text and "[in collective]" in printed.text


def test_json_output_stays_exact(fake_api: tuple[str, FakeState]) -> None:
    url, state = fake_api
    state.jobs["jobhostile"] = hostile_job("jobhostile")
    piped = run_piped(["status", "jobhostile", "--json", "--api", url], cli_env(USER_TOKEN))
    assert piped.returncode == 0, piped.stderr
    assert b"\x1b" not in piped.stdout  # json.dumps writes it as \u001b
    assert json.loads(piped.stdout)["name"] == HOSTILE
