"""TF 1.x distributed-training tutorials reproduced in tf.compat.v1 graph mode.

Modules: sync_replicas (seed 001), async_cnn (seeds 000 + 003), towers (seed 004)
and runner (starts a whole local cluster of processes). See legacy/README.md.
"""
