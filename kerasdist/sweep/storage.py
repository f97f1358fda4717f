"""The sweep's study in its storage: opening it (read-only for the checks, or to run), the checks
a run makes before it writes anything (``output.dir``, the storage, the study's definition,
another live driver), the driver's mark, and :class:`TrialBook`, the trials by number.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kerasdist._log import get_logger
from kerasdist.errors import RecipeError
from kerasdist.sweep.plan import SweepPlan
from kerasdist.sweep.study import make_pruner, make_sampler, require_optuna

log = get_logger("sweep")
FINGERPRINT_ATTR = "kerasdist.sweep"
"""The study's user attribute holding what the sweep searches (a re-run must search the same)."""
DRIVER_ATTR = "kerasdist.sweep.driver"
"""The study's user attribute naming the driver running it: ``pid``, ``host``, ``dir``
(``output.dir``), ``heartbeat`` (Unix time, renewed every :data:`HEARTBEAT_S`); null once it ended."""
HEARTBEAT_S = 10.0
STALE_S = 120.0
"""A driver mark whose heartbeat is older than this is of a driver gone (on another host, where
its pid cannot be looked at)."""


def fingerprint(plan: SweepPlan) -> dict[str, Any]:
    """What a study must have been made by to be continued: the recipe's path and
    ``recipe_sha256`` (the SHA-256 of the base recipe with ``set`` applied, as canonical JSON:
    an edited value shows, an edited comment or layout does not), set, space, objective."""
    config = plan.config
    base = json.dumps(plan.base_raw, sort_keys=True, default=str).encode()
    return json.loads(json.dumps({
        "recipe": str(config.recipe), "recipe_sha256": hashlib.sha256(base).hexdigest(),
        "set": config.set,
        "space": {k: v.model_dump(mode="json") for k, v in config.space.items()},
        "objective": config.objective.model_dump(mode="json")}, default=str))


def check_folder(folder: Path, *, field: str, received: str) -> None:
    """Refuse a folder that cannot be created or written; leaves nothing behind (a probe
    folder is made and removed in its nearest existing parent).

    Raises:
        RecipeError: names ``field`` and ``received``, with the system's reason.
    """
    import os
    import tempfile

    parent = folder.absolute()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        if not parent.is_dir():
            raise NotADirectoryError(f"'{parent}' is a file")
        os.rmdir(tempfile.mkdtemp(prefix=".kerasdist-probe-", dir=parent))
    except OSError as err:
        raise RecipeError(f"{field}: cannot create or write '{folder}' "
                          f"({err.strerror or err}, in '{parent}'). Received: {received}") from None


def probe_storage(plan: SweepPlan) -> str:
    """The storage URL, its SQLite file's folder checked without writing: it exists and can be
    written (or is ``output.dir``, checked as such). Another database is checked by opening it
    (:func:`stored_study`, :func:`check_storage`).

    Raises:
        RecipeError: names ``output.storage`` and why.
    """
    url = plan.config.storage_url()
    path = Path(url[len("sqlite:///"):])
    if url.startswith("sqlite:///") and path.parent.absolute() != plan.out and not path.exists():
        if not path.parent.is_dir():
            raise RecipeError(f"output.storage: the folder '{path.parent}' of the SQLite file "
                              f"does not exist. Received: storage={url!r}")
        check_folder(path.parent, field="output.storage", received=f"storage={url!r}")
    return url


def _unopenable(url: str, err: Exception) -> RecipeError:
    return RecipeError(f"output.storage: Optuna cannot open {url!r}: {type(err).__name__}: "
                       f"{str(err).splitlines()[0][:300]}. Received: storage={url!r}")


def stored_study(plan: SweepPlan):
    """The sweep's study as the storage holds it now, or None when it holds none yet; reads the
    storage without creating or writing anything (no file, table or study is made).

    Raises:
        RecipeError: the storage cannot be opened or read (a file that is not an Optuna
            database...), naming ``output.storage``.
    """
    optuna = require_optuna()
    url = probe_storage(plan)
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        return None
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(url)
        try:
            if not sqlalchemy.inspect(engine).has_table("studies"):
                return None
        finally:
            engine.dispose()
        storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
        return optuna.load_study(study_name=plan.config.output.study, storage=storage)
    except KeyError:  # no study of that name
        return None
    except Exception as err:  # noqa: BLE001 - SQLAlchemy's and Optuna's errors, all bad input here
        raise _unopenable(url, err) from None


def check_start(plan: SweepPlan) -> None:
    """What a run of the sweep checks before it writes anything (``--dry-run`` too, which
    writes nothing): ``output.dir`` can be created, the storage can be opened, and a study it
    holds already was made by this sweep (:func:`check_definition`) and has no other live
    driver (:func:`check_no_other_driver`).

    Raises:
        RecipeError: names ``output.dir`` or ``output.storage`` and why.
    """
    check_folder(plan.out, field="output.dir", received=f"dir='{plan.config.output.dir}'")
    study = stored_study(plan)
    if study is not None:
        check_definition(plan, study)
        check_no_other_driver(plan, study)


def mark_driver(plan: SweepPlan, study) -> None:
    """Write this process's :data:`DRIVER_ATTR` mark in ``study`` with a new heartbeat."""
    import os
    import socket
    import time

    study.set_user_attr(DRIVER_ATTR, {"pid": os.getpid(), "host": socket.gethostname(),
                                      "dir": str(plan.out), "heartbeat": time.time()})


def unmark_driver(plan: SweepPlan) -> None:
    """Clear this process's mark, through a new connection (the driver's own may be broken by
    the Ctrl-C that ends it); a mark left behind is of a process gone, which does not count."""
    import os

    try:
        study = stored_study(plan)
        if study is not None and (study.user_attrs.get(DRIVER_ATTR) or {}).get("pid") == \
                os.getpid():
            study.set_user_attr(DRIVER_ATTR, None)
    except Exception as err:  # noqa: BLE001 - never hides how the driver ended
        log.warning(f"the study keeps this driver's mark ({type(err).__name__}: {err})")


def check_no_other_driver(plan: SweepPlan, study) -> None:
    """Refuse a study another live driver runs: its mark's heartbeat is younger than
    :data:`STALE_S` and, on this host, its pid lives.

    Raises:
        RecipeError: names ``output.storage``, the other driver and its ``output.dir``.
    """
    import socket
    import time

    from kerasdist.sweep.processes import pid_alive

    mark = study.user_attrs.get(DRIVER_ATTR) or {}
    age = time.time() - float(mark.get("heartbeat", 0))
    if not mark or age > STALE_S or (mark.get("host") == socket.gethostname()
                                     and not pid_alive(int(mark.get("pid", 0)))):
        return
    raise RecipeError(
        f"output.storage: another kerasdist sweep runs study '{plan.config.output.study}' (pid "
        f"{mark.get('pid')} on {mark.get('host')}, output.dir '{mark.get('dir')}', heartbeat "
        f"{age:.0f} s ago); one driver per study: wait for it to end (a driver gone without "
        f"ending counts as gone {STALE_S:g} s after its last heartbeat), or use another "
        f"output.study. Received: storage={plan.config.storage_url()!r}")


def check_definition(plan: SweepPlan, study) -> None:
    """Refuse a study made by another sweep (:func:`fingerprint`: another recipe or an edited
    one, set, space or objective); a study without the sweep's definition yet passes.

    Raises:
        RecipeError: names ``output.storage`` and what differs.
    """
    wanted = fingerprint(plan)
    found = study.user_attrs.get(FINGERPRINT_ATTR)
    if found is None or found == wanted:
        return
    differs = [key for key in wanted if wanted[key] != found.get(key)]
    edited = f": the base recipe '{plan.config.recipe}' was edited" \
        if "recipe_sha256" in differs else ""
    raise RecipeError(f"output.storage: study '{plan.config.output.study}' was made by another "
                      f"sweep ({', '.join(differs)} differ{edited}); use a new output.dir or "
                      f"output.study, or undo the change. Received: "
                      f"{', '.join(f'{k}={wanted[k]!r}' for k in differs)}")


def check_storage(plan: SweepPlan):
    """Open (and create) the sweep's storage (:func:`probe_storage` first; ``output.dir`` is
    made, where the default SQLite file lives).

    Raises:
        RecipeError: a SQLite file in a folder that does not exist, or a URL that Optuna cannot
            open; names ``output.storage``.
    """
    optuna = require_optuna()
    url = probe_storage(plan)
    plan.out.mkdir(parents=True, exist_ok=True)
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as err:  # noqa: BLE001 - SQLAlchemy's and Optuna's errors, all bad input here
        raise _unopenable(url, err) from None


def open_study(plan: SweepPlan, *, storage=None):
    """The sweep's study: created, or loaded from the storage (a re-run continues it).

    Args:
        plan: the checked sweep.
        storage: an Optuna storage already opened by :func:`check_storage` (default: opened here).

    Raises:
        RecipeError: the storage cannot be opened; the study in it was made by another sweep
            (another recipe, set, space or objective): names what differs.
    """
    optuna = require_optuna()
    config = plan.config
    storage = storage if storage is not None else check_storage(plan)
    study = optuna.create_study(storage=storage, study_name=config.output.study,
                                sampler=make_sampler(config), pruner=make_pruner(config),
                                direction=config.objective.direction, load_if_exists=True)
    before = len(study.get_trials(deepcopy=False))
    if before:  # a re-run: the sampler goes on from where the seed would repeat itself
        study.sampler = make_sampler(config, trials_before=before)
    check_definition(plan, study)
    if FINGERPRINT_ATTR not in study.user_attrs:
        study.set_user_attr(FINGERPRINT_ATTR, fingerprint(plan))
    return study


class TrialBook:
    """The sweep's study and its storage, with trials addressed by their number: a trial asked
    by an earlier driver (interrupted, resumed by this one) has no ``Trial`` object, so its
    values, attributes and prune decision go through the storage's and the pruner's public
    interfaces (``docs/sweep.md``, "Resumable"). The storage is the one the study was created
    on, so the study reads what is written here.

    Args:
        study: the sweep's Optuna study.
        storage: the Optuna storage it was created on.
    """

    def __init__(self, study, storage):
        self.study, self.storage = study, storage
        self._ids: dict[int, int] = {}

    @classmethod
    def open(cls, plan: SweepPlan) -> "TrialBook":
        """Open the storage and the study (:func:`check_storage`, :func:`open_study`).

        Raises:
            RecipeError: as :func:`open_study`.
        """
        storage = check_storage(plan)
        return cls(open_study(plan, storage=storage), storage)

    def _id(self, number: int) -> int:
        if number not in self._ids:
            study_id = self.storage.get_study_id_from_name(self.study.study_name)
            self._ids[number] = self.storage.get_trial_id_from_study_id_trial_number(
                study_id, number)
        return self._ids[number]

    def trial(self, number: int):
        """The ``FrozenTrial`` numbered ``number``, as stored now.

        Raises:
            KeyError: the study has no trial ``number``.
        """
        return self.storage.get_trial(self._id(number))

    def report(self, number: int, step: int, value: float) -> bool:
        """Record ``value`` as trial ``number``'s intermediate value at ``step`` (the 1-based
        epoch), unless that step has one already (reported before the driver was interrupted:
        it stands). Returns whether it was recorded."""
        if step in self.trial(number).intermediate_values:
            return False
        self.storage.set_trial_intermediate_value(self._id(number), step, float(value))
        return True

    def should_prune(self, number: int) -> bool:
        """The study's pruner's decision on trial ``number`` with the values it has now."""
        return bool(self.study.pruner.prune(self.study, self.trial(number)))

    def set_user_attr(self, number: int, key: str, value: Any) -> None:
        """Set a user attribute (JSON-serializable ``value``) of the running trial ``number``."""
        self.storage.set_trial_user_attr(self._id(number), key, value)
