"""Checks of the values ``kerasdist export`` writes into a batch script or a manifest: a value
Slurm or Kubernetes would refuse later, or one that could end a line of the script (a newline
in ``--name`` would start a shell line), is refused here with a :class:`RecipeError` naming the
option (exit code 2), before anything is written.

Sources: Kubernetes object names (DNS-1123 labels and subdomains) and resource quantities,
https://kubernetes.io/docs/concepts/overview/working-with-objects/names/ and
https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/; a label value
is at most 63 characters (``LabelValueMaxLength`` in ``k8s.io/apimachinery/pkg/util/validation``)
and Kueue refuses a ``kueue.x-k8s.io/queue-name`` that is not a DNS-1123 subdomain
(``ValidateQueueName`` in kubernetes-sigs/kueue ``pkg/controller/jobframework/validation.go``); Slurm's
``--time`` formats, https://slurm.schedmd.com/sbatch.html#OPT_time.
"""

from __future__ import annotations

import re

from kerasdist.errors import RecipeError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = re.compile(rf"^{_LABEL}$")
DNS_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
SLURM_TIME = re.compile(r"^(\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|UNLIMITED|INFINITE)$", re.IGNORECASE)


def _refuse(what: str, option: str, rule: str, value) -> None:
    raise RecipeError(f"{what}: {option} {rule}. Received: {option.lstrip('-')}={value!r}")


def one_line(what: str, option: str, value: str, *, spaces: bool = True) -> None:
    """Refuse a value with a control character (a newline ends a script line), or with
    whitespace unless ``spaces``."""
    if _CONTROL.search(value) or (not spaces and re.search(r"\s", value)):
        _refuse(what, option, "must be one line of printable characters"
                + ("" if spaces else " without spaces"), value)


def dns_name(what: str, option: str, value: str, *, subdomain: bool = False,
             most: int | None = None) -> None:
    """Refuse a name Kubernetes refuses: a DNS-1123 label (lower-case letters, digits, '-', at
    most 63 characters) or, with ``subdomain``, labels joined by '.' (at most 253, or ``most``:
    63 for a subdomain that is also a label value)."""
    pattern, longest = (DNS_SUBDOMAIN, 253) if subdomain else (DNS_LABEL, 63)
    most = most or longest
    if not pattern.match(value) or len(value) > most:
        _refuse(what, option, f"must be a DNS-1123 {'subdomain' if subdomain else 'label'} "
                f"(lower-case letters, digits, '-'{', ' + repr('.') if subdomain else ''}; "
                f"starting and ending with a letter or digit; at most {most} characters)", value)


def quantity(what: str, option: str, value: str) -> None:
    """Refuse what is not a positive Kubernetes quantity (``2``, ``500m``, ``4Gi``, ``1.5``)."""
    if not QUANTITY.match(value) or not re.search(r"[1-9]", value.split("e")[0].split("E")[0]):
        _refuse(what, option, "must be a positive Kubernetes quantity such as 2, 500m or 4Gi",
                value)


def export_kubernetes(what: str, *, name: str, namespace: str | None, image: str,
                      pvc: str | None, resources, recipe_path: str, queue: str | None = None) -> None:
    """Every option of a Kubernetes export (``jobset``, ``trainjob``, ``tfjob``); ``queue`` is
    the Kueue LocalQueue (``--queue``): a DNS-1123 subdomain that fits a label value.

    Raises:
        RecipeError: the first bad option, named, with the value received.
    """
    dns_name(what, "--name", name)
    if namespace is not None:
        dns_name(what, "--namespace", namespace)
    if pvc is not None:
        dns_name(what, "--pvc", pvc, subdomain=True)
    if queue is not None:
        dns_name(what, "--queue", queue, subdomain=True, most=63)
    if not image:
        _refuse(what, "--image", "must name a container image", image)
    one_line(what, "--image", image, spaces=False)
    one_line(what, "the recipe path", recipe_path)
    quantity(what, "--cpu", resources.cpu)
    quantity(what, "--memory", resources.memory)
    if resources.gpus < 0:
        _refuse(what, "--gpus", "must be >= 0", resources.gpus)


def export_slurm(*, name: str, options, recipe_path: str) -> None:
    """Every option of ``export slurm`` that reaches a ``#SBATCH`` line or a comment.

    Raises:
        RecipeError: the first bad option, named, with the value received.
    """
    what = "export slurm"
    one_line(what, "the recipe path", recipe_path)
    one_line(what, "--name", name, spaces=False)
    one_line(what, "--kerasdist", options.kerasdist)
    if options.partition is not None:
        one_line(what, "--partition", options.partition, spaces=False)
    if options.time is not None and not SLURM_TIME.match(options.time):
        _refuse(what, "--time", "must be a Slurm time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                "D-HH:MM:SS or UNLIMITED", options.time)
    if options.cpus_per_task is not None and options.cpus_per_task < 1:
        _refuse(what, "--cpus-per-task", "must be >= 1", options.cpus_per_task)
