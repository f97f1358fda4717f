"""Clusters: TF_CONFIG specs and validation, in-process clusters, the local process launcher."""
