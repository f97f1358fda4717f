"""Bench output: a Markdown table and PNG plots (matplotlib, Agg backend) from bench.json data."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _fmt(value, spec=".1f", suffix="") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def markdown_table(result: dict[str, Any]) -> str:
    """One row per strategy/baseline: examples/s (median [min–max]), time to target, accuracy,
    peak RSS of all tasks, staleness, and ratios to every baseline; then the worker sweep, the
    coordinator-scaling points and the targets' verdicts where the result has them."""
    text = _rows_table(result) if result.get("rows") else ""
    return text + scaling_table(result) + targets_table(result)


def scaling_table(result: dict[str, Any]) -> str:
    """The coordinator-scaling points (steps/s median [min–max]) and where each saturates."""
    scaling = result.get("coordinator_scaling")
    if not scaling:
        return ""
    settings = scaling["settings"]
    text = (f"\nCoordinator scaling ({settings['model']}; {settings['cluster']}; "
            f"{settings['steps_per_epoch']} steps/epoch, {settings['timing']}, "
            f"{settings['repeats']} repeat(s)):\n\n"
            "| implementation | workers | steps/s median [min–max] | steps per call | "
            "peak RSS (MiB) |\n| --- | --- | --- | --- | --- |\n")
    for p in sorted(scaling["points"], key=lambda p: (p["impl"], p["workers"])):
        failed = "" if p["succeeded"] == p["runs"] else f" ({p['runs'] - p['succeeded']} failed)"
        text += (f"| {p['impl']}{failed} | {p['workers']} | {_fmt(p['steps_per_sec'])} "
                 f"[{_fmt(p['steps_per_sec_min'])}–{_fmt(p['steps_per_sec_max'])}] | "
                 f"{p['steps_per_execution'] or '–'} | {_fmt(p['peak_rss_mb'], '.0f')} |\n")
    for impl, s in scaling.get("saturation", {}).items():
        at = (f"saturates at {s['saturates_at']} worker(s)" if s["saturates_at"]
              else "not saturated in the range")
        text += (f"\n{impl}: {at}; peak {_fmt(s['peak_steps_per_sec'])} steps/s at "
                 f"{s['peak_workers']} worker(s).")
    return text + "\n"


def targets_table(result: dict[str, Any]) -> str:
    """MET / MISSED / n/a for each speed target (:mod:`kerasdist.bench.targets`)."""
    if not result.get("targets"):
        return ""
    lines = ["", "Targets (medians of this run):", "", "| target | verdict | measured |",
             "| --- | --- | --- |"]
    lines += [f"| {t['target']} | {t['verdict']} | {t['detail'] or '–'} |"
              for t in result["targets"]]
    return "\n".join(lines) + "\n"


def _rows_table(result: dict[str, Any]) -> str:
    settings = result["settings"]
    head = (f"Target held-out accuracy {settings['target_accuracy']}, global batch "
            f"{settings['global_batch_size']}, {settings['workers']} workers for cluster "
            f"strategies, {settings['repeats']} repeat(s); "
            f"{result['environment']['cpu_count']} CPU cores shared by all tasks.\n\n")
    lines = ["| row | kind | examples/s median [min–max] | time to target (s) | final acc. | "
             "peak RSS all tasks (MiB) | staleness mean/max | ratios |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, row in result["rows"].items():
        s = row["summary"]
        rate = (f"{_fmt(s['examples_per_sec_median'])} [{_fmt(s['examples_per_sec_min'])}–"
                f"{_fmt(s['examples_per_sec_max'])}]")
        stale = s.get("staleness") or {}
        stale_text = (f"{_fmt(stale.get('mean'), '.2f')}/{_fmt(stale.get('max'), '.0f')}"
                      if stale else "–")
        basis = s.get("ratio_basis") or {}
        ratios = ", ".join(f"{_fmt(v, '.2f')}x {k}" + (f" ({basis[k]})" if k in basis else "")
                           for k, v in (s.get("ratio_examples_per_sec") or {}).items())
        if s.get("examples_per_sec_epoch_level_median") and row["kind"] == "strategy":
            rate += f"; whole epochs: {_fmt(s['examples_per_sec_epoch_level_median'])}"
        if s.get("ratio_time_to_target_vs_plain_keras"):
            ratios += f"; time-to-target {s['ratio_time_to_target_vs_plain_keras']:.2f}x plain_keras"
        failed = "" if s["succeeded"] == s["runs"] else f" ({s['runs'] - s['succeeded']} failed)"
        lines.append(f"| {name}{failed} | {row['kind']} | {rate} | "
                     f"{_fmt(s['time_to_target_s_median'])} ({s['reached_target']}) | "
                     f"{_fmt(s['final_accuracy_median'], '.4f')} | "
                     f"{_fmt(s['peak_rss_mb_median'], '.0f')} | {stale_text} | {ratios or '–'} |")
    text = head + "\n".join(lines) + "\n"
    if result.get("sweep"):
        text += ("\nWorker sweep (all tasks share this machine's "
                 f"{result['environment']['cpu_count']} CPU cores, so more workers add "
                 "coordination, not compute; run the rows' recipes with TF_CONFIG on a real "
                 "cluster for the real curve):\n\n"
                 "| strategy | workers | examples/s median [min–max] | time to target (s) | "
                 "final acc. | peak RSS all tasks (MiB) |\n"
                 "| --- | --- | --- | --- | --- | --- |\n")
        for p in result["sweep"]:
            failed = "" if p["succeeded"] == p["runs"] else f" ({p['runs'] - p['succeeded']} failed)"
            text += (f"| {p['strategy']}{failed} | {p['workers']} | {_fmt(p['examples_per_sec'])} "
                     f"[{_fmt(p['examples_per_sec_min'])}–{_fmt(p['examples_per_sec_max'])}] | "
                     f"{_fmt(p['time_to_target_s'])} ({p['reached_target']}) | "
                     f"{_fmt(p['final_accuracy'], '.4f')} | {_fmt(p['peak_rss_mb'], '.0f')} |\n")
    return text


def _first_ok(row):
    for run in row["runs"]:
        if run["returncode"] == 0 and run["figures"]:
            return run["figures"]
    return None


def _pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """Lay out ``fig``, write it to ``path`` (PNG, 110 dpi) and close it; returns ``path``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_curves(result: dict[str, Any], path: Path) -> Path:
    """Held-out accuracy and loss against wall time since the start of training, one line per row."""
    plt = _pyplot()
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, (name, row) in enumerate(result["rows"].items()):
        figures = _first_ok(row)
        if not figures:
            continue
        color = f"C{index % 10}"  # one colour per row in both panels
        ends = figures.get("throughput", {}).get("epoch_end_s", [])
        acc = figures.get("val_accuracy", [])[: len(ends)]
        if acc:
            acc_ax.plot(ends[: len(acc)], acc, marker="o", label=name, color=color)
        loss = (figures.get("val_loss") or [])[: len(ends)]
        if loss:
            loss_ax.plot(ends[: len(loss)], loss, marker="o", label=name, color=color)
    acc_ax.axhline(result["settings"]["target_accuracy"], color="grey", linestyle="--",
                   linewidth=0.8)
    acc_ax.set(xlabel="wall time since start of training (s)", ylabel="held-out accuracy",
               title="Held-out accuracy")
    loss_ax.set(xlabel="wall time since start of training (s)", ylabel="held-out loss",
                title="Held-out loss")
    acc_ax.legend(fontsize=8)
    if loss_ax.lines:
        loss_ax.legend(fontsize=8)
    return _save(fig, path)


def plot_throughput(result: dict[str, Any], path: Path) -> Path:
    """Bar chart of median examples/s (min–max as error bars); baselines hatched."""
    plt = _pyplot()
    names, values, low, high, hatches = [], [], [], [], []
    for name, row in result["rows"].items():
        s = row["summary"]
        if s["examples_per_sec_median"] is None:
            continue
        names.append(name)
        values.append(s["examples_per_sec_median"])
        low.append(s["examples_per_sec_median"] - s["examples_per_sec_min"])
        high.append(s["examples_per_sec_max"] - s["examples_per_sec_median"])
        hatches.append("//" if row["kind"] == "baseline" else "")
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names)), 4))
    bars = ax.bar(names, values, yerr=[low, high], capsize=4, color="#4c72b0")
    for bar, hatch in zip(bars, hatches, strict=True):
        bar.set_hatch(hatch)
    ax.set(ylabel="examples/s (timed steps)", title="Training throughput (hatched: baselines)")
    ax.tick_params(axis="x", rotation=30)
    return _save(fig, path)


def plot_sweep(result: dict[str, Any], path: Path) -> Path | None:
    """examples/s and time to target against the number of workers."""
    if not result.get("sweep"):
        return None
    plt = _pyplot()
    def value(v):
        return float("nan") if v is None else v

    fig, (rate_ax, tta_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for strategy in sorted({p["strategy"] for p in result["sweep"]}):
        points = [p for p in result["sweep"] if p["strategy"] == strategy]
        counts = [p["workers"] for p in points]
        rates = [value(p["examples_per_sec"]) for p in points]
        spread = [[r - value(p["examples_per_sec_min"]) for r, p in zip(rates, points, strict=True)],
                  [value(p["examples_per_sec_max"]) - r for r, p in zip(rates, points, strict=True)]]
        rate_ax.errorbar(counts, rates, yerr=spread, marker="o", capsize=3, label=strategy)
        tta_ax.plot(counts, [value(p["time_to_target_s"]) for p in points], marker="o",
                    label=strategy)
    plain = result["rows"].get("plain_keras", {}).get("summary", {})
    if plain.get("examples_per_sec_median"):
        rate_ax.axhline(plain["examples_per_sec_median"], color="grey", linestyle="--",
                        linewidth=0.8, label="plain Keras, 1 process")
    if plain.get("time_to_target_s_median"):
        tta_ax.axhline(plain["time_to_target_s_median"], color="grey", linestyle="--",
                       linewidth=0.8, label="plain Keras, 1 process")
    cores = result["environment"]["cpu_count"]
    rate_ax.set(xlabel="workers", ylabel="examples/s (timed steps)",
                title=f"Throughput vs workers (all on {cores} shared cores)")
    tta_ax.set(xlabel="workers", ylabel="seconds",
               title=f"Time to {result['settings']['target_accuracy']} held-out accuracy")
    for ax in (rate_ax, tta_ax):
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_scaling(result: dict[str, Any], path: Path) -> Path | None:
    """Coordinator steps/s against workers (log2 axis), one line per implementation, min–max
    as error bars, the saturation point marked."""
    scaling = result.get("coordinator_scaling")
    if not scaling or not scaling.get("points"):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for index, impl in enumerate(sorted({p["impl"] for p in scaling["points"]})):
        points = sorted((p for p in scaling["points"] if p["impl"] == impl and p["steps_per_sec"]),
                        key=lambda p: p["workers"])
        if not points:
            continue
        rates = [p["steps_per_sec"] for p in points]
        spread = [[r - p["steps_per_sec_min"] for r, p in zip(rates, points, strict=True)],
                  [p["steps_per_sec_max"] - r for r, p in zip(rates, points, strict=True)]]
        ax.errorbar([p["workers"] for p in points], rates, yerr=spread, marker="o", capsize=3,
                    label=impl, color=f"C{index}")
        at = scaling.get("saturation", {}).get(impl, {}).get("saturates_at")
        if at:
            ax.axvline(at, color=f"C{index}", linestyle=":", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="workers (in-process, one machine)", ylabel="steps/s (whole epochs 2..n)",
           title="Parameter-server coordinator: steps/s sustained (dotted: saturation)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def write_all(result: dict[str, Any], out: Path) -> dict[str, str]:
    """Write bench.md and the PNG plots into ``out``; return their paths."""
    paths: dict[str, Path] = {"table": out / "bench.md"}
    paths["table"].write_text(markdown_table(result), encoding="utf-8")
    if result.get("rows"):
        paths["curves"] = plot_curves(result, out / "curves.png")
        paths["throughput"] = plot_throughput(result, out / "throughput.png")
    for key, plot in (("sweep", plot_sweep), ("coordinator_scaling", plot_scaling)):
        written = plot(result, out / f"{key}.png")
        if written:
            paths[key] = written
    return {k: str(v) for k, v in paths.items()}
