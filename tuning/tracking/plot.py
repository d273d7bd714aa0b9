"""The run's figures: the convergence plot (best-so-far against measurements, one line per curve) and a
whole model's network time figure (its latency estimate against wall seconds, each kernel's share of the
latency beside its share of the tuning time).

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


def network_time_figure(curve: list[tuple[float, float]], kernels: list[tuple[str, float | None, float | None]],
                        final: float | None = None, title: str = ""):
    """The figure network_time_png saves: on the left the model's latency estimate (ms) against wall
    seconds, on the right each kernel's share of that latency beside its share of the tuning time."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, max(4.5, 0.3 * len(kernels) + 1.8)))
    FigureCanvasAgg(fig)
    curve_axes, share_axes = fig.subplots(1, 2, gridspec_kw={"width_ratios": (3, 2)})
    _estimate_over_time(curve_axes, curve, final)
    _shares(share_axes, kernels)
    fig.suptitle(f"Where the time goes: {title}" if title else "Where the time goes")
    fig.tight_layout()
    return fig


def _estimate_over_time(ax, curve: list[tuple[float, float]], final: float | None) -> None:
    if curve:
        xs, ys = zip(*curve)
        ax.step(xs, ys, where="post", marker=".", label="sum of calls x best reading so far")
    else:
        ax.text(0.5, 0.5, "no estimate: a kernel never had a valid reading", ha="center", transform=ax.transAxes)
    if final is not None and math.isfinite(final) and final > 0:
        ax.axhline(final, linestyle="--", color="black", linewidth=1, label=f"final estimate (chosen bests): {final:.4g} ms")
    ax.set_xlabel("wall seconds since tuning began")
    ax.set_ylabel("model latency estimate (ms)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def _shares(ax, kernels: list[tuple[str, float | None, float | None]]) -> None:
    rows = range(len(kernels))
    latency = [100 * (share or 0.0) for _, share, _ in kernels]
    tuning = [100 * (share or 0.0) for _, _, share in kernels]
    ax.barh([y - 0.2 for y in rows], latency, height=0.4, label="share of the model's latency")
    ax.barh([y + 0.2 for y in rows], tuning, height=0.4, label="share of the tuning time")
    ax.set_yticks(list(rows), [name if len(name) <= 32 else name[:31] + "…" for name, _, _ in kernels], fontsize=8)
    ax.invert_yaxis()  # the kernel the model pays most for at the top
    ax.set_xlabel("%")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8)


def network_time_png(curve: list[tuple[float, float]], kernels: list[tuple[str, float | None, float | None]],
                     path: str, final: float | None = None, title: str = "") -> str:
    """`curve`: (wall seconds, estimate ms) after each round once every kernel had a valid reading;
    `kernels`: (name, share of the final estimate, share of the tuning time), shares as fractions
    (None: not known); `final`: the final estimate (each kernel's chosen best), a dashed line."""
    network_time_figure(curve, kernels, final, title).savefig(path, dpi=110)
    return path
