"""mwms: a control plane for tf.distribute.MultiWorkerMirroredStrategy.

This package holds the command-line interface, the generated protocol modules (mwms.v1) and the
small pieces both the coordinator and the agent share.
"""

__version__ = "0.1.0"
