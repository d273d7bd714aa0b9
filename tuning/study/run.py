"""A study run block by block, and its table from whatever block files exist.

`run_study` takes the study's blocks in order (seed by seed), skips those some host has finished
(a file under <results>/blocks/), and runs each other one from its start: a block whose earlier
attempt was killed has its scratch folder removed first, never continued. Every arm of every task is
checked before the first block. `--blocks N` and `--hours H` bound one sitting; a block is started only
where the time left holds one more of the longest this sitting has seen.

`study_table` reads every block file, keeps those made under the study's plan (its hash), and hands
the pre-registered analysis (tuning/study/analysis.py) the per-block final latencies, the host kind of
each block as its stratum; intervals are withheld below the plan's block count.
"""
from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuning.cluster.host_identity import host_identity, host_key
from tuning.config.storage import outputs_dir
from tuning.study.analysis import Table, described_ratio, family_table, markdown, ratio_row
from tuning.study.block import check_study, run_block
from tuning.study.bystanders import BUSY_SHARE, others_now
from tuning.study.files import BlockFile, finished_blocks, number, other_plans, read_blocks, write_block
from tuning.study.spec import StudySpec


def scratch(spec: StudySpec) -> Path:
    return Path(outputs_dir()) / "studies" / spec.name / "work"


def run_study(spec: StudySpec, blocks: int | None = None, hours: float | None = None,
              say: Callable[[str], None] = print, on_block: Callable[[Path], None] | None = None) -> list[Path]:
    """The files of the blocks this call finished; `on_block` is called with each as it is written."""
    work_root = scratch(spec)
    check_study(spec, work_root / "check")
    shutil.rmtree(work_root / "check", ignore_errors=True)
    deadline = None if hours is None else time.monotonic() + hours * 3600
    host, made, longest = host_identity(), list[Path](), 0.0
    for plan, count in other_plans(spec.results, spec.name, spec.arm_names, spec.plan_hash).items():
        say(f"study {spec.name}: {count} block(s) under another plan ({plan}) are not this plan's "
            f"({spec.plan_hash}): its blocks are made anew, and its table is not confirmatory if the plan "
            "changed after data")
    for task, seed in spec.blocks:
        block = f"{task}-seed{seed}"
        if block in finished_blocks(spec.results, spec.name, spec.arm_names, spec.plan_hash):
            continue
        if blocks is not None and len(made) >= blocks:
            break
        if deadline is not None and time.monotonic() + longest > deadline:
            say(f"study {spec.name}: {block} not started: the {hours} h of this sitting would not hold it")
            break
        work = work_root / block
        if work.exists():
            say(f"study {spec.name}: {block} was started before and not finished: run again from its start")
            shutil.rmtree(work)
        started = time.monotonic()
        say(f"study {spec.name}: block {block} on {host_key(host)}")
        busy = others_now()
        if busy > BUSY_SHARE:
            say(f"study {spec.name}: other processes are taking {busy:.0%} of this machine's CPU; a block timed "
                "beside other work is named as such in the table (docs/studies.md §A block)")
        data = run_block(spec, task, seed, work, host)
        made.append(write_block(spec.results, data))
        shutil.rmtree(work, ignore_errors=True)
        longest = max(longest, time.monotonic() - started)
        say(f"study {spec.name}: {block} done in {data['wall_s']:.0f} s: {made[-1]}")
        if on_block is not None:
            on_block(made[-1])
    return made


@dataclass(frozen=True)
class Look:
    """The study's table from the block files there now: the files made under its plan (in the order a
    look takes them: first made first), those made under other plans, and a line for each file left out."""

    table: Table
    files: list[BlockFile]
    others: list[BlockFile]
    problems: list[str]

    @property
    def other_plans(self) -> list[str]:
        return sorted({f.data["plan_hash"] for f in self.others})


def look(spec: StudySpec) -> Look:
    files, problems = read_blocks(spec.results, spec.name, spec.arm_names)
    ours = sorted((f for f in files if f.data["plan_hash"] == spec.plan_hash),  # a look takes the first made
                  key=lambda f: (number(f.data.get("started")) or 0.0, f.block))
    table = family_table(spec.analysis, [_analysed(spec, f) for f in ours])
    return Look(table, ours, [f for f in files if f.data["plan_hash"] != spec.plan_hash], problems)


def study_table(spec: StudySpec) -> str:
    seen = look(spec)
    table, ours, others, problems = seen.table, seen.files, seen.other_plans, seen.problems
    lines = [f"# Study {spec.name} (plan {spec.plan_hash})", "", spec.description, "",
             f"Blocks: {len(ours)} of {len(spec.blocks)} planned ({len(spec.tasks)} task(s) x {len(spec.seeds)} "
             f"seeds); budget {spec.trials} measurements an arm, plan size {spec.plan_size}"
             f"{''.join(f', {arm} {size}' for arm, size in spec.plan_sizes)}; final latency: "
             f"the median of {spec.adjudication.confirm} fresh readings of each arm's finalist (chosen among its "
             f"top {spec.adjudication.top_k} by {spec.adjudication.rereads} re-reads each).", "",
             _scope(spec, ours), "", markdown(table), "", *_by_isa(spec, ours), *_noise_lines(spec, ours),
             *_time_lines(spec, ours)]
    lines += ["", *_block_list(spec, ours)]
    if others:
        lines.append(f"Left out: {len(seen.others)} block(s) made under "
                     f"another plan ({', '.join(others)}): not part of this confirmatory table.")
    lines += problems
    return "\n".join(lines)


def _analysed(spec: StudySpec, file) -> dict:
    """A block file as the analysis reads it: each arm's final latency, and its measurements and tuning
    seconds to the target as [value, censored] (censored: never reached, counted at all it spent;
    None where the file does not say, as a block made before tuning seconds were kept by round)."""
    arms = {arm: file.data["arms"].get(arm, {}) for arm in spec.arm_names}
    return {"block": file.block, "host_kind": host_key(file.data["host"]),
            "final": {arm: record.get("final_s") for arm, record in arms.items()},
            "to_target": {arm: _to_target(record.get("to_target"), len(record.get("records") or []),
                                          known="peer" not in record) for arm, record in arms.items()},
            "to_target_s": {arm: _to_target(record.get("to_target_s"), number(record.get("tuning_s")),
                                            known="peer" not in record and bool(record.get("rounds")))
                            for arm, record in arms.items()}}


def _to_target(value, spent: float | None, known: bool = True) -> list | None:
    """[value, False] where the arm reached the target, [spent, True] where it did not, None where the
    file cannot tell (a peer's records are not in measured order)."""
    if not known:
        return None
    reached = number(value)
    if reached is not None and reached > 0:
        return [reached, False]
    return [spent, True] if value is None and spent else None


def _scope(spec: StudySpec, files) -> str:
    """What every verdict of the table is about, and so what it is not about."""
    hosts = "; ".join(host_kinds(files)) or "none yet"
    return (f"What the verdicts are about: {tasks_and_spaces(spec, files)}; {spec.trials} measurements an arm; the "
            f"hosts that made the blocks ({len({host_key(f.data['host']) for f in files})} kind(s) drawn: {hosts}), "
            "not other hosts, budgets or tasks.")


def tasks_and_spaces(spec: StudySpec, files) -> str:
    """The study's tasks, each with its full space's size as its blocks recorded it."""
    sizes = {f.data["task"]: f.data.get("space_size") for f in files}
    return ", ".join(f"{task} (full space of {sizes[task]:,} configs)" if isinstance(sizes.get(task), int)
                     else f"{task} (space size not recorded)" for task in spec.tasks)


def host_kinds(files) -> dict[str, int]:
    """{"<cores>-core, <ISA>": blocks made on such hosts}, in order."""
    kinds: dict[str, int] = {}
    for f in files:
        kind = f"{f.data['host'].get('cores', '?')}-core, {f.data.get('isa', 'ISA not recorded')}"
        kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items()))


def _by_isa(spec: StudySpec, files) -> list[str]:
    """Each claim's ratio on the AVX-512 and on the AVX2 hosts apart, where blocks of both are in:
    descriptive (no test, no verdict: the verdicts are the pooled, stratified table's), withheld below
    the plan's min_blocks."""
    isas = sorted({f.data.get("isa") for f in files} & {"avx2", "avx512"})
    if len(isas) < 2:
        return []
    lines = ["AVX-512 and AVX2 hosts apart (descriptive, no verdicts; intervals at 1 - alpha):"]
    for isa in isas:
        part = [_analysed(spec, f)["final"] for f in files if f.data.get("isa") == isa]
        for claim in (*spec.analysis.claims, *spec.analysis.controls):
            pairs = [(b[claim.arm], b[claim.baseline]) for b in part if b[claim.arm] and b[claim.baseline]]
            if len(pairs) < spec.analysis.min_blocks:
                lines.append(f"- {isa}: {claim.arm} / {claim.baseline}: {len(pairs)} block(s), withheld "
                             f"(< min_blocks {spec.analysis.min_blocks})")
                continue
            row = ratio_row([a for a, _ in pairs], [b for _, b in pairs], ["one"] * len(pairs), claim, spec.analysis.alpha)
            estimate = row.plain
            assert estimate is not None
            lines.append(f"- {isa}: {claim.arm} / {claim.baseline}: {len(pairs)} block(s), {estimate.ratio:.3f} "
                         f"[{estimate.low:.3f}, {estimate.high:.3f}]")
    return [*lines, ""]


def _noise_lines(spec: StudySpec, files) -> list[str]:
    if not files:
        return []
    drift = [f.data["panel"].get("drift", 1.0) for f in files]
    flagged = [f.block for f in files if f.data["panel"].get("flagged")]
    curse = {arm: [c for f in files if (c := f.data["arms"].get(arm, {}).get("winners_curse"))]
             for arm in spec.arm_names}
    busy = [f.block for f in files if (_others_share(f) or 0.0) > BUSY_SHARE]
    lines = [f"Panel drift through a block (max/min of a reference config's readings): median "
             f"{statistics.median(drift):.3f}, max {max(drift):.3f}; over the bound {spec.drift_bound}: "
             f"{', '.join(flagged) or 'none'}.",
             f"Measured beside other work (other processes took more than {BUSY_SHARE:.0%} of the machine's CPU "
             f"during the block): {', '.join(busy) or 'none'}."]
    lines.append("Winner's curse (selecting reading / final latency of the finalist), median per arm: " + (", ".join(
        f"{arm} {statistics.median(values):.3f}" for arm, values in curse.items() if values) or "none recorded") + ".")
    reached = {arm: [f.data["arms"].get(arm, {}).get("to_target") for f in files] for arm in spec.arm_names}
    lines.append(f"Measurements to the target ({spec.target_fraction:g} of the block's best throughput, judged by "
                 "re-read medians; censored where no re-read config reached it), median per arm: " + ", ".join(
                     f"{arm} {_median_or_dash([n for n in counts if n is not None])} "
                     f"({sum(n is None for n in counts)} censored)" for arm, counts in reached.items()) + ".")
    hosts: dict[str, int] = {}
    for f in files:
        hosts[host_key(f.data["host"])] = hosts.get(host_key(f.data["host"]), 0) + 1
    lines.append("Hosts: " + ", ".join(f"{key} ({n})" for key, n in sorted(hosts.items())) + ".")
    return lines


def _time_lines(spec: StudySpec, files) -> list[str]:
    """What each arm's rounds cost: seconds of tuning per measurement (the wall of the arm's own rounds:
    its search, builds and readings), median per arm, and each claim's arm / baseline over the blocks
    that recorded both (geometric mean, t interval at 1 - alpha): descriptive, no test, no verdict."""
    per: dict[str, list[float | None]] = {arm: [] for arm in spec.arm_names}
    for f in files:
        for arm in spec.arm_names:
            record = f.data["arms"].get(arm, {})
            seconds, count = number(record.get("tuning_s")), len(record.get("records") or [])
            per[arm].append(seconds / count if seconds and count else None)
    if not any(value is not None for values in per.values() for value in values):
        return []
    lines = ["Tuning time, seconds per measurement (the wall of an arm's own rounds; descriptive), median per arm: "
             + ", ".join(f"{arm} {statistics.median(v):.3f}" for arm, values in per.items()
                         if (v := [x for x in values if x is not None])) + "."]
    screened = {arm: [f.data["arms"].get(arm, {}).get("screened") for f in files] for arm in spec.arm_names}
    if any(isinstance(n, int) and n > 0 for counts in screened.values() for n in counts):
        lines.append("Screened (read once, far slower than the best so far), measurements per block, median per "
                     "arm: " + ", ".join(f"{arm} {_median_or_dash([n for n in counts if isinstance(n, int)])}"
                                          for arm, counts in screened.items()) + ".")
    for arm, baseline in dict.fromkeys((c.arm, c.baseline) for c in (*spec.analysis.claims, *spec.analysis.controls)):
        pairs = [(a, b) for a, b in zip(per[arm], per[baseline]) if a and b]
        if len(pairs) < 2:
            continue
        ratio, low, high = described_ratio([a for a, _ in pairs], [b for _, b in pairs], spec.analysis.alpha)
        lines.append(f"- tuning time per measurement, {arm} / {baseline}: {ratio:.3f} "
                     f"[{low:.3f}, {high:.3f}] over {len(pairs)} blocks")
    return lines


def _block_list(spec: StudySpec, files) -> list[str]:
    """Each block, in the order given: when and on which host kind it was made, its wall time, panel
    drift, others' share of the CPU and each arm's final latency (µs)."""
    if not files:
        return []
    lines = ["| block | made (UTC) | host kind | minutes | panel drift | others' CPU | "
             + " | ".join(f"{arm} µs" for arm in spec.arm_names) + " |",
             "|---" * (6 + len(spec.arm_names)) + "|"]
    for f in files:
        started = number(f.data.get("started"))
        finals = [number(f.data["arms"].get(arm, {}).get("final_s")) for arm in spec.arm_names]
        cells = [f.block, "-" if started is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
                 host_key(f.data["host"]), _cell(number(f.data.get("wall_s")), "{:.1f}", 1 / 60),
                 _cell(number(f.data["panel"].get("drift")), "{:.3f}"),
                 _cell(_others_share(f), "{:.1%}", missing="not recorded"),
                 *(_cell(final, "{:.1f}", 1e6) for final in finals)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _cell(value: float | None, form: str, scale: float = 1.0, missing: str = "-") -> str:
    return missing if value is None else form.format(value * scale)


def _others_share(file) -> float | None:
    machine = file.data.get("machine")
    return number(machine.get("others_cpu_share")) if isinstance(machine, dict) else None


def _median_or_dash(values: list[int]) -> str:
    return f"{statistics.median(values):g}" if values else "-"
