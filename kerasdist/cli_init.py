"""``kerasdist init [TEMPLATE] [DIR]``: write a starter folder (recipes and the data they read) from
the templates in ``kerasdist/templates/``, so an installed kerasdist trains with no clone and no
network. Every target is checked before the first file is written; nothing is overwritten. Exit
codes: 0 written (or ``--list``); 2 bad input (an unknown template, a DIR that is a file or not
writable, a file the template would write exists already): nothing written.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from kerasdist._log import get_logger
from kerasdist.errors import EXIT_OK, KerasdistError

TEMPLATE_ROOT = Path(__file__).parent / "templates"
IMAGES = "data/mnist_rgb32"


class InitError(KerasdistError, ValueError):
    """``kerasdist init`` was asked for an unknown template or a folder it cannot write into."""


@dataclass(frozen=True)
class Template:
    """A template: one line for ``--list``, the paths under :data:`TEMPLATE_ROOT` it copies (a
    folder: every file in it), the command to run next, and a folder it generates (or None)."""

    summary: str
    files: tuple[str, ...]
    run: str
    generates: str | None = None


TEMPLATES = {
    "mnist": Template(
        "the seed MNIST CNN, one recipe per strategy: default, mirrored, multi_worker, "
        "parameter_server",
        ("mnist_cnn.yaml", "mnist_cnn_mirrored.yaml", "mnist_cnn_mwms.yaml", "mnist_cnn_ps.yaml"),
        "kerasdist fit mnist_cnn.yaml"),
    "csv": Template(
        "a CSV table (Breast Cancer Wisconsin: 569 rows, 30 features) to a small MLP",
        ("breast_cancer_csv.yaml", "data/breast_cancer"), "kerasdist fit breast_cancer_csv.yaml"),
    "images": Template(
        "an image folder (10,000 MNIST digits as 32x32 RGB PNGs, written in ~20 s) to a small CNN",
        ("mnist_rgb_image_folder.yaml",), "kerasdist fit mnist_rgb_image_folder.yaml",
        generates=IMAGES),
    "sweep": Template(
        "a hyper-parameter sweep of the MNIST CNN, 20 trials (needs kerasdist[sweep])",
        ("mnist_cnn.yaml", "sweeps/mnist_cnn.yaml"), "kerasdist sweep sweeps/mnist_cnn.yaml"),
}


def add_parser(sub) -> None:
    """Register the ``init`` subcommand on an argparse subparsers object."""
    parser = sub.add_parser("init", help="write a starter folder (recipes and their data) from a "
                                         "template shipped with kerasdist")
    parser.add_argument("template", nargs="?", default="mnist",
                        help=f"one of {', '.join(TEMPLATES)} (default: mnist; --list describes them)")
    parser.add_argument("dir", nargs="?", default=".", help="the folder to write into (default: the "
                        "current one; created if missing); no file in it is overwritten")
    parser.add_argument("--list", action="store_true", help="name the templates and exit")


def run(args) -> int:
    """Run the ``init`` subcommand (see module docs)."""
    if args.list:
        print("\n".join(f"{name:<7} {t.summary}" for name, t in TEMPLATES.items()))
        return EXIT_OK
    folder = Path(args.dir)
    written = init(args.template, folder)
    print(f"kerasdist: wrote template '{args.template}' into {folder.absolute()}: "
          f"{', '.join(written)}")
    cd = "" if folder == Path(".") else f"cd {shlex.quote(str(folder))} && "
    print(f"next: {cd}{TEMPLATES[args.template].run}")
    return EXIT_OK


def init(name: str, folder: Path) -> list[str]:
    """Write template ``name`` into ``folder`` (created if missing), overwriting nothing.

    Args:
        name: a key of :data:`TEMPLATES`.
        folder: the folder to write into.

    Returns:
        What was written, relative to ``folder`` (a folder as ``'data/x/ (N files)'``).

    Raises:
        InitError: an unknown ``name`` (the message lists the known ones); ``folder`` or one of
            its ancestors is a file, or the nearest existing one is not writable; a path the
            template writes exists already (every one is named). Nothing is written then.
    """
    template = TEMPLATES.get(name)
    if template is None:
        raise InitError(f"unknown template '{name}'; the templates: {', '.join(TEMPLATES)} (kerasdist "
                        f"init --list describes them; a folder goes second: kerasdist init mnist "
                        f"{name}). Received: TEMPLATE={name!r}")
    copies = [(source, source.relative_to(TEMPLATE_ROOT).as_posix())
              for path in template.files for source in _files(TEMPLATE_ROOT / path)]
    generated = [template.generates] if template.generates else []
    _check_folder(folder, [rel for _, rel in copies] + generated)
    for source, rel in copies:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        with open(folder / rel, "xb") as out:  # "x": never replaces a file
            out.write(source.read_bytes())
    shown = [f"{p}/ ({len(_files(TEMPLATE_ROOT / p))} files)" if (TEMPLATE_ROOT / p).is_dir() else p
             for p in template.files]
    for path in generated:
        get_logger("init").info(f"writing {path}/ from the embedded MNIST sample (about 20 s)")
        write_mnist_rgb(folder / Path(path).parent)
        shown.append(f"{path}/ ({sum(1 for p in (folder / path).rglob('*.png'))} PNG files)")
    return shown


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def _check_folder(folder: Path, targets: list[str]) -> None:
    """Refuse a folder that is a file or not writable, and any target that exists already."""
    existing = folder.absolute()
    while not existing.exists() and not existing.is_symlink():
        existing = existing.parent
    if not existing.is_dir():
        raise InitError(f"DIR '{folder}': '{existing}' is a file, not a folder. Received: DIR='{folder}'")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InitError(f"DIR '{folder}': '{existing}' is not writable by this user. "
                        f"Received: DIR='{folder}'")
    clashes = sorted({clash for rel in targets if (clash := _in_the_way(folder, rel))})
    if clashes:
        raise InitError(f"DIR '{folder}' has {', '.join(clashes)} already: kerasdist init overwrites "
                        f"nothing and wrote nothing; move it away or choose another DIR. "
                        f"Received: DIR='{folder}'")


def _in_the_way(folder: Path, rel: str) -> str | None:
    """The first path of ``rel`` under ``folder`` that exists (or, before the last, is no folder)."""
    parts = Path(rel).parts
    for i in range(1, len(parts) + 1):
        path = folder.joinpath(*parts[:i])
        if i == len(parts) and (path.exists() or path.is_symlink()):
            return path.relative_to(folder).as_posix()
        if path.exists() and not path.is_dir():
            return path.relative_to(folder).as_posix()
    return None


def write_mnist_rgb(out: Path, size: int = 32) -> Path:
    """Write the embedded MNIST digits resized to ``size`` x ``size`` (bilinear) as RGB PNG files
    ``out/mnist_rgb<size>/{train,test}/<digit>/<index>.png`` (the layout
    ``keras.utils.image_dataset_from_directory`` reads): the first 8,000 are ``train``, the last
    2,000 ``test`` (the split of ``mnist_cnn.yaml``).

    Returns:
        The folder ``out/mnist_rgb<size>``.
    """
    from kerasdist.data.readers import embedded_dir, load_idx_split
    from kerasdist.data.writers import write_image_folder

    x, y = load_idx_split(embedded_dir(), "test")
    folder = out / f"mnist_rgb{size}"
    write_image_folder(folder, "train", x[:8000], y[:8000], size=(size, size), rgb=True)
    write_image_folder(folder, "test", x[8000:], y[8000:], size=(size, size), rgb=True)
    return folder
