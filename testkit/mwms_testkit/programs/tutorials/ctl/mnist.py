# From TensorFlow's tutorial "Custom training loop with Keras and MultiWorkerMirroredStrategy",
# https://www.tensorflow.org/tutorials/distribute/multi_worker_with_ctl (its `%%writefile mnist.py`).
# Copyright 2019 The TensorFlow Authors. Licensed under the Apache License, Version 2.0.
#
# Changed for mwms's test suite: `tf.keras.datasets.mnist.load_data()` (a download) is replaced by seeded
# random arrays of the same shapes and dtypes (60000 uint8 images of 28x28, int labels 0-9). Nothing else.

import os
import tensorflow as tf
import numpy as np

def mnist_dataset(batch_size):
  rng = np.random.default_rng(0)  # mwms: instead of tf.keras.datasets.mnist.load_data()
  (x_train, y_train) = (rng.integers(0, 256, (60000, 28, 28), dtype=np.uint8),
                        rng.integers(0, 10, (60000,), dtype=np.uint8))
  # The `x` arrays are in uint8 and have values in the range [0, 255].
  # You need to convert them to float32 with values in the range [0, 1]
  x_train = x_train / np.float32(255)
  y_train = y_train.astype(np.int64)
  train_dataset = tf.data.Dataset.from_tensor_slices(
      (x_train, y_train)).shuffle(60000)
  return train_dataset

def dataset_fn(global_batch_size, input_context):
  batch_size = input_context.get_per_replica_batch_size(global_batch_size)
  dataset = mnist_dataset(batch_size)
  dataset = dataset.shard(input_context.num_input_pipelines,
                          input_context.input_pipeline_id)
  dataset = dataset.batch(batch_size)
  return dataset

def build_cnn_model():
  regularizer = tf.keras.regularizers.L2(1e-5)
  return tf.keras.Sequential([
      tf.keras.Input(shape=(28, 28)),
      tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
      tf.keras.layers.Conv2D(32, 3,
                             activation='relu',
                             kernel_regularizer=regularizer),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(128,
                            activation='relu',
                            kernel_regularizer=regularizer),
      tf.keras.layers.Dense(10, kernel_regularizer=regularizer)
  ])
