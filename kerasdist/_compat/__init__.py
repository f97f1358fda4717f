"""Every patch of Keras/TensorFlow internals, one module per problem (a mend), each naming its
upstream issue or giving a written reproduction; ``internals`` is not a mend but the ``keras.src``
imports and private reads the rest of kerasdist needs (ruff TID251 bans them everywhere else). The
table of mends, what installs each, and the supported versions: ``docs/architecture.md``.

:func:`apply` installs the :data:`MENDS` (process-wide; each changes behaviour only under a
distribution strategy), ``kerasdist.enable()`` adds the :data:`ENABLE_MENDS`; the other modules
are used where needed. Each mend module has ``NAME``, ``ISSUE``, ``bug_present() -> bool`` (a
behavioural probe of the installed Keras/TF that runs no TensorFlow op, so it is safe before a
``MultiWorkerMirroredStrategy`` is created) and ``install``/``installed``/``uninstall`` (tests only)
from :func:`kerasdist._compat._patch.functions`. A mend is installed only where its probe shows the
bug; ``tests/unit/test_compat.py`` fails with "upstream fixed ...: remove this mend" once a release
fixes it. A mend that applies to less than :data:`kerasdist._compat.versions.SUPPORTED` states
``APPLIES_TO = {"tensorflow": spec, "keras": spec}``.

Example::

    import kerasdist
    kerasdist._compat.apply()  # on Keras 3.15 / TF 2.21: ['keras#20585', 'tensorflow#72388', ...]
"""

from __future__ import annotations

import importlib

MENDS = (
    "kerasdist._compat.keras_20585_symbolic_build",
    "kerasdist._compat.tf_72388_scalar_reduce",
    "kerasdist._compat.keras_bn_replica_stats",
    "kerasdist._compat.keras_replica_apply",
    "kerasdist._compat.keras_replica_loss",
    "kerasdist._compat.keras_20582_grad_accum",
    "kerasdist._compat.keras_sharded_variables",
    "kerasdist._compat.keras_19246_steps_per_execution",
    "kerasdist._compat.keras_metric_states",
    "kerasdist._compat.keras_replica_add_loss",
)
"""The process-wide mends, installed by :func:`apply` where their probe shows the bug."""

ENABLE_MENDS = (
    "kerasdist._compat.keras_chief_saves",
    "kerasdist._compat.keras_chief_callbacks",
    "kerasdist._compat.keras_chief_logs",
    "kerasdist._compat.tf_coordinator_copies",
)
"""The mends installed by ``kerasdist.enable()`` only (same interface as :data:`MENDS`)."""

# Probes of the internals that are used without a process-wide patch: module -> probe function
# (True while the installed Keras/TF still work as the code behind the probe expects).
OTHER_PROBES = (
    ("kerasdist._compat.keras_ps_dispatch", "bug_present"),
    ("kerasdist._compat.keras_ps_atomic_assign", "bug_present"),
    ("kerasdist._compat.keras_allreduce_hook", "hook_present"),
    ("kerasdist._compat.keras_accumulation_step", "matches_keras"),
    ("kerasdist._compat.keras_23360_exhausted_warning", "bug_present"),
)

ACTIVE, NEEDED, NOT_NEEDED, NOT_APPLICABLE = "active", "needed", "not needed", "not applicable"
UNKNOWN_VERSION = "unknown version"
_LOGGED: set = set()


def _probe(module) -> tuple[str, str]:
    """``(state, detail)`` of one mend module: ACTIVE, NEEDED, NOT_NEEDED or NOT_APPLICABLE (its
    probe could not reach its target: a symbol this Keras/TF does not have; detail says which)."""
    try:
        if module.installed():
            return ACTIVE, ""
        present = module.bug_present()
    except (ImportError, AttributeError, KeyError, OSError, TypeError) as err:
        return NOT_APPLICABLE, f"{type(err).__name__}: {err}"
    return (NEEDED, "") if present else (NOT_NEEDED, "upstream fixed")


def _log_skip(module, state: str, detail: str) -> None:
    """One log line per mend and process for a mend that :func:`apply` leaves out."""
    if (module.NAME, state) in _LOGGED:
        return
    _LOGGED.add((module.NAME, state))
    from kerasdist._compat import versions
    from kerasdist._log import get_logger

    found = versions.installed()
    needed = ", ".join(f"{key}{value}" for key, value in
                       getattr(module, "APPLIES_TO", versions.SUPPORTED).items())
    why = "its probe finds the bug fixed upstream" if state == NOT_NEEDED else \
        f"its target is missing ({detail})"
    get_logger("compat").info(f"mend {module.NAME} skipped on keras {found['keras']} / tensorflow "
                              f"{found['tensorflow']}: {state}, {why} (known needed on {needed})")


def apply() -> list[str]:
    """Install every mend whose bug the installed Keras/TF have. Idempotent; runs no TF op. A mend
    left out (fixed upstream, or its target missing) gets one INFO line on the ``kerasdist.compat``
    logger, an untested TensorFlow or Keras version one WARNING line.

    Returns:
        The names (``'keras#20585'``, ...) of the mends in effect after the call, in a fixed order;
        calling again returns the same list and patches nothing twice.
    """
    from kerasdist._compat import versions
    from kerasdist._log import get_logger

    versions.warn_if_untested(get_logger("compat"))
    applied = []
    for module_name in MENDS:
        module = importlib.import_module(module_name)
        state, detail = _probe(module)
        if state in (ACTIVE, NEEDED) and module.install():
            applied.append(module.NAME)
        elif state in (NOT_NEEDED, NOT_APPLICABLE):
            _log_skip(module, state, detail)
    return applied


def status() -> dict[str, str]:
    """``{name: state}`` for every mend of :data:`MENDS` and :data:`ENABLE_MENDS` (``kerasdist
    env``; runs no TF op): ``'active'`` (installed here), ``'needed'`` (the probe shows the bug),
    ``'not needed'`` (fixed upstream) or ``'not applicable'`` (the probe's target is missing),
    prefixed ``'unknown version: '`` outside :data:`kerasdist._compat.versions.SUPPORTED`."""
    from kerasdist._compat import versions

    prefix = f"{UNKNOWN_VERSION}: " if versions.untested() else ""
    result = {}
    for module_name in MENDS + ENABLE_MENDS:
        module = importlib.import_module(module_name)
        state, _ = _probe(module)
        result[module.NAME] = prefix + state
    return result


def probes() -> dict[str, bool | str]:
    """Every probe's answer on the installed Keras/TF (the canary's raw data, ``tools/canary.py``):
    ``{"<mend name>.bug_present": bool, ...}`` for :data:`MENDS` and :data:`ENABLE_MENDS` (read on
    the unmodified upstream code: call before :func:`apply`), then :data:`OTHER_PROBES`; a probe
    that raised gives ``"error: <type>"``."""
    result: dict[str, bool | str] = {}
    entries = [(name, "bug_present") for name in MENDS + ENABLE_MENDS] + list(OTHER_PROBES)
    for module_name, function in entries:
        module = importlib.import_module(module_name)
        key = f"{module.NAME}.{function}"
        try:
            result[key] = bool(getattr(module, function)())
        except Exception as err:  # noqa: BLE001 - a probe that cannot run is itself the finding
            result[key] = f"error: {type(err).__name__}"
    return result


def targets() -> list[tuple[str, str, object, str]]:
    """Every symbol a mend patches: ``(mend name, "module.Class.attribute", owner, attribute)``
    for :data:`MENDS`, :data:`ENABLE_MENDS` and the parameter-server dispatch, whether installed or
    not (imports Keras/TF; runs no TF op). ``tests/unit/test_compat.py`` probes each one."""
    from kerasdist._compat import _patch, keras_ps_dispatch

    found = []
    for module_name in MENDS + ENABLE_MENDS:
        module = importlib.import_module(module_name)
        found += [(module.NAME, _patch._name(p.owner, p.attribute), p.owner, p.attribute)
                  for p in module._patches()]
    trainer = keras_ps_dispatch._trainer_class()
    found += [(keras_ps_dispatch.NAME, _patch._name(trainer, name), trainer, name)
              for name in ("fit", "evaluate", "predict")]
    return found


__all__ = ["ENABLE_MENDS", "MENDS", "OTHER_PROBES", "apply", "probes", "status", "targets"]
