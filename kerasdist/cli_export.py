"""The ``kerasdist export`` sub-command: a deployment manifest for a recipe (Kubeflow TFJob).

Registered by :mod:`kerasdist.cli`; exit codes as in :mod:`kerasdist.errors`.
"""

from __future__ import annotations

from kerasdist._log import get_logger
from kerasdist.cluster.export import DEFAULT_IMAGE
from kerasdist.errors import EXIT_OK


def add_parser(sub, add_recipe_args) -> None:
    """Add the ``export`` sub-command (``export tfjob``) to ``sub``."""
    export = sub.add_parser("export", help="write a deployment manifest for a recipe")
    targets = export.add_subparsers(dest="target", metavar="TARGET", required=True)
    tfjob = targets.add_parser("tfjob", help="Kubeflow TFJob (kubeflow.org/v1) manifest")
    add_recipe_args(tfjob)
    tfjob.add_argument("--image", default=DEFAULT_IMAGE,
                       help="container image with kerasdist, built from the repository's "
                            f"Dockerfile (default: {DEFAULT_IMAGE})")
    tfjob.add_argument("-o", "--output", default="-", help="output file ('-' = stdout)")
    tfjob.add_argument("--name", default=None, help="TFJob name (default: from the recipe file)")
    tfjob.add_argument("--namespace", default=None, help="Kubernetes namespace")
    tfjob.add_argument("--recipe-in-image", default=None,
                       help="recipe path inside the image (default: the path given)")
    tfjob.add_argument("--cpu", default="2", help="CPU per pod (Kubernetes quantity)")
    tfjob.add_argument("--memory", default="4Gi", help="memory per pod (Kubernetes quantity)")
    tfjob.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu per pod")
    tfjob.add_argument("--pvc", default=None,
                       help="PersistentVolumeClaim for the run directory (shared checkpoints)")
    tfjob.add_argument("--evaluator", action="store_true",
                       help="add an Evaluator replica running the sidecar evaluator (needs --pvc)")


def run(args, recipe) -> int:
    """``kerasdist export tfjob``: write the manifest of ``recipe`` (validated, nothing imported)
    to ``args.output`` (atomically) or stdout."""
    from kerasdist.cluster.export import PodResources, dump_manifest, tfjob_manifest

    manifest = tfjob_manifest(recipe, recipe_path=args.recipe_in_image or args.recipe,
                              image=args.image, name=args.name, namespace=args.namespace,
                              resources=PodResources(cpu=args.cpu, memory=args.memory,
                                                     gpus=args.gpus),
                              pvc=args.pvc, overrides=tuple(args.overrides),
                              evaluator=args.evaluator)
    text = dump_manifest(manifest)
    if args.output == "-":
        print(text, end="")
    else:
        from kerasdist.training.outputs import write_text_atomic

        write_text_atomic(args.output, text)
        get_logger().info(f"wrote {args.output} (TFJob '{manifest['metadata']['name']}')")
    return EXIT_OK
