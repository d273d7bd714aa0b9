"""Convergence plot: best-so-far against measurements, one line per curve.

Drawn on a `matplotlib.figure.Figure` of its own with an Agg canvas, never through pyplot: the caller's
matplotlib backend (a notebook's inline figures) is left as it was."""
from __future__ import annotations

import math


def convergence_figure(curves: dict[str, list[tuple[int, float]]], ylabel: str = "best GFLOP/s",
                       final: float | None = None, title: str = ""):
    """The figure convergence_png saves (a Figure: a notebook shows it as the cell's value)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for name, points in curves.items():
        if points:
            xs, ys = zip(*points)
            ax.step(xs, ys, where="post", label=name)  # best-so-far holds until the next improvement
    has_final = final is not None and math.isfinite(final) and final > 0
    if has_final:
        ax.axhline(final, linestyle="--", color="black", linewidth=1, label=f"re-measured best: {final:.4g}")
    ax.set_xlabel("measurements")
    ax.set_ylabel(ylabel)
    ax.set_title(f"Convergence: {title}" if title else "Convergence")
    ax.grid(alpha=0.3)
    if any(curves.values()) or has_final:
        ax.legend()
    fig.tight_layout()
    return fig


def convergence_png(curves: dict[str, list[tuple[int, float]]], path: str,
                    ylabel: str = "best GFLOP/s", final: float | None = None, title: str = "") -> str:
    """`final`: the run's result (its best re-measured at the end), drawn as a dashed line: the
    curve is the best *reading* while tuning, which a noisy host biases up. `title`: which run it is
    (method, workload, seed: tuning/config/naming.py figure_title), after "Convergence: "."""
    convergence_figure(curves, ylabel, final, title).savefig(path, dpi=120)
    return path
