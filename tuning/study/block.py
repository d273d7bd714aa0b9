"""One block of a study: one (task, seed) with every arm, start to finish in this process, on one
hardware; what it found and read, as one mapping (tuning/study/files.py writes it).

1. The arms' job configs are composed (the study's `common`, the arm's overrides, then the block's
   model, seed, budget and output folder) and checked like any job's before anything is measured;
   every arm must name the same hardware. An arm's evaluator reads its own rounds (AdaTune's
   early-stopping reading, a screening cut: a method's own way of reading its candidates); the
   panel and adjudication read with the study's rule, the evaluator of `common` alone, the same for
   every arm.
2. A reference panel of fixed configs (the fastest of a few drawn from the task alone) is read
   at the start, after every cycle of rounds and at the end: the host's drift through the block.
3. The arms' rounds interleave, the arm that has measured least going next (one round each in turn
   where their round sizes are equal), so drift falls on every arm alike; the arm that goes first
   among equals rotates with the block's seed.
4. Adjudication: each arm's `top_k` configs by their selecting reading are re-read `rereads` times,
   all arms' re-reads shuffled together; the config of the best median is the arm's finalist; then
   `confirm` fresh readings of each finalist, shuffled together again, and their median is the arm's
   final latency. No reading that chose a config is ever part of its final latency.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from tuning.cluster.host_identity import vector_isa
from tuning.config import ConfigError, register
from tuning.config.conf_dir import CONF_DIR
from tuning.core.records import MeasureResult
from tuning.core.space import Config
from tuning.core.task import Task, build_tasks, is_whole_model
from tuning.engine.first_round import prior_of
from tuning.engine.loop import Components, RunInfo, TaskTuner
from tuning.engine.validate import validate
from tuning.study import bystanders
from tuning.study.spec import StudySpec
from tuning.tracking.base import NoTracker

NO_PRIOR = "tuning.prior=null"  # a study's arms have no first-round prior unless the study names one
PANEL_STREAM = 7_091  # the panel's draws depend on the task alone
ADJUDICATION_STREAM = 991
PANEL_DRAWS = 4  # configs tried for each panel place


@dataclass
class Arm:
    name: str
    cfg: DictConfig
    tuner: TaskTuner | None = None
    peer: str | None = None  # a tuner run whole (MetaSchedule's tune_tir): its records, not a TaskTuner's
    peer_records: list[tuple[Config, float | None]] | None = None
    peer_unmapped: int = 0
    tuning_s: float = 0.0  # the wall of the arm's own rounds (a peer: its whole process)
    marks: list[tuple[int, float]] = field(default_factory=list)  # (measurements, tuning_s) after each round

    def readings(self) -> list[tuple[Config, float | None, str | None]]:
        """(config, selecting reading or None, error) of every measurement, in order."""
        if self.peer_records is not None:
            return [(c, s, None if s is not None else "failed") for c, s in self.peer_records]
        assert self.tuner is not None
        return [(tuple(r.config), r.result.cost if r.result.ok else None, r.result.error) for r in self.tuner.records]


def arm_config(spec: StudySpec, overrides: tuple[str, ...], task: str, seed: int, out_dir: Path,
               plan_size: int | None = None) -> DictConfig:
    """An arm's job config in a block (`plan_size`: its own, default the study's), checked as a job's is
    (ConfigError naming the key)."""
    from hydra import compose, initialize_config_dir

    register()
    named = any(o.lstrip("+").startswith("tuning.prior=") for o in (*spec.common, *overrides))
    argv = [*(() if named else (NO_PRIOR,)), *spec.common, *overrides, f"model={task}", f"seed={seed}",
            f"budget.trials={spec.trials}",
            f"budget.plan_size={plan_size or spec.plan_size}", "tracking=none", f"output_dir={out_dir}"]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="study"):
            cfg = compose("config", overrides=argv)
    except Exception as error:  # Hydra's own words for an unknown option or key
        raise ConfigError(f"study: arm overrides {' '.join(overrides)}: {error}") from None
    validate(cfg)
    if is_whole_model(cfg.model):
        raise ConfigError(f"study.tasks: {task} is a whole model; a block tunes one operator")
    return cfg


def arm_configs(spec: StudySpec, task: str, seed: int, work: Path) -> list[Arm]:
    peers = dict(spec.peers)
    arms = [Arm(name, arm_config(spec, overrides, task, seed, work / name, spec.plan_size_of(name)),
                peer=peers.get(name)) for name, overrides in spec.arms]
    first = arms[0]
    for arm in arms[1:]:
        if _plain(arm.cfg.hardware) != _plain(first.cfg.hardware):
            raise ConfigError(f"study.arms.{arm.name}: its hardware differs from arm {first.name}'s; a block "
                              "reads every arm on one hardware (set it in study.common)")
    return arms


def reading_config(spec: StudySpec, task: str, seed: int, work: Path) -> DictConfig:
    """The study's reading rule: the job config of study.common alone, whose evaluator reads the panel
    and adjudicates every arm (an arm's own evaluator reads its own rounds only)."""
    return arm_config(spec, (), task, seed, work / "reading")


def check_study(spec: StudySpec, work: Path) -> None:
    """Every arm of every task composes and passes the job checks: before any block runs."""
    for task in spec.tasks:
        arm_configs(spec, task, spec.seeds[0], work)
        reading_config(spec, task, spec.seeds[0], work)


def run_block(spec: StudySpec, task_name: str, seed: int, work: Path, host: dict) -> dict[str, Any]:
    """Tune every arm on (task, seed), adjudicate, and return the block's record."""
    from hydra.utils import instantiate

    started, wall, machine = time.time(), time.perf_counter(), bystanders.sample()
    arms = arm_configs(spec, task_name, seed, work)
    # the panel and adjudication read by the study's rule (measure/remeasure, which never screen), one for every arm
    hardware = instantiate(arms[0].cfg.hardware)
    evaluator = instantiate(reading_config(spec, task_name, seed, work).evaluator)
    try:
        [task] = build_tasks(arms[0].cfg.model)
        space_size = getattr(hardware.space(task), "size", None)
        lab, peers = [a for a in arms if not a.peer], [a for a in arms if a.peer]
        for arm in lab:
            parts = Components(instantiate(arm.cfg.search), instantiate(arm.cfg.sampler), instantiate(arm.cfg.evaluator),
                               instantiate(arm.cfg.cost_model), hardware, NoTracker())
            run = RunInfo(seed=seed, out_dir=work / arm.name, method=arm.name, trials=spec.trials,
                          plan_size=spec.plan_size_of(arm.name), callbacks=[],
                          first_round_prior=prior_of(arm.cfg.tuning.get("prior"), seed, hardware))
            arm.tuner = TaskTuner(task, 0, parts, run)
        order = _rotated([a.name for a in lab], seed)
        # a peer runs whole: before the interleaved arms at an even seed, after them at an odd one
        order = [*(a.name for a in peers), *order] if seed % 2 == 0 else [*order, *(a.name for a in peers)]
        panel = Panel.drawn(hardware, evaluator, task, spec.panel_configs)
        if seed % 2 == 0:
            _run_peers(peers, hardware, evaluator, task, spec, seed, work, panel)
        _interleave({a.name: a for a in lab}, [n for n in order if n in {a.name for a in lab}], spec, panel)
        if seed % 2 == 1:
            _run_peers(peers, hardware, evaluator, task, spec, seed, work, panel)
        adjudicated = adjudicate(arms, hardware, evaluator, task, spec, seed)
        panel.read()
    finally:
        hardware.close()
    finals = [v["final_s"] for v in adjudicated.values() if v["final_s"] is not None]
    target = min(finals) / spec.target_fraction if finals else None  # that fraction of the best throughput
    for record in adjudicated.values():  # a peer's records are in its database's order, not measured order
        record["to_target"] = None if "peer" in record else measurements_to_target(record, target)
        record["to_target_s"] = seconds_to(record, record["to_target"])
    return {"study": spec.name, "plan_hash": spec.plan_hash, "task": task_name, "seed": seed,
            "block": f"{task_name}-seed{seed}", "host": host, "isa": vector_isa(), "space_size": space_size,
            "order": order, "started": started,
            "wall_s": time.perf_counter() - wall, "arms": adjudicated, "panel": panel.summary(spec.drift_bound),
            "target_s": target, "machine": bystanders.shares(machine, bystanders.sample())}


def measurements_to_target(arm: dict[str, Any], target: float | None) -> int | None:
    """How many measurements the arm had made when it first measured a config whose re-read median is
    within the block's target: judged by fresh readings only, so only its re-read (top) configs can
    count, and None (censored) where none of them is within it."""
    if target is None:
        return None
    within = {key for key, reads in arm["rereads"].items() if reads and statistics.median(reads) <= target}
    return next((i + 1 for i, (config, _, _) in enumerate(arm["records"]) if _key(tuple(config)) in within), None)


def seconds_to(arm: dict[str, Any], measurements: int | None) -> float | None:
    """The arm's tuning seconds at the end of the round that made its `measurements`-th measurement
    (when its tuner could first know it had it); None where that is None or no round marks were kept."""
    if measurements is None:
        return None
    return next((seconds for count, seconds in arm.get("rounds") or [] if count >= measurements), None)


def _plain(node) -> Any:
    return OmegaConf.to_container(node, resolve=True)


def _rotated(names: list[str], seed: int) -> list[str]:
    k = seed % len(names)
    return names[k:] + names[:k]


def _interleave(arms: dict[str, Arm], order: list[str], spec: StudySpec, panel: Panel) -> None:
    """A round of the arm that has measured least (the first in `order` among equals) until every arm
    has its budget or stopped, so that arms of different round sizes stay level in measurements and
    drift falls on them alike (equal round sizes: one round of each in turn); the panel whenever the
    arms have all passed another budget.plan_size measurements."""
    stalled: set[str] = set()  # a round that measured nothing new: the arm has nothing left to propose

    def level(name: str) -> int:
        tuner = arms[name].tuner
        assert tuner is not None
        return spec.trials if tuner.done or name in stalled else tuner.measured

    read = 0
    while True:
        behind = [name for name in order if level(name) < spec.trials]
        if not behind:
            return
        name = min(behind, key=level)  # min() keeps the first of equals
        tuner = arms[name].tuner
        assert tuner is not None
        started, before = time.perf_counter(), tuner.measured
        tuner.tune_round(min(spec.plan_size_of(name), spec.trials - tuner.measured))
        arms[name].tuning_s += time.perf_counter() - started
        arms[name].marks.append((tuner.measured, arms[name].tuning_s))
        if tuner.measured == before:
            stalled.add(name)
        passed = min(level(n) for n in order) // spec.plan_size
        if passed > read or all(level(n) >= spec.trials for n in order):
            read = passed
            panel.read()


def _run_peers(peers: list[Arm], hardware, evaluator, task: Task, spec: StudySpec, seed: int, work: Path,
               panel: Panel) -> None:
    """Each peer tuner run whole, in a process of its own (TVM stays out of this one), then the panel."""
    from tuning.study.peer import run_peer

    for arm in peers:
        if not getattr(type(hardware), "schedules_programs", False) or not hasattr(hardware, "target"):
            raise ConfigError(f"study.arms.{arm.name}: a {arm.peer} peer tunes with TVM: hardware=cpu "
                              f"(not {type(hardware).__name__})")
        started = time.perf_counter()
        arm.peer_records, arm.peer_unmapped = run_peer(
            str(arm.peer), task.workload, hardware.target, work / arm.name, spec.trials, seed, evaluator.spec,
            int(getattr(hardware, "num_threads", 1) or 1), spec.plan_size)
        arm.tuning_s = time.perf_counter() - started
        panel.read()


# ---- the reference panel ---------------------------------------------------------------------------
@dataclass
class Panel:
    hardware: Any
    evaluator: Any
    task: Task
    configs: list[Config]
    reads: list[list[float | None]]

    @classmethod
    def drawn(cls, hardware, evaluator, task: Task, count: int) -> Panel:
        """The `count` fastest of up to 4 x `count` configs that build and run, drawn from the task alone
        (a random config can be 20x a tuned one's time: the fastest keep each panel reading short);
        their first reading taken."""
        space, rng = hardware.space(task), np.random.default_rng([PANEL_STREAM, _stream(task)])
        tried: set = set()
        first: dict[Config, float] = {}
        for _ in range(40 * count):
            if len(first) == PANEL_DRAWS * count:
                break
            config = tuple(space.canonical(space.sample(rng)))
            if config not in tried:
                tried.add(config)
                [result] = evaluator.measure(hardware, task, [config])
                if result.ok:
                    first[config] = result.cost
        panel = cls(hardware, evaluator, task, sorted(first, key=lambda c: (first[c], c))[:count], [])
        panel.read()
        return panel

    def read(self) -> None:
        if self.configs:
            results = self.evaluator.remeasure(self.hardware, self.task, self.configs)
            self.reads.append([r.cost if r.ok else None for r in results])

    def summary(self, bound: float) -> dict[str, Any]:
        """Each config's readings through the block, and its drift: the largest max/min ratio."""
        drift = 1.0
        for i in range(len(self.configs)):
            seen = [value for row in self.reads if (value := row[i]) is not None]
            if seen:
                drift = max(drift, max(seen) / min(seen))
        return {"configs": [list(c) for c in self.configs], "reads": self.reads, "drift": drift,
                "flagged": drift > bound}


def _stream(task: Task) -> int:
    return int.from_bytes(task.key.encode()[:8].ljust(8, b"\0"), "little") % (2**32)


# ---- adjudication ------------------------------------------------------------------------------------
def adjudicate(arms: list[Arm], hardware, evaluator, task: Task, spec: StudySpec, seed: int) -> dict[str, dict]:
    rng = np.random.default_rng([seed, ADJUDICATION_STREAM, _stream(task)])
    top = {arm.name: _top(arm, spec.adjudication.top_k) for arm in arms}
    rereads = _read_shuffled([(name, c) for name, configs in top.items() for c in configs
                              for _ in range(spec.adjudication.rereads)], hardware, evaluator, task, rng)
    finalists = {name: _best_median(name, configs, rereads) for name, configs in top.items() if configs}
    confirmed = _read_shuffled([(name, c) for name, c in finalists.items() for _ in range(spec.adjudication.confirm)],
                               hardware, evaluator, task, rng)
    out = {}
    for arm in arms:
        readings = arm.readings()
        finalist = finalists.get(arm.name)
        confirm = confirmed.get((arm.name, finalist), []) if finalist else []
        final = _median(confirm) if finalist else None
        selecting = min((cost for config, cost, _ in readings if cost is not None and config == finalist),
                        default=None)
        final = None if final is None or final == float("inf") else final
        out[arm.name] = {
            "records": [[list(config), cost, error] for config, cost, error in readings],
            "stopped": arm.tuner.outcome.stopped_because if arm.tuner else "budget (run whole)",
            **({"peer": arm.peer, "unmapped": arm.peer_unmapped} if arm.peer else {}),
            "top": [list(c) for c in top[arm.name]],
            "rereads": {_key(c): rereads.get((arm.name, c), []) for c in top[arm.name]},
            "finalist": list(finalist) if finalist else None, "confirm": confirm,
            "final_s": final, "selecting_s": selecting,
            "winners_curse": selecting / final if selecting and final else None,
            "tuning_s": arm.tuning_s,
            **({"rounds": [[count, seconds] for count, seconds in arm.marks]} if arm.marks else {}),
            "screened": sum(bool(r.result.screened) for r in arm.tuner.records) if arm.tuner else 0,
        }
    return out


def _best_median(arm: str, configs: list[Config], rereads: dict[tuple[str, Config], list[float]]) -> Config:
    return min(configs, key=lambda config: _median(rereads.get((arm, config), [])))


def _top(arm: Arm, k: int) -> list[Config]:
    best: dict[Config, float] = {}
    for config, cost, _ in arm.readings():
        if cost is not None:
            best[config] = min(best.get(config, float("inf")), cost)
    return sorted(best, key=lambda c: (best[c], c))[:k]


def _read_shuffled(wanted: list[tuple[str, Config]], hardware, evaluator, task: Task,
                   rng: np.random.Generator) -> dict[tuple[str, Config], list[float]]:
    """One reading per entry, in a shuffled order, each its own measurement."""
    readings: dict[tuple[str, Config], list[float]] = {}
    for index in rng.permutation(len(wanted)):
        arm, config = wanted[index]
        [result] = evaluator.remeasure(hardware, task, [config])
        readings.setdefault((arm, config), []).append(_cost(result))
    return readings


def _cost(result: MeasureResult) -> float:
    return result.cost if result.ok else float("inf")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("inf")


def _key(config: Config) -> str:
    return ",".join(map(str, config))
