"""Submit examples/keras_fit from Python, follow it, print its metrics and download what it saved.

The same calls work in a notebook cell or a pipeline step. Point it at a coordinator the way the CLI is
pointed: `mwms login` (or MWMS_API and MWMS_TOKEN), or --api / --token-file here. For example, after
`mwms quickstart --keep-running`:

    python examples/notebook_submit.py --api http://127.0.0.1:PORT --token-file mwms-quickstart/admin-token
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from mwms import Client, Job, JobFailed, Metrics

KERAS_FIT = Path(__file__).resolve().parent / "keras_fit"


class ProgressPrinter:
    """A `Job.wait` callback that prints a line whenever the job's state, step or loss changes."""

    def __init__(self) -> None:
        self._last = ""

    def __call__(self, job: Job) -> None:
        line = f"{job.state:<10} step {'-' if job.step is None else job.step:>4}  loss {_number(job.loss)}"
        if line != self._last:
            print(line, flush=True)
            self._last = line


def metrics_table(metrics: Metrics) -> str:
    """One row per step, one column per metric (the newest attempt's value), as plain text.

    With pandas installed: metrics.to_pandas().pivot_table(index="step", columns="name", values="value").
    """
    names = metrics.names()
    by_step: dict[int, dict[str, float]] = {}
    for point in sorted(metrics, key=lambda point: (point.step, point.attempt)):
        by_step.setdefault(point.step, {})[point.name] = point.value
    rows = [["step", *names]]
    rows += [
        [str(step), *(_number(values.get(name)) for name in names)]
        for step, values in sorted(by_step.items())
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows
    )


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return str(value) if math.isnan(value) or math.isinf(value) else f"{value:.4f}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--api", help="the coordinator's address (default: MWMS_API, else `mwms login`'s)")
    parser.add_argument(
        "--token-file", type=Path, help="a file holding the API token (default: MWMS_TOKEN, ...)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=10)
    parser.add_argument("--output", type=Path, default=Path("notebook-artifacts"), help="where artifacts go")
    args = parser.parse_args()
    token = args.token_file.read_text().strip() if args.token_file else None

    with Client(api=args.api, token=token) as client:
        command = [
            "python",
            "train.py",
            "--epochs",
            str(args.epochs),
            "--steps-per-epoch",
            str(args.steps_per_epoch),
        ]
        job = client.submit(KERAS_FIT, command, workers=args.workers, name="notebook-keras-fit")
        print(f"submitted job {job.id} to {client.api}")
        try:
            job.wait(on_progress=ProgressPrinter())
        except JobFailed as failure:
            print(failure)  # the reason and the failing task's last log lines
            return 1
        print(f"job {job.id} ended {job.state}\n")
        print(metrics_table(job.metrics()))
        files = job.download(args.output / job.id)
        print(f"\ndownloaded {len(files)} artifacts to {args.output / job.id}:")
        for path in files:
            print(f"  {path}")
    return 0 if job.state == "SUCCEEDED" else 1


if __name__ == "__main__":
    raise SystemExit(main())
