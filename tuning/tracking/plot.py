"""Convergence plot: best-so-far against measurements, one line per curve."""
from __future__ import annotations


def convergence_png(curves: dict[str, list[tuple[int, float]]], path: str,
                    ylabel: str = "best GFLOP/s") -> str:
    import matplotlib

    matplotlib.use("Agg")  # no display on tuning machines
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in curves.items():
        if points:
            xs, ys = zip(*points)
            ax.step(xs, ys, where="post", label=name)  # best-so-far holds until the next improvement
    ax.set_xlabel("measurements")
    ax.set_ylabel(ylabel)
    ax.set_title("Convergence")
    ax.grid(alpha=0.3)
    if any(curves.values()):
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
