"""Convergence plot: best-so-far against measurements, one line per curve."""
from __future__ import annotations

import math


def convergence_png(curves: dict[str, list[tuple[int, float]]], path: str,
                    ylabel: str = "best GFLOP/s", final: float | None = None, title: str = "") -> str:
    """`final`: the run's result (its best re-measured at the end), drawn as a dashed line: the
    curve is the best *reading* while tuning, which a noisy host biases up. `title`: which run it is
    (method, workload, seed: tuning/config/naming.py figure_title), after "Convergence: "."""
    import matplotlib

    matplotlib.use("Agg")  # no display on tuning machines
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in curves.items():
        if points:
            xs, ys = zip(*points)
            ax.step(xs, ys, where="post", label=name)  # best-so-far holds until the next improvement
    if final is not None and math.isfinite(final) and final > 0:
        ax.axhline(final, linestyle="--", color="black", linewidth=1, label=f"re-measured best: {final:.4g}")
    ax.set_xlabel("measurements")
    ax.set_ylabel(ylabel)
    ax.set_title(f"Convergence: {title}" if title else "Convergence")
    ax.grid(alpha=0.3)
    if any(curves.values()) or (final is not None and math.isfinite(final) and final > 0):
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
