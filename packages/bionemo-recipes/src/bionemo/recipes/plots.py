"""The loss / perplexity curve PNG written next to the training logs."""

import csv
from pathlib import Path

__all__ = ["plot_curves", "read_curves"]

_CURVES = ("reduced_train_loss", "val_ppl")


def read_curves(metrics_csv: Path, keys: tuple[str, ...] = _CURVES) -> dict[str, list[tuple[int, float]]]:
    """``(step, value)`` of each of ``keys`` in Lightning's CSV log, in logged order.

    ``keys`` default to ``reduced_train_loss`` and ``val_ppl``.
    """
    points: dict[str, list[tuple[int, float]]] = {key: [] for key in keys}
    if metrics_csv.is_file():
        with metrics_csv.open(newline="") as f:
            for row in csv.DictReader(f):
                for key in keys:
                    if row.get("step") and row.get(key):
                        points[key].append((int(float(row["step"])), float(row[key])))
    return points


def plot_curves(
    metrics_csv: Path,
    png: Path,
    *,
    val_key: str = "val_ppl",
    loss_label: str = "masked-token cross-entropy",
    val_label: str = "perplexity",
    val_title: str = "Validation perplexity",
) -> Path | None:
    """Plot training loss and a validation metric per step from Lightning's CSV log; ``None`` if no data.

    ``val_key`` is the metric (default the perplexity), the labels and title name the axes.
    """
    curves = read_curves(metrics_csv, ("reduced_train_loss", val_key))
    train, val = curves["reduced_train_loss"], curves[val_key]
    if not train and not val:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_ppl) = plt.subplots(1, 2, figsize=(10, 4))
    if train:
        ax_loss.plot(*zip(*train, strict=True), label="train loss")
    ax_loss.set(xlabel="step", ylabel=loss_label, title="Training loss")
    if val:
        ax_ppl.plot(*zip(*val, strict=True), marker="o", color="tab:orange", label=val_key)
    ax_ppl.set(xlabel="step", ylabel=val_label, title=val_title)
    for ax in (ax_loss, ax_ppl):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
