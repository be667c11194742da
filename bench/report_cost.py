"""What mwms_runtime.report() adds to a training step: a real 2-worker MultiWorkerMirroredStrategy job on loopback.

Both workers run the same small custom training step (the custom-loop example's MLP) in interleaved
blocks, so every variant sees the same machine load; the chief times each block. Variants:

- ``in_graph_reduce``: the step reduces its loss with ``strategy.reduce("SUM", loss, axis=None)`` (the
  per-replica loss already scaled by ``compute_average_loss``: one all-reduce of one number) inside the
  tf.function and reports nothing: the baseline of issue 10's target, the cheapest in-graph reduce.
- ``no_metrics``: the same step reducing nothing (only its gradients' all-reduce): recorded, to show
  what reporting adds at all.
- ``in_graph_reduce_axis0``: the same with ``strategy.reduce("MEAN", per_example, axis=0)``, which the
  API page recommends for per-example values (recorded).
- ``report_per_replica``: the step returns per-replica losses and ``report(step, {"loss": ...})`` reduces
  them: report() keeps them and reduces a batch of calls in one collective (up to 64 calls).
- ``report_per_replica_wait``: the same with ``wait=True``, one collective per call (report() before
  batching, and what a program pays that reads report()'s result every step): recorded.
- ``reduce_metrics_report``: the step reduces its metrics with ``mwms_runtime.reduce_metrics`` and
  ``report(step, reduced)`` hands them to the chief's writer: no second collective.
- ``fit_plain`` / ``fit_callback`` / ``fit_callback_collective``: ``model.fit`` without a callback, with
  ``MetricsCallback(every_n_batches=1)``, and with the callback as it was before (its logs through
  report()'s collective).

Prints each figure beside the target (at most 1.05x the baseline), writes bench/results_report.json and
exits 1 when a target is missed. Usage: python bench/report_cost.py [--steps 64] [--rounds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results_report.json"
TARGET_RATIO = 1.05
# variant -> the variant it is compared with; the ratio must be <= TARGET_RATIO where a target is set.
BASELINES = {
    "in_graph_reduce_axis0": ("in_graph_reduce", None),
    "report_per_replica": ("in_graph_reduce", TARGET_RATIO),
    "report_per_replica_wait": ("in_graph_reduce", None),
    "reduce_metrics_report": ("in_graph_reduce", TARGET_RATIO),
    "fit_callback_collective": ("fit_plain", None),
    "fit_callback": ("fit_plain", TARGET_RATIO),
}
# variant -> the reference it is also shown against (recorded, no target).
ALSO_VERSUS = {
    "in_graph_reduce": "no_metrics",
    "report_per_replica": "no_metrics",
    "reduce_metrics_report": "no_metrics",
}
STEP_VARIANTS = (
    "in_graph_reduce",
    "no_metrics",
    "in_graph_reduce_axis0",
    "report_per_replica",
    "report_per_replica_wait",
    "reduce_metrics_report",
)
FIT_VARIANTS = ("fit_plain", "fit_callback", "fit_callback_collective")


def worker(steps: int, rounds: int) -> None:
    """One task of the job: time every variant in interleaved blocks and print RESULT lines (chief)."""
    import numpy as np

    import mwms_runtime

    strategy = mwms_runtime.strategy()
    import tensorflow as tf

    from mwms_runtime import keras_callback, reporting

    ctx = mwms_runtime.context()
    tf.random.set_seed(11)
    global_batch = 16 * strategy.num_replicas_in_sync

    def make_model():
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(16, activation="relu", input_shape=(2,)), tf.keras.layers.Dense(2)]
        )
        return model

    with strategy.scope():
        model = make_model()
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(global_batch)
        rng = np.random.default_rng(11 + input_context.input_pipeline_id)
        labels = rng.integers(0, 2, size=1024)
        points = (np.where(labels[:, None] == 1, 1.5, -1.5) + rng.normal(size=(1024, 2))).astype(np.float32)
        dataset = tf.data.Dataset.from_tensor_slices((points, labels))
        return dataset.shuffle(1024, seed=11).repeat().batch(batch, drop_remainder=True)

    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    iterator = iter(dataset)

    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            per_example = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return per_example, loss

    @tf.function
    def step_in_graph_reduce(iterator):
        _, loss = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce("SUM", loss, axis=None)

    @tf.function
    def step_no_metrics(iterator):
        strategy.run(step_fn, args=(next(iterator),))

    @tf.function
    def step_in_graph_reduce_axis0(iterator):
        per_example, _ = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce("MEAN", per_example, axis=0)

    @tf.function
    def step_per_replica(iterator):
        return strategy.run(step_fn, args=(next(iterator),))[0]

    @tf.function
    def step_reduce_metrics(iterator):
        per_example, _ = strategy.run(step_fn, args=(next(iterator),))
        return mwms_runtime.reduce_metrics(strategy, {"loss": per_example})

    counter = [0]  # the report step, the same on every worker

    def run_in_graph_reduce():
        step_in_graph_reduce(iterator)

    def run_no_metrics():
        step_no_metrics(iterator)

    def run_in_graph_reduce_axis0():
        step_in_graph_reduce_axis0(iterator)

    def run_report_per_replica():
        counter[0] += 1
        mwms_runtime.report(counter[0], {"loss": step_per_replica(iterator)})

    def run_report_per_replica_wait():
        counter[0] += 1
        mwms_runtime.report(counter[0], {"loss": step_per_replica(iterator)}, wait=True)

    def run_reduce_metrics_report():
        counter[0] += 1
        mwms_runtime.report(counter[0], step_reduce_metrics(iterator))

    # Each report() variant keeps its own batch, so one variant's pending calls are never reduced (and
    # paid for) in another's block. With blocks of 64 steps and batches of at most 64 calls, every block
    # of the batched variant holds exactly one of its collectives once the batch size has grown to 64.
    batches = {name: reporting._Batch() for name in ("report_per_replica", "report_per_replica_wait")}
    default_batch = reporting._batch
    runners = {
        "in_graph_reduce": run_in_graph_reduce,
        "no_metrics": run_no_metrics,
        "in_graph_reduce_axis0": run_in_graph_reduce_axis0,
        "report_per_replica": run_report_per_replica,
        "report_per_replica_wait": run_report_per_replica_wait,
        "reduce_metrics_report": run_reduce_metrics_report,
    }
    per_step: dict[str, list[float]] = {name: [] for name in (*STEP_VARIANTS, *FIT_VARIANTS)}
    for name, run in runners.items():  # trace and warm up (the batch grows to its full size)
        reporting._batch = batches.get(name, default_batch)
        for _ in range(200 if name in batches else 20):
            run()
    for round_index in range(rounds):
        shift = round_index % len(STEP_VARIANTS)
        order = list(STEP_VARIANTS[shift:] + STEP_VARIANTS[:shift])
        for name in order:
            run = runners[name]
            reporting._batch = batches.get(name, default_batch)
            started = time.perf_counter()
            for _ in range(steps):
                run()
            per_step[name].append((time.perf_counter() - started) / steps)
    batch_sizes = {name: batch.limit for name, batch in batches.items()}
    for batch in batches.values():
        reporting._batch = batch
        mwms_runtime.flush(timeout=60)
    reporting._batch = default_batch

    with strategy.scope():
        fitted = make_model()
        fitted.compile(
            optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    reduced_report = keras_callback.report

    def collective_report(step, metrics, reduced=False):
        return reporting.report(step, metrics, wait=True)  # the callback before: a collective per call

    class BatchClock(tf.keras.callbacks.Callback):
        """Times fit's batches from the first batch's end to the last's, leaving fit's set-up out."""

        def on_train_begin(self, logs=None):
            self.ends: list[float] = []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

    def run_fit(name: str, fit_steps: int) -> float:
        clock = BatchClock()
        callbacks: list = [clock]
        if name != "fit_plain":
            metrics = mwms_runtime.MetricsCallback(every_n_batches=1, global_batch_size=global_batch)
            callbacks.insert(0, metrics)  # before the clock, so its work is inside the timed batch
        keras_callback.report = collective_report if name == "fit_callback_collective" else reduced_report
        try:
            fitted.fit(dataset, epochs=1, steps_per_epoch=fit_steps, callbacks=callbacks, verbose=0)
        finally:
            keras_callback.report = reduced_report
        return (clock.ends[-1] - clock.ends[0]) / (len(clock.ends) - 1)

    for name in FIT_VARIANTS:  # trace and warm up
        run_fit(name, 20)
    for round_index in range(rounds):
        order = list(FIT_VARIANTS[round_index % 3 :] + FIT_VARIANTS[: round_index % 3])
        for name in order:
            per_step[name].append(run_fit(name, steps + 1))

    mwms_runtime.flush(timeout=60)
    if ctx.is_chief:
        print("RESULT " + json.dumps({"per_step": per_step, "batch_calls": batch_sizes}), flush=True)


def summarize(per_step: dict[str, list[float]]) -> dict:
    """Median ms per step per variant, and per variant the median over rounds of its ratio to its baseline.

    Blocks of a round run back to back, so a round's ratio compares variants under the same load; the
    median over rounds leaves out rounds disturbed by other processes.
    """
    median_ms = {name: statistics.median(times) * 1000 for name, times in per_step.items()}
    ratios, met = {}, {}
    for name, (baseline, target) in BASELINES.items():
        paired = [t / b for t, b in zip(per_step[name], per_step[baseline], strict=True)]
        ratios[name] = statistics.median(paired)
        if target is not None:
            met[name] = ratios[name] <= target
    also = {
        name: statistics.median(t / b for t, b in zip(per_step[name], per_step[ref], strict=True))
        for name, ref in ALSO_VERSUS.items()
    }
    return {
        "step_ms_median": median_ms,
        "ratio_to_no_metrics": also,
        "step_ms_per_round": {name: [t * 1000 for t in times] for name, times in per_step.items()},
        "ratio_to_baseline": ratios,
        "baseline_of": {name: baseline for name, (baseline, _) in BASELINES.items()},
        "target_ratio": TARGET_RATIO,
        "targets_met": met,
    }


def main() -> None:
    """Run the 2-worker job, print each figure beside its target, write the results file."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=64, help="steps per timed block (64: one batch of report() calls)"
    )
    parser.add_argument(
        "--rounds", type=int, default=60, help="rounds of one timed block per variant (medians taken)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.rounds)
        return

    from mwms_testkit.runtime_cluster import run_tasks

    with tempfile.TemporaryDirectory(prefix="mwms-report-cost-") as tmp:
        root = Path(tmp)
        argv = [
            str(Path(__file__).resolve()),
            "--worker",
            "--steps",
            str(args.steps),
            "--rounds",
            str(args.rounds),
        ]
        results = run_tasks(argv, cwd=root / "cwd", root=root, num_workers=2, timeout=1200)
        for result in results:
            if result.returncode != 0:
                sys.exit(f"a worker failed:\n{result.describe()}")
        lines = [line for line in results[0].stdout.splitlines() if line.startswith("RESULT ")]
        measured = json.loads(lines[-1][len("RESULT ") :])
        summary = summarize(measured["per_step"])
        summary["report_batch_calls_at_end"] = measured["batch_calls"]
    summary.update(
        steps_per_block=args.steps,
        rounds=args.rounds,
        workers=2,
        machine={"cpus": os.cpu_count(), "platform": platform.platform()},
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")

    print(f"{'variant':<26} {'ms/step':>8} {'ratio':>7}  vs {'baseline':<16} target")
    for name, ms in summary["step_ms_median"].items():
        if name in BASELINES:
            baseline, target = BASELINES[name]
            ratio = summary["ratio_to_baseline"][name]
            verdict = (
                "recorded" if target is None else f"<= {target}x {'ok' if ratio <= target else 'MISSED'}"
            )
            also = summary["ratio_to_no_metrics"].get(name)
            extra = f"  ({also:.3f}x vs no_metrics)" if also is not None else ""
            print(f"{name:<26} {ms:8.3f} {ratio:6.3f}x  vs {baseline:<16} {verdict}{extra}")
        else:
            also = summary["ratio_to_no_metrics"].get(name)
            extra = f"  ({also:.3f}x vs no_metrics)" if also is not None else ""
            print(f"{name:<26} {ms:8.3f} {'':>7}     (baseline){extra}")
    print(f"results in {RESULTS.relative_to(ROOT)}")
    if not all(summary["targets_met"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
