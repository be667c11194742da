"""Conversions between protobuf messages and domain objects, in one place."""

from __future__ import annotations

from mwms.preflight_contract import ALLREDUCE_ENV, parse_report
from mwms.v1 import agent_pb2 as pb
from server.db.models import Job, Task
from server.services.agents import Registration
from server.services.device_telemetry import IncomingSample
from server.services.jobs import job_env
from server.services.preflight import IncomingPreflight
from server.services.stacks import IncomingStackDump
from server.services.tasks import TaskReport
from server.services.telemetry import IncomingLine, IncomingPoint, StoreOutcome
from server.states import TaskState

# A preflight report longer than this is stored as {} (the agent sends at most 64 KiB).
MAX_REPORT_CHARS = 64 * 1024
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
                "memory_mib": d.memory_mib,
            }
            for d in request.devices
        ],
        version=request.version,
        task_isolation=request.task_isolation,
    )


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
        message=report.message,
        pid=report.pid or None,
    )


def log_lines(batch: pb.LogBatch) -> list[IncomingLine]:
    return [IncomingLine(seq=x.seq, stream=x.stream, text=x.text, unix_ms=x.unix_ms) for x in batch.lines]


def metric_points(batch: pb.MetricBatch) -> list[IncomingPoint]:
    return [
        IncomingPoint(seq=p.seq, name=p.name, step=p.step, value=p.value, unix_ms=p.unix_ms)
        for p in batch.points
    ]


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


def start_task(
    task: Task,
    job: Job,
    stop_grace_s: int,
    shared_checkpoint_dir: str,
    preflight_timeout_s: int | None = None,
    preflight_allreduce: bool = True,
) -> pb.CoordinatorMessage:
    """The StartTask; `preflight_timeout_s` (not None) asks for the gang's preflight check first, without
    its all-reduce phase when not `preflight_allreduce` (unless the job's env asks for it)."""
    env = job_env(job)
    if preflight_timeout_s is not None and not preflight_allreduce:
        env.setdefault(ALLREDUCE_ENV, "0")
    return pb.CoordinatorMessage(
        start=pb.StartTask(
            task_id=task.id,
            job_id=job.id,
            attempt=task.attempt_number,
            task_index=task.index,
            num_workers=job.num_workers,
            bundle_digest=job.bundle_digest,
            command=list(job.command),
            env=env,
            tf_config=task.tf_config,
            port=task.port,
            device_indices=list(task.device_indices),
            device_kind=pb.DEVICE_KIND_GPU if task.device_kind == "gpu" else pb.DEVICE_KIND_CPU_SLOT,
            stop_grace_seconds=stop_grace_s,
            restore_checkpoint=task.attempt_number > 1,
            shared_checkpoint_dir=shared_checkpoint_dir,
            preflight=preflight_timeout_s is not None,
            preflight_timeout_seconds=preflight_timeout_s or 0,
        )
    )


def preflight_result(result: pb.PreflightResult) -> IncomingPreflight:
    return IncomingPreflight(
        task_id=result.task_id,
        ok=result.ok,
        message=result.message,
        report=parse_report(result.report_json[:MAX_REPORT_CHARS]),
    )


def stop_task(task: Task, grace_s: int) -> pb.CoordinatorMessage:
    return pb.CoordinatorMessage(
        stop=pb.StopTask(task_id=task.id, reason=task.stop_reason or "stopped", grace_seconds=grace_s)
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


def stack_dump(message: pb.StackDump) -> IncomingStackDump:
    return IncomingStackDump(
        request_id=message.request_id,
        task_id=message.task_id,
        pid=message.pid,
        method=message.method,
        text=message.text,
        error=message.error,
    )
