"""Request limits on their own: the largest allowed job reaches an agent, the limits refuse settings that
would break that, every 422 is documented as sent, and log follows end and count as they should."""

from __future__ import annotations

import asyncio
from concurrent import futures

import grpc
import pytest
from pydantic import ValidationError

from mwms.server.app import GRPC_MAX_MESSAGE, create_app
from mwms.server.db.models import Job, Task
from mwms.server.limits import (
    AGENT_RECEIVE_LIMIT_BYTES,
    ARG_STRLEN_MAX,
    MAX_WORKER_ADDRESS_CHARS,
    MAX_WORKERS,
    SpecLimits,
    TooManyRequests,
    check_job_spec,
    start_task_bound,
)
from mwms.server.rpc.convert import start_task
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life.start_commands import StartDefaults, start_spec
from mwms.server.services.job_life.tf_config import build_tf_config
from mwms.server.services.observing.follows import FollowSlots, follow_lines
from mwms.server.settings import Settings
from mwms.v1 import agent_pb2 as pb
from mwms.worker_agent.channel import CHANNEL_OPTIONS

GRPC_DEFAULT_RECEIVE = 4 * 1024 * 1024


def _largest_spec(limits: SpecLimits, many_small: bool) -> JobCreate:
    """A spec at every env and command limit: as many entries as allowed, or few big ones."""
    if many_small:
        count = limits.env_vars
        name_len = min(limits.env_name_bytes, limits.env_total_bytes // count // 2)
        value_len = min(limits.env_value_bytes, limits.env_total_bytes // count - name_len)
    else:
        value_len = limits.env_value_bytes
        name_len = limits.env_name_bytes
        count = limits.env_total_bytes // (value_len + name_len)
    env = {f"V{i}".ljust(name_len, "N"): "x" * value_len for i in range(count)}
    args = limits.command_args if many_small else limits.command_bytes // (ARG_STRLEN_MAX - 1) + 1
    command = ["y" * (limits.command_bytes // args) for _ in range(args)]
    spec = JobCreate(
        bundle_digest="a" * 64,
        command=command,
        workers=MAX_WORKERS,
        gpus_per_worker=64,
        env=env,
        communication={"implementation": "NCCL", "timeout_seconds": 1.5, "bytes_per_pack": 2**62},
    )
    check_job_spec(spec, limits)  # within every limit
    return spec


def _start_message(spec: JobCreate) -> pb.CoordinatorMessage:
    addresses = [f"{'h' * (MAX_WORKER_ADDRESS_CHARS - 6)}:{65000 + i % 500}" for i in range(spec.workers)]
    job = Job(
        id="j" * 12,
        num_workers=spec.workers,
        bundle_digest=spec.bundle_digest,
        command=list(spec.command),
        env=dict(spec.env),
        options={"communication": spec.communication.model_dump(mode="json")},
    )
    task = Task(
        id="t" * 12,
        attempt_number=1001,
        index=spec.workers - 1,
        tf_config=build_tf_config(addresses, spec.workers - 1),
        port=65535,
        device_indices=list(range(64)),
        device_kind="gpu",
    )
    defaults = StartDefaults(stop_grace_s=3600, shared_checkpoint_dir="/" + "d" * 4095)
    return start_task(start_spec(task, job, defaults))


def _deliver(message: pb.CoordinatorMessage) -> pb.CoordinatorMessage:
    """Sends `message` from a server with the coordinator's options to a client with the agent's."""

    def handler(_request: bytes, _context: grpc.ServicerContext) -> bytes:
        return message.SerializeToString()

    server = grpc.server(
        futures.ThreadPoolExecutor(2),
        options=[
            ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
        ],
    )
    method = grpc.unary_unary_rpc_method_handler(handler)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("probe.Probe", {"Get": method})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as channel:
            call = channel.unary_unary("/probe.Probe/Get")
            return pb.CoordinatorMessage.FromString(call(b"", timeout=30))
    finally:
        server.stop(0)


@pytest.mark.parametrize("many_small", [True, False], ids=["many-small-entries", "few-large-entries"])
def test_the_largest_allowed_job_reaches_an_agent(many_small):
    limits = SpecLimits.of(Settings())
    message = _start_message(_largest_spec(limits, many_small))
    size = message.ByteSize()
    print(f"largest StartTask ({'many small' if many_small else 'few large'} entries): {size} bytes")
    assert size <= start_task_bound(limits) <= AGENT_RECEIVE_LIMIT_BYTES
    received = _deliver(message)
    assert received.start.env == message.start.env and len(received.start.command) == len(
        message.start.command
    )


def test_the_agent_channel_keeps_the_receive_limit_the_bound_assumes():
    receive = dict(CHANNEL_OPTIONS).get("grpc.max_receive_message_length", GRPC_DEFAULT_RECEIVE)
    assert receive >= AGENT_RECEIVE_LIMIT_BYTES


def test_a_message_over_the_limit_does_not_reach_an_agent():
    # The control for the test above: the channel really refuses what is over the limit.
    too_big = pb.CoordinatorMessage(start=pb.StartTask(tf_config="z" * AGENT_RECEIVE_LIMIT_BYTES))
    with pytest.raises(grpc.RpcError) as refused:
        _deliver(too_big)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_settings_refuse_limits_that_would_not_fit_the_agents_receive_limit():
    with pytest.raises(ValidationError) as refused:
        Settings(max_env_total_bytes=3 * 1024 * 1024, max_command_bytes=1024 * 1024)
    message = str(refused.value)
    assert "receive limit" in message and "MWMS_MAX_ENV_TOTAL_BYTES" in message


def test_every_422_is_documented_as_the_handler_sends_it(tmp_path):
    schema = create_app(Settings(data_dir=tmp_path)).openapi()
    text = str(schema)
    assert "HTTPValidationError" not in text
    documented = schema["components"]["schemas"]["ValidationErrorOut"]
    assert documented["required"] == ["detail", "errors"]
    with_422 = 0
    for path in schema["paths"].values():
        for operation in path.values():
            if "422" in operation["responses"]:
                with_422 += 1
                ref = operation["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/ValidationErrorOut"
    assert with_422 >= 10


def test_follow_slots_count_per_user_and_in_all():
    slots = FollowSlots(per_user=2, total=3)
    first, _second = slots.acquire("ann"), slots.acquire("ann")
    with pytest.raises(TooManyRequests, match="MWMS_MAX_FOLLOWS_PER_USER=2"):
        slots.acquire("ann")
    slots.acquire("bob")
    with pytest.raises(TooManyRequests, match="MWMS_MAX_FOLLOWS_TOTAL=3"):
        slots.acquire("cy")
    first.release()
    first.release()  # a second release frees nothing more
    assert slots.open_total == 2
    slots.acquire("cy")
    with pytest.raises(TooManyRequests):
        slots.acquire("ann")


class _Line:
    def __init__(self, id: int) -> None:
        self.id = id


def _run_follow(reads: list[tuple[list[_Line], bool]], idle_timeout_s: float) -> list[list[int]]:
    now = [0.0]

    async def read(cursor: int) -> tuple[list[_Line], bool]:
        now[0] += 1.0  # every poll takes a second of the fake clock
        return reads.pop(0) if reads else ([], False)

    async def gone() -> bool:
        return False

    async def collect() -> list[list[int]]:
        batches = follow_lines(
            read, 0, gone, idle_timeout_s=idle_timeout_s, poll_interval_s=0, clock=lambda: now[0]
        )
        return [[line.id for line in batch] async for batch in batches]

    return asyncio.run(collect())


def test_a_follow_ends_when_the_job_has_ended_and_its_last_lines_are_sent():
    reads = [([_Line(1)], False), ([], True), ([_Line(2)], True)]
    assert _run_follow(reads, idle_timeout_s=1000) == [[1], [2]]


def test_a_follow_of_a_job_that_never_ends_ends_when_idle():
    reads = [([_Line(1)], False), ([], False), ([_Line(2)], False)]
    # Lines keep it open; then nothing for the idle timeout ends it, though the job runs on.
    assert _run_follow(reads, idle_timeout_s=5) == [[1], [2]]
