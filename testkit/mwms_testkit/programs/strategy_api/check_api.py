"""Exercises every API on the MultiWorkerMirroredStrategy page inside a 2-worker job.

Each worker prints one line `RESULT <json>`; the test compares it with values computed by hand.
This program never imports mwms_runtime: a plain MWMS program must run unchanged.
"""

import json
import os

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any other TensorFlow API
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
out = {"task": task, "num_replicas": strategy.num_replicas_in_sync}


def replica_id():
    return tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)


# scope: variables created in it are mirrored
with strategy.scope():
    mirrored = tf.Variable(1.0)
out["variable_type"] = type(mirrored).__name__

# run + reduce, axis None and 0
per_replica = strategy.run(replica_id)  # replica r holds r
out["sum_none"] = float(strategy.reduce("SUM", per_replica, axis=None))
out["mean_none"] = float(strategy.reduce("MEAN", per_replica, axis=None))
vectors = strategy.run(
    lambda: replica_id() * 10 + tf.range(4, dtype=tf.float32)
)  # [10r, 10r+1, 10r+2, 10r+3]
out["sum_axis0"] = float(strategy.reduce("SUM", vectors, axis=0))
out["mean_axis0"] = float(strategy.reduce("MEAN", vectors, axis=0))
out["sum_none_vector"] = strategy.reduce("SUM", vectors, axis=None).numpy().tolist()

# a partial last batch: 6 examples split [0, 1, 2, 3] and [4, 5]; MEAN with axis=0 divides by 6
partial = strategy.experimental_distribute_values_from_function(
    lambda ctx: (
        tf.constant([0.0, 1.0, 2.0, 3.0]) if ctx.replica_id_in_sync_group == 0 else tf.constant([4.0, 5.0])
    )
)
out["partial_sum_axis0"] = float(strategy.reduce("SUM", partial, axis=0))
out["partial_mean_axis0"] = float(strategy.reduce("MEAN", partial, axis=0))

# gather along axis 0 and 1: replica r holds [[r, r + 10]]
pairs = strategy.run(lambda: tf.reshape(tf.stack([replica_id(), replica_id() + 10]), (1, 2)))
out["gather_axis0"] = strategy.gather(pairs, axis=0).numpy().tolist()
out["gather_axis1"] = strategy.gather(pairs, axis=1).numpy().tolist()

# experimental_distribute_values_from_function + experimental_local_results
values = strategy.experimental_distribute_values_from_function(
    lambda ctx: ctx.replica_id_in_sync_group + 100 * ctx.num_replicas_in_sync
)
out["local_results"] = [int(v) for v in strategy.experimental_local_results(values)]

# experimental_distribute_dataset with explicit auto-sharding by data
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = tf.data.Dataset.range(16).batch(4).with_options(options)  # global batch 4 -> 2 per replica
seen = []
for batch in strategy.experimental_distribute_dataset(dataset):
    for local in strategy.experimental_local_results(batch):
        seen.extend(int(x) for x in local.numpy())
out["distributed_dataset_seen"] = sorted(seen)

# distribute_datasets_from_function: the InputContext each worker gets
contexts = []


def dataset_fn(ctx):
    contexts.append(
        {
            "num_input_pipelines": ctx.num_input_pipelines,
            "input_pipeline_id": ctx.input_pipeline_id,
            "per_replica_batch_size": ctx.get_per_replica_batch_size(8),
        }
    )
    return tf.data.Dataset.range(100).shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(4)


first = next(iter(strategy.distribute_datasets_from_function(dataset_fn)))
out["input_context"] = contexts[0]
out["first_batch_from_function"] = [int(x) for x in strategy.experimental_local_results(first)[0].numpy()]

# training on y = 3x + 1 with 8 examples, global batch 8, zero-initialised Dense(1), SGD(0.1), 3 steps.
x = (np.arange(8, dtype=np.float32) / 8).reshape(-1, 1)
y = 3 * x + 1
GLOBAL_BATCH, STEPS, LR = 8, 3, 0.1


def shard_fn(ctx):
    per_replica = ctx.get_per_replica_batch_size(GLOBAL_BATCH)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return data.batch(per_replica, drop_remainder=True).repeat()


def make_model():
    return tf.keras.Sequential(
        [tf.keras.layers.Dense(1, input_shape=(1,), kernel_initializer="zeros", bias_initializer="zeros")]
    )


# Keras fit on a dataset from distribute_datasets_from_function (needs tf_keras: TF_USE_LEGACY_KERAS=1)
with strategy.scope():
    fit_model = make_model()
    fit_model.compile(optimizer=tf.keras.optimizers.SGD(LR), loss="mse")
history = fit_model.fit(
    strategy.distribute_datasets_from_function(shard_fn), epochs=1, steps_per_epoch=STEPS, verbose=0
)
out["fit_weights"] = [float(w.numpy().ravel()[0]) for w in fit_model.weights]
out["keras_module"] = tf.keras.__name__ if hasattr(tf.keras, "__name__") else str(tf.keras)

# the page's custom loop: tf.function, GradientTape, strategy.run, optimizer.apply_gradients
with strategy.scope():
    loop_model = make_model()
    optimizer = tf.keras.optimizers.SGD(LR)
iterator = iter(strategy.distribute_datasets_from_function(shard_fn))


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            predictions = loop_model(features, training=True)
            per_example = tf.reduce_mean(tf.square(labels - predictions), axis=-1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, loop_model.trainable_variables)
        optimizer.apply_gradients(zip(grads, loop_model.trainable_variables))
        return loss

    per_replica_loss = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce("SUM", per_replica_loss, axis=None)


out["loop_losses"] = [float(train_step(iterator)) for _ in range(STEPS)]
out["loop_weights"] = [float(w.numpy().ravel()[0]) for w in loop_model.weights]
print("RESULT " + json.dumps(out), flush=True)
