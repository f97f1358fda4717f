"""Every export refuses, with exit 2 naming the option and writing nothing, a value that could
end a line of its script (a shell line, an ``#SBATCH`` line) or that Slurm or Kubernetes would
refuse later (issue 52 N1, N13)."""

from __future__ import annotations

import pytest

from kerasdist.cli import main
from kerasdist.errors import EXIT_BAD_INPUT

PS = "recipes/mnist_cnn_ps.yaml"


@pytest.mark.parametrize("args,option", [
    (["--name", "j\ntouch PWNED\n#SBATCH --uid=0"], "--name"),
    (["--partition", "p\ntouch PWNED"], "--partition"),
    (["--time", "1:00\ntouch PWNED"], "--time"),
    (["--time", "abc"], "--time"),
    (["--cpus-per-task", "0"], "--cpus-per-task"),
    (["--cpus-per-task", "-2"], "--cpus-per-task"),
    (["--name", "two words"], "--name"),
])
def test_export_slurm_refuses_what_could_break_a_line_or_slurm_refuses(tmp_path, capsys, args,
                                                                      option):
    out = tmp_path / "job.sh"
    assert main(["export", "slurm", PS, "-o", str(out), *args]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"export slurm: {option} must" in err and "Received:" in err
    assert not out.exists() and not (tmp_path / "PWNED").exists()


def test_a_recipe_path_with_a_newline_cannot_leave_the_comment_line(tmp_path, capsys):
    recipe = tmp_path / "r\ntouch PWNED.yaml"
    recipe.write_text(open(PS).read())
    out = tmp_path / "job.sh"
    assert main(["export", "slurm", str(recipe), "-o", str(out)]) == EXIT_BAD_INPUT
    assert "the recipe path must be one line" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("target", ["jobset", "trainjob", "tfjob"])
@pytest.mark.parametrize("args,option", [
    (["--name", "my_job"], "--name"), (["--name", "My.Job"], "--name"),
    (["--name", "a:b"], "--name"), (["--name", "j\nx"], "--name"),
    (["--namespace", "Bad_NS"], "--namespace"), (["--image", "kd :1"], "--image"),
    (["--cpu", "lots"], "--cpu"), (["--memory", "8 GB"], "--memory"), (["--cpu", "0"], "--cpu"),
    (["--gpus", "-1"], "--gpus"), (["--pvc", "My PVC"], "--pvc"),
])
def test_kubernetes_exports_refuse_names_and_quantities_kubernetes_refuses(tmp_path, capsys,
                                                                          target, args, option):
    out = tmp_path / "m.yaml"
    assert main(["export", target, PS, "-o", str(out), *args]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"export {target}: {option} must" in err and "Received:" in err
    assert not out.exists()


@pytest.mark.parametrize("target", ["jobset", "trainjob", "tfjob"])
def test_good_names_and_quantities_still_export(tmp_path, target):
    out = tmp_path / "m.yaml"
    assert main(["export", target, PS, "-o", str(out), "--name", "ps-run-2", "--namespace", "ml",
                 "--cpu", "500m", "--memory", "1.5Gi", "--gpus", "1", "--pvc", "runs.v1"]) == 0
    assert "ps-run-2" in out.read_text()
    slurm = tmp_path / "job.sh"
    assert main(["export", "slurm", PS, "-o", str(slurm), "--time", "1-02:00:00",
                 "--partition", "gpu", "--cpus-per-task", "2"]) == 0
