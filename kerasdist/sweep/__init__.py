"""``kerasdist sweep``: hyper-parameter search on Optuna where every trial is a whole kerasdist
run (any strategy, any local cluster), resumable, pruned at epoch ends and tracked.

Modules: :mod:`.config` (``sweep.yaml``'s schema), :mod:`.plan` (loading and the checks before
any trial), :mod:`.study` (Optuna: sampler, pruner, the trials' recipes), :mod:`.storage` (the
study in its storage, the checks before a run writes anything, the driver's mark),
:mod:`.driver` (the loop), :mod:`.backends` (where a trial runs), :mod:`.gate` (the epoch-end
prune gate inside a trial), :mod:`.outputs` (trials.csv, best.yaml, plots, the status table),
:mod:`.tracking` (MLflow parent and child runs), :mod:`.hparams` (TensorBoard's
HParams view), :mod:`.command` (the CLI). docs/sweep.md.
"""
