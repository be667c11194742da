"""Conversions between protobuf messages and domain objects, in one place."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

from mwms.agent_defaults import MAX_WARM_POOL
from mwms.preflight_contract import parse_report
from mwms.server.db.models import Task
from mwms.server.services.fleet.agent_uploads import StoredUpload, UploadChunk
from mwms.server.services.fleet.agents import Registration
from mwms.server.services.job_life.start_commands import StartSpec
from mwms.server.services.job_life.tasks import TaskReport
from mwms.server.services.observing.device_telemetry import IncomingSample
from mwms.server.services.observing.preflight import IncomingPreflight
from mwms.server.services.observing.stacks import IncomingStackDump
from mwms.server.services.observing.telemetry import IncomingLine, IncomingPoint, StoreOutcome
from mwms.server.states import TaskState
from mwms.v1 import agent_pb2 as pb

# A preflight report longer than this is stored as {} (the agent sends at most 64 KiB).
MAX_REPORT_CHARS = 64 * 1024
_FILE_KINDS = {pb.FILE_KIND_ARTIFACTS: "artifacts", pb.FILE_KIND_CHECKPOINT: "checkpoint"}
_DEVICE_KINDS = {pb.DEVICE_KIND_GPU: "gpu", pb.DEVICE_KIND_CPU_SLOT: "cpu"}
_TASK_STATES = {
    pb.TASK_STATE_STARTING: TaskState.STARTING,
    pb.TASK_STATE_RUNNING: TaskState.RUNNING,
    pb.TASK_STATE_SUCCEEDED: TaskState.SUCCEEDED,
    pb.TASK_STATE_FAILED: TaskState.FAILED,
    pb.TASK_STATE_STOPPED: TaskState.STOPPED,
    pb.TASK_STATE_REJECTED: TaskState.REJECTED,
}


def registration(request: pb.RegisterRequest) -> Registration:
    return Registration(
        name=request.name,
        hostname=request.hostname,
        advertise_address=request.advertise_address,
        port_low=request.port_range_low,
        port_high=request.port_range_high,
        devices=[
            {
                "kind": _DEVICE_KINDS.get(d.kind, "cpu"),
                "index": d.index,
                "name": d.name,
                "uuid": d.uuid,
                "node": d.node,  # its device file, e.g. /dev/nvidia3; "" from an agent older than the field
                "memory_mib": d.memory_mib,
            }
            for d in request.devices
        ],
        version=request.version,
        task_isolation=request.task_isolation,
        memory_bytes=max(0, request.memory_bytes),  # a negative says nothing: unknown
        warm_pool_size=min(max(0, request.warm_pool_size), MAX_WARM_POOL),
    )


MAX_DIGEST_CHARS = 64
MAX_PLATFORM_CHARS = 100
# What a task's report says (an exit, a refusal, an environment's build error): kept with the task and quoted
# in its job's reason, which every jobs list carries.
MAX_TASK_MESSAGE_CHARS = 4000
_START_KINDS = {pb.START_KIND_WARM: "warm", pb.START_KIND_COLD: "cold"}
_ENVIRONMENT_STATUS = {pb.ENVIRONMENT_STATUS_BUILDING: "building", pb.ENVIRONMENT_STATUS_READY: "ready"}


def _build_seconds(report: pb.TaskReport) -> float | None:
    # An agent's number, bounded: NaN, infinities and negatives say nothing.
    seconds = report.environment_build_seconds
    return min(seconds, 1e7) if math.isfinite(seconds) and seconds >= 0 else None


def task_report(report: pb.TaskReport) -> TaskReport | None:
    """The domain report, or None for a state this coordinator does not know."""
    state = _TASK_STATES.get(report.state)
    if state is None:
        return None
    terminal = state.terminal
    return TaskReport(
        task_id=report.task_id,
        state=state,
        exit_code=report.exit_code if terminal else None,
        message=report.message[:MAX_TASK_MESSAGE_CHARS],
        pid=report.pid or None,
        environment=_ENVIRONMENT_STATUS.get(report.environment, ""),
        environment_build_s=_build_seconds(report)
        if report.environment == pb.ENVIRONMENT_STATUS_READY
        else None,
        environment_digest=report.environment_digest[:MAX_DIGEST_CHARS],
        environment_platform=report.environment_platform[:MAX_PLATFORM_CHARS],
        # An agent's numbers: a negative says nothing (unknown, none).
        peak_memory_bytes=max(0, report.peak_memory_bytes),
        memory_limit_bytes=max(0, report.memory_limit_bytes),
        start_kind=_START_KINDS.get(report.start_kind, ""),
    )


def log_lines(batch: pb.LogBatch) -> list[IncomingLine]:
    # Positional: the ingest process converts 100,000 a second (IncomingLine's field order).
    return [IncomingLine(x.seq, x.stream, x.text, x.unix_ms, x.replaces_seq) for x in batch.lines]


def metric_points(batch: pb.MetricBatch) -> list[IncomingPoint]:
    return [IncomingPoint(p.seq, p.name, p.step, p.value, p.unix_ms) for p in batch.points]


def telemetry_items(kind: str, payload: bytes) -> list[IncomingLine] | list[IncomingPoint]:
    """The lines ("logs": a serialized LogBatch) or points ("metrics": a MetricBatch) of a batch an agent
    stream handed to the telemetry writer as bytes (server/live/ingest_store.py); DecodeError when damaged."""
    if kind == "logs":
        return log_lines(pb.LogBatch.FromString(payload))
    if kind == "metrics":
        return metric_points(pb.MetricBatch.FromString(payload))
    raise ValueError(f"no telemetry kind {kind!r}")


def device_samples(telemetry: pb.DeviceTelemetry) -> list[IncomingSample]:
    return [
        IncomingSample(
            index=d.index,
            utilization_pct=d.utilization_pct,
            memory_used_mib=d.memory_used_mib,
            memory_total_mib=d.memory_total_mib,
            temperature_c=d.temperature_c,
        )
        for d in telemetry.devices
    ]


def start_task(spec: StartSpec) -> pb.CoordinatorMessage:
    """The StartTask of a start command the service built."""
    return pb.CoordinatorMessage(
        start=pb.StartTask(
            task_id=spec.task_id,
            job_id=spec.job_id,
            attempt=spec.attempt,
            task_index=spec.task_index,
            num_workers=spec.num_workers,
            bundle_digest=spec.bundle_digest,
            command=spec.command,
            env=spec.env,
            tf_config=spec.tf_config,
            port=spec.port,
            device_indices=spec.device_indices,
            device_kind=pb.DEVICE_KIND_GPU if spec.device_kind == "gpu" else pb.DEVICE_KIND_CPU_SLOT,
            stop_grace_seconds=spec.stop_grace_s,
            restore_checkpoint=spec.restore_checkpoint,
            shared_checkpoint_dir=spec.shared_checkpoint_dir,
            preflight=spec.preflight_timeout_s is not None,
            preflight_timeout_seconds=spec.preflight_timeout_s or 0,
            environment_lock=spec.environment_lock,
            environment_python=spec.environment_python,
            environment_isolated=spec.environment_isolated,
            memory_limit_bytes=spec.memory_limit_bytes,
            cpus=spec.cpus,
            guarded_ports=[pb.PortSpan(low=low, high=high) for low, high in spec.guarded_ports],
        )
    )


async def upload_chunks(chunks: AsyncIterator[pb.FileChunk]) -> AsyncIterator[UploadChunk]:
    """An upload's FileChunks as plain chunks, converted as they arrive."""
    async for chunk in chunks:
        yield UploadChunk(
            task_id=chunk.task_id, kind=_FILE_KINDS.get(chunk.kind, str(chunk.kind)), data=chunk.data
        )


def upload_response(stored: StoredUpload) -> pb.UploadFilesResponse:
    return pb.UploadFilesResponse(size=stored.size, sha256=stored.sha256)


def preflight_result(result: pb.PreflightResult) -> IncomingPreflight:
    return IncomingPreflight(
        task_id=result.task_id,
        ok=result.ok,
        message=result.message,
        report=parse_report(result.report_json[:MAX_REPORT_CHARS]),
    )


def stop_task(task: Task, grace_s: int) -> pb.CoordinatorMessage:
    """The stop of `task`: its own grace when its stop has one (a preemption's), else `grace_s`.

    The agent reads 0 as "its default", so a grace of 0 goes out as 1 s."""
    grace = task.stop_grace_s if task.stop_grace_s is not None else grace_s
    return pb.CoordinatorMessage(
        stop=pb.StopTask(task_id=task.id, reason=task.stop_reason or "stopped", grace_seconds=max(1, grace))
    )


def stop_unknown(task_id: str, grace_s: int) -> pb.CoordinatorMessage:
    return pb.CoordinatorMessage(
        stop=pb.StopTask(task_id=task_id, reason="the coordinator has no such task", grace_seconds=grace_s)
    )


def ack(
    task_id: str,
    *,
    log_seq: int = 0,
    metric_seq: int = 0,
    final_state: bool = False,
    stored: StoreOutcome | None = None,
) -> pb.CoordinatorMessage:
    """An acknowledgement; `stored` (the outcome of storing a batch) adds what was refused and why."""
    return pb.CoordinatorMessage(
        ack=pb.Ack(
            task_id=task_id,
            log_seq=log_seq,
            metric_seq=metric_seq,
            final_state=final_state,
            rejected=stored.rejected if stored else 0,
            reject_reason=stored.reason[:500] if stored else "",
        )
    )


def dump_stacks(request_id: str, task_ids: list[str]) -> pb.CoordinatorMessage:
    """The request for the stacks of `task_ids` (one StackDump answers it)."""
    return pb.CoordinatorMessage(dump_stacks=pb.DumpStacks(request_id=request_id, task_ids=task_ids))


def stack_dump(message: pb.StackDump) -> IncomingStackDump:
    return IncomingStackDump(
        request_id=message.request_id,
        task_id=message.task_id,
        pid=message.pid,
        method=message.method,
        text=message.text,
        error=message.error,
    )
