"""The ``kerasdist export`` sub-command: a deployment manifest for a recipe (a Slurm batch script,
a Kubernetes JobSet, a Kubeflow Trainer v2 TrainJob, a Kubeflow TFJob: legacy).

Registered by :mod:`kerasdist.cli`; exit codes as in :mod:`kerasdist.errors`.
"""

from __future__ import annotations

from kerasdist._log import get_logger
from kerasdist.cluster.export import DEFAULT_IMAGE
from kerasdist.errors import EXIT_OK


def add_parser(sub, add_recipe_args) -> None:
    """Add the ``export`` sub-command (``export slurm``, ``export jobset``, ``export trainjob``,
    ``export tfjob``) to ``sub``."""
    export = sub.add_parser("export", help="write a deployment manifest for a recipe")
    targets = export.add_subparsers(dest="target", metavar="TARGET", required=True)
    _add_slurm(targets, add_recipe_args)
    tfjob = targets.add_parser("tfjob", help="Kubeflow TFJob (kubeflow.org/v1) manifest (legacy: "
                                             "Kubeflow is dropping TFJob; prefer jobset)")
    _add_kubernetes_args(tfjob, add_recipe_args, "TFJob")
    tfjob.add_argument("--evaluator", action="store_true",
                       help="add an Evaluator replica running the sidecar evaluator (needs --pvc)")
    jobset = targets.add_parser("jobset", help="Kubernetes JobSet (jobset.x-k8s.io/v1alpha2) "
                                               "manifest: pods derive their roles (cluster.kind "
                                               "jobset)")
    _add_kubernetes_args(jobset, add_recipe_args, "JobSet")
    _add_shared_cluster_args(jobset, "JobSet")
    trainjob = targets.add_parser("trainjob", help="Kubeflow Trainer v2 TrainJob + its "
                                                   "TrainingRuntime (trainer.kubeflow.org/"
                                                   "v1alpha1): pods derive their roles by rank "
                                                   "(cluster.kind jobset)")
    _add_kubernetes_args(trainjob, add_recipe_args, "TrainJob")
    _add_shared_cluster_args(trainjob, "TrainJob")


def _add_shared_cluster_args(parser, kind: str) -> None:
    parser.add_argument("--queue", default=None, metavar="NAME",
                        help=f"Kueue LocalQueue: the {kind}'s kueue.x-k8s.io/queue-name label")
    parser.add_argument("--no-network-policy", dest="network_policy", action="store_false",
                        help="leave out the NetworkPolicy that admits connections to the pods "
                             "only from the job's own pods")


def _add_kubernetes_args(parser, add_recipe_args, kind: str) -> None:
    add_recipe_args(parser)
    parser.add_argument("--image", default=DEFAULT_IMAGE,
                        help="container image with kerasdist, built from the repository's "
                             f"Dockerfile (default: {DEFAULT_IMAGE})")
    parser.add_argument("-o", "--output", default="-", help="output file ('-' = stdout)")
    parser.add_argument("--name", default=None, help=f"{kind} name (default: from the recipe file)")
    parser.add_argument("--namespace", default=None, help="Kubernetes namespace")
    parser.add_argument("--recipe-in-image", default=None,
                        help="recipe path inside the image (default: the path given)")
    parser.add_argument("--cpu", default="2", help="CPU per pod (Kubernetes quantity)")
    parser.add_argument("--memory", default="4Gi", help="memory per pod (Kubernetes quantity)")
    parser.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu per pod")
    parser.add_argument("--pvc", default=None,
                        help="PersistentVolumeClaim for the run directory (shared checkpoints)")


def _add_slurm(targets, add_recipe_args) -> None:
    from kerasdist.cluster.export_slurm import DEFAULT_SIGNAL_S

    slurm = targets.add_parser("slurm", help="Slurm batch script (sbatch): one srun step of all "
                                             "the recipe's tasks, --requeue, --signal")
    add_recipe_args(slurm)
    slurm.add_argument("-o", "--output", default="-", help="output file ('-' = stdout)")
    slurm.add_argument("--nodes", type=int, default=None,
                       help="nodes (default: one per task; fewer: tasks fill nodes in rank order, "
                            "the chief and the ps first)")
    slurm.add_argument("--cpus-per-task", type=int, default=None, help="CPUs per task")
    slurm.add_argument("--time", default=None, help="time limit (Slurm format, e.g. 02:00:00)")
    slurm.add_argument("--partition", default=None, help="Slurm partition")
    slurm.add_argument("--signal-s", type=int, default=DEFAULT_SIGNAL_S,
                       help="seconds before the time limit at which Slurm sends the recipe's "
                            "cluster.preemption_signal (default USR1): save and requeue "
                            f"(default {DEFAULT_SIGNAL_S}; 0: no --signal)")
    slurm.add_argument("--no-requeue", action="store_true", help="leave out --requeue")
    slurm.add_argument("--name", default=None, help="job name (default: from the recipe file)")
    slurm.add_argument("--kerasdist", default="kerasdist",
                       help="how a task runs kerasdist (default: kerasdist; e.g. "
                            "'/opt/venv/bin/python -m kerasdist')")


def _run_slurm(args, recipe) -> int:
    from kerasdist.cluster.export_slurm import SlurmOptions, sbatch_script, write_script

    text = sbatch_script(recipe, recipe_path=args.recipe, overrides=tuple(args.overrides),
                         options=SlurmOptions(
                             nodes=args.nodes, cpus_per_task=args.cpus_per_task, time=args.time,
                             partition=args.partition, signal_s=args.signal_s,
                             requeue=not args.no_requeue, name=args.name,
                             kerasdist=args.kerasdist))
    if args.output == "-":
        print(text, end="")
    else:
        write_script(args.output, text)
        get_logger().info(f"wrote {args.output} (submit it with: sbatch {args.output})")
    return EXIT_OK


TASK_KIND = {"slurm": "slurm", "jobset": "jobset", "trainjob": "jobset", "tfjob": "tf_config"}
"""The ``cluster.kind`` the exported tasks run with (each target's command sets it)."""


def load_as_tasks_will(args):
    """The recipe as the exported tasks will read it: with ``--set cluster.kind=<the target's
    kind>`` (its own cluster fields, such as Slurm's ``preemption_signal``, may then be set),
    and an import-path ``model.name`` checked for syntax only.

    Raises:
        RecipeError: the recipe, or an override, is invalid for that kind.
    """
    from kerasdist.config import load_recipe
    from kerasdist.errors import RecipeError
    from kerasdist.models import registry

    with registry.no_imports():
        try:
            return load_recipe(args.recipe, [f"cluster.kind={TASK_KIND[args.target]}",
                                             *args.overrides])
        except RecipeError:
            recipe = load_recipe(args.recipe, args.overrides)  # its own error, if any
            if recipe.strategy.traits.topology != "single":
                raise
            return recipe  # a one-process recipe: the export's own refusal names it


def run(args, recipe) -> int:
    """``kerasdist export slurm|jobset|trainjob|tfjob``: write the script or manifest of ``recipe``
    (validated, nothing imported) to ``args.output`` (atomically) or stdout."""
    if args.target == "slurm":
        return _run_slurm(args, recipe)
    from kerasdist.cluster.export import PodResources, dump_manifest, tfjob_manifest

    common = dict(recipe_path=args.recipe_in_image or args.recipe, image=args.image,
                  name=args.name, namespace=args.namespace,
                  resources=PodResources(cpu=args.cpu, memory=args.memory, gpus=args.gpus),
                  pvc=args.pvc, overrides=tuple(args.overrides))
    if args.target == "tfjob":
        manifest = tfjob_manifest(recipe, evaluator=args.evaluator, **common)
        text = dump_manifest(manifest)
    else:
        import yaml

        documents = _jobset_documents(args, recipe, common)
        manifest = documents[0] if args.target == "jobset" else documents[1]
        text = yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False)
    if args.output == "-":
        print(text, end="")
    else:
        from kerasdist._files import write_text_atomic

        write_text_atomic(args.output, text)
        get_logger().info(f"wrote {args.output} ({manifest['kind']} "
                          f"'{manifest['metadata']['name']}')")
    return EXIT_OK


def _jobset_documents(args, recipe, common: dict) -> list[dict]:
    """``export jobset``'s JobSet or ``export trainjob``'s TrainingRuntime and TrainJob, with the
    NetworkPolicy of their pods unless ``--no-network-policy``."""
    from kerasdist.cluster.export_jobset import jobset_manifest, network_policy
    from kerasdist.cluster.export_trainjob import trainjob_manifests
    from kerasdist.config.cluster_configs import as_kind

    build = jobset_manifest if args.target == "jobset" else trainjob_manifests
    built = build(recipe, queue=args.queue, **common)
    documents = [built] if isinstance(built, dict) else built
    if args.network_policy:
        documents.append(network_policy(
            name=documents[-1]["metadata"]["name"], namespace=args.namespace,
            port=as_kind(recipe.cluster, "jobset").port_base, any_port=args.gpus > 0))
    return documents

