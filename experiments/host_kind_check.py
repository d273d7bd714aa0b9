"""Whether this host reads a campaign archive's kernels as the archive's own host did.

    python experiments/host_kind_check.py campaigns/gemm-tiling/amd-epyc-2c-b0f48b9c.tar.xz --runs 'gemm_512/*/seed*'

A campaign continues only on a host of its archive's kind (tuning/tools/campaign_archive.py); a host
whose CPU flags differ from the archive's only in NEUTRAL_FLAGS counts as that kind. A flag joins
that list only after this check: the best `--top` configs of each finished run in the archive (read
through its view, never into this host's stores) are measured here `--passes` times into a scratch
store of their own, and each pass is set beside the archive's readings of the same configs:

- finalists, the configs the archive re-read (3 or more rows): this host's pass against the median
  of the archive's re-reads. A run's best config was picked by its first reading, the lowest of
  hundreds of noisy ones, so that reading is biased low; the re-reads and this host's are not;
- the rest, read once there: this host's pass against that one biased reading, beside the same
  bias on one host (the archive's re-reads against its first reading of the finalists).

Median ratios (here / there) with 95% bootstrap intervals over the configs. The hosts read alike at
`--margin` when the last pass's finalist interval lies inside [1/margin, margin]; set that beside
the host's own drift (the same check run again hours later reads its own earlier passes), which
on 2026-12-04 was wider than 1.05x (docs/claims.md §Is a new host of an archive's kind?). The first
pass reads the host as it comes: a VM read configs up to 2.5x slow in its first 20 minutes, so the
later passes are the ones to judge by.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

from tuning.store import MeasurementStore, connect_store
from tuning.tools.campaign_archive import ArchiveError, host_identity, host_key, open_view
from tuning.tools.compare.stats import bootstrap_ci
from tuning.tools.dataset import main as dataset_main


def readings_by_config(store: MeasurementStore, key: tuple) -> dict[tuple, list[float]]:
    """Each config's rows in the order written, each row as the median of its repeats."""
    rows: dict = {}
    for row in store.rows(*key):
        if row.ok:
            rows.setdefault(row.config, []).append(statistics.median(row.costs))
    return rows


def interval(ratios: list[float]) -> tuple[str, float, float]:
    """The median ratio and its 95% bootstrap interval, as text and as (low, high)."""
    median, low, high = bootstrap_ci(ratios, np.median, np.random.default_rng(0))
    return f"{median:.3f} [{low:.3f}, {high:.3f}] (n={len(ratios)})", low, high


def compare_task(there: dict, here: dict, passes: int, margin: float) -> tuple[list[str], bool | None]:
    """Lines for one task and whether its last pass's finalists read alike (None: no finalists)."""
    finalists = [c for c in here if len(there.get(c, ())) >= 3]
    others = [c for c in here if len(there.get(c, ())) == 1]
    lines = []
    if finalists:
        bias = [statistics.median(there[c][1:]) / there[c][0] for c in finalists]
        lines.append(f"  there, finalists re-read / first reading (the selection's bias): {interval(bias)[0]}")
    alike = None
    for index in range(passes):
        done = [c for c in finalists if len(here[c]) > index]
        if done:
            ratios = [here[c][index] / statistics.median(there[c][1:]) for c in done]
            text, low, high = interval(ratios)
            lines.append(f"  pass {index + 1}: finalists here / there's re-reads {text}")
            alike = 1 / margin <= low and high <= margin
        rest = [c for c in others if len(here[c]) > index]
        if rest:
            ratios = np.array([here[c][index] / there[c][0] for c in rest])
            lines.append(f"  pass {index + 1}: the rest here / there's one reading {interval(list(ratios))[0]}, "
                         f"{np.mean(np.abs(ratios - 1) <= 0.1):.0%} within 10%, {int(np.sum(ratios > 1.3))} over 1.3x")
    return lines, alike


def report(there_path: Path, here_path: Path, passes: int, margin: float) -> bool:
    there = connect_store(there_path, read_only=True)
    here = connect_store(here_path, read_only=True)
    verdicts = []
    for key in sorted(set(there.keys()) & set(here.keys())):
        name = (there.task_info(key[1]) or {"name": key[1]})["name"]
        print(f"{name} (hardware {key[0][:16]}):")
        lines, alike = compare_task(readings_by_config(there, key), readings_by_config(here, key), passes, margin)
        print("\n".join(lines))
        if alike is not None:
            verdicts.append(alike)
            print(f"  last pass: {'alike' if alike else 'not shown alike'} at a margin of {margin}x")
    return bool(verdicts) and all(verdicts)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archive", type=Path, help="one host's archive: campaigns/<campaign>/<host key>.tar.xz")
    parser.add_argument("--runs", default="*/*/seed*", help="the archive's run folders to take configs from (a glob)")
    parser.add_argument("--store", default="", help="the archive's store (a file name; default: its only one)")
    parser.add_argument("--top", type=int, default=10, help="configs taken from each run, its best by its readings")
    parser.add_argument("--passes", type=int, default=3, help="readings of each config here, one pass at a time")
    parser.add_argument("--margin", type=float, default=1.05, help="the ratio within which the hosts read alike")
    args = parser.parse_args(argv)
    if args.top < 1 or args.passes < 1 or args.margin <= 1:
        parser.error("--top and --passes must be >= 1 and --margin above 1")
    try:
        view = open_view(args.archive)
        held = sorted(p.name for p in view.stores.glob("*.sqlite"))
        if not args.store and len(held) != 1:
            raise ArchiveError(f"--store: {args.archive} holds {len(held)} stores ({', '.join(held)}); name one")
        store = view.store(args.store or held[0])
    except ArchiveError as error:
        raise SystemExit(f"tunelab: {error}") from None
    folders = sorted(p for p in view.root.glob(args.runs) if (p / "records.jsonl").is_file())
    if not folders:
        raise SystemExit(f"tunelab: --runs {args.runs!r}: no finished run of {args.archive} matches")
    here = view.root.parent / f"read-on-{host_key(host_identity())}.sqlite"
    print(f"{len(folders)} runs of {args.archive}; this host's readings go to {here}")
    for index in range(1, args.passes + 1):
        dataset_main(["reread", "--store", str(here), "--top", str(args.top), "--measurements", str(index),
                      "--override", f"hardware.store={here}", *map(str, folders)])
    alike = report(store, here, args.passes, args.margin)
    print(f"verdict: {'this host reads as the archive' if alike else 'not shown to read as the archive'}'s host "
          f"(every task's finalists within {args.margin}x on the last pass)")


if __name__ == "__main__":
    main()
