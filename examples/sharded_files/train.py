"""File-based input under MultiWorkerMirroredStrategy: experimental_distribute_dataset with explicit sharding.

Writes a few small CSV text files (deterministic content: ``id,x,y`` with y = 3x + 1) into the temporary
directory (``TMPDIR``: under mwms a per-task one, since a task's working directory, its bundle, is
read-only; ``/tmp`` when run by hand; ``--data-dir`` picks another), reads them with ``TextLineDataset``
and picks the auto-shard policy explicitly: FILE when there is at least one file per worker (each worker
reads its own files), DATA otherwise (every worker reads everything and keeps its share of the elements).
Fits y = w*x + b and prints which example ids this worker saw.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import tensorflow as tf

import mwms_runtime  # selects tf_keras for tf.keras (read when tf.keras is first used)

LINES_PER_FILE = 8


def write_files(directory: str, num_files: int) -> list[str]:
    """Write ``num_files`` CSV files of ``id,x,y`` lines and return their paths (same on every worker)."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for file_index in range(num_files):
        path = os.path.join(directory, f"part-{file_index:03d}.csv")
        lines = []
        for line in range(LINES_PER_FILE):
            example_id = file_index * 100 + line
            x = (example_id % 17) / 17.0 - 0.5
            lines.append(f"{example_id},{x:.6f},{3.0 * x + 1.0:.6f}\n")
        # Written whole and renamed: workers sharing a directory never read a half-written file.
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w") as handle:
            handle.writelines(lines)
        os.replace(partial, path)
        paths.append(path)
    return paths


def main() -> None:
    """Write the files, distribute them with an explicit shard policy, train a line fit, report the loss."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-files", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch-size", type=int, default=8)
    parser.add_argument(
        "--data-dir",
        default=os.path.join(tempfile.gettempdir(), "sharded_files"),
        help="where the CSV files are written (default: sharded_files in TMPDIR, else /tmp)",
    )
    args = parser.parse_args()

    strategy = mwms_runtime.strategy()  # before any other TensorFlow API
    ctx = mwms_runtime.context()
    files = write_files(args.data_dir, args.num_files)
    if len(files) >= ctx.num_workers:
        policy = tf.data.experimental.AutoShardPolicy.FILE
    else:
        policy = tf.data.experimental.AutoShardPolicy.DATA
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy

    def parse(line: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        example_id, x, y = tf.io.decode_csv(line, record_defaults=[0, 0.0, 0.0])
        return example_id, x, y

    dataset = (
        tf.data.TextLineDataset(files)
        .map(parse)
        .repeat()
        .batch(args.global_batch_size, drop_remainder=True)
        .with_options(options)
    )
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    with strategy.scope():
        weight = tf.Variable(0.0)
        bias = tf.Variable(0.0)
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.5)

    @tf.function
    def train_step(batch):
        def step_fn(example_ids, x, y):
            with tf.GradientTape() as tape:
                per_example = tf.square(weight * x + bias - y)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.global_batch_size)
            grads = tape.gradient(loss, [weight, bias])
            optimizer.apply_gradients(zip(grads, [weight, bias], strict=True))
            return example_ids, per_example

        return strategy.run(step_fn, args=batch)

    seen: set[int] = set()
    loss = float("nan")
    for step in range(1, args.steps + 1):
        example_ids, per_example = train_step(next(iterator))
        for ids in strategy.experimental_local_results(example_ids):
            seen.update(int(i) for i in ids.numpy())
        loss = mwms_runtime.report(step, {"loss": per_example})["loss"]

    ids = sorted(seen)
    files_seen = sorted({i // 100 for i in ids})
    print(f"policy={policy.name} files={len(files)} workers={ctx.num_workers}")
    print(f"SAW worker={ctx.task_index} files={files_seen} ids={ids}")
    print(f"weight={float(weight.numpy()):.3f} bias={float(bias.numpy()):.3f} (true 3.000, 1.000)")
    mwms_runtime.flush()
    print(f"FINAL loss={loss:.4f} steps={args.steps}")


if __name__ == "__main__":
    main()
