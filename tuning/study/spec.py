"""A study's declaration, read once into a frozen spec before any measurement.

    conf/study/<name>.yaml (or <dir>/study/<name>.yaml of a TUNELAB_CONF_DIRS directory)

    description: what it asks, in a sentence
    common: [hardware=synthetic, evaluator=fixed]      # overrides every arm runs with (one hardware)
    arms:                                               # name -> its own overrides
      sa: [search=sa, sampler=greedy, cost_model=xgb]
      random: [search=random, cost_model=none]
      tune_tir: {peer: metaschedule}                    # MetaSchedule's own tuner, run whole (hardware=cpu)
    tasks: [gemm_64]                                    # model options: a block is one (task, seed)
    seeds: 10                                           # seeds 0..9, or a list
    budget: {trials: 64, plan_size: 16}                 # every arm's, per block
      # plan_sizes: {gbfs: 5}                           # optional: an arm's own round size (its paper's)
    adjudication: {top_k: 3, rereads: 5, confirm: 5}
    panel: {configs: 3, drift_bound: 1.10}
    target: {fraction: 0.95}
    analysis:
      claims: [{arm: sa, baseline: random, kind: difference}]   # measure: final (default), to_target, to_target_s
      controls: []
      alpha: 0.05
      min_blocks: 8
      interim: obrien_fleming
      looks: [5, 10]                                    # optional: the looks (complete blocks), the last = all
    results: studies/<name>                             # the block files' folder (relative: to the cwd)
    report:                                             # optional: a row per claim in the lab's claims table
      page: docs/results/<date>-<host>-<name>.md        #   the dated page that discusses it
      says: [what the first claim says, in a sentence]  #   one per analysis.claims entry, in its order

Every key is checked here, each problem naming its key, before any block runs; the arms' composed
job configs are checked by tuning/study/block.py the same way. The plan's hash covers everything that
decides a verdict (arms, tasks, seeds, budget, adjudication, panel, target, analysis), so a table made
under another plan says so; the description, the results folder and the report are outside it (words
and places, not the plan).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from tuning.config import ConfigError
from tuning.config.conf_dir import CONF_DIR
from tuning.config.untrusted import env_conf_dirs
from tuning.study.analysis import Claim, Plan, claim_plan, plan_problems

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
KEYS = ("description", "common", "arms", "tasks", "seeds", "budget", "adjudication", "panel", "target",
        "analysis", "results", "report")
PLAN_KEYS = ("arms", "tasks", "seeds", "budget", "adjudication", "panel", "target", "analysis")
PEERS = ("metaschedule",)  # tuners run whole in a block: MetaSchedule's own tune_tir
RESERVED = ("seed=", "model=", "budget.", "output_dir=", "tracking=", "hydra.")  # the block sets these


@dataclass(frozen=True)
class Adjudication:
    top_k: int  # each arm's best configs by their selecting reading, re-read
    rereads: int  # times each of them is re-read, to choose the arm's finalist
    confirm: int  # fresh readings of the finalist alone: their median is its final latency


@dataclass(frozen=True)
class Report:
    """Where a study's claims enter the lab's claims table (tuning/study/claims_table.py)."""

    page: str | None  # the dated results page that discusses the study, relative to the repository
    says: tuple[str, ...]  # what each confirmatory claim says, in analysis.claims' order


@dataclass(frozen=True)
class StudySpec:
    name: str
    description: str
    common: tuple[str, ...]
    arms: tuple[tuple[str, tuple[str, ...]], ...]  # (name, overrides), in the file's order (a peer's: none)
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    trials: int
    plan_size: int
    adjudication: Adjudication
    panel_configs: int
    drift_bound: float
    target_fraction: float
    analysis: Plan  # claims, controls, alpha, min_blocks, interim, looks; planned_blocks = tasks x seeds
    results: Path
    peers: tuple[tuple[str, str], ...] = ()  # (arm name, peer kind): a tuner run whole (block.py)
    plan_sizes: tuple[tuple[str, int], ...] = ()  # (arm name, its round size) where not budget.plan_size
    report: Report | None = None  # a row per claim in the lab's claims table; None: not in it

    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.arms)

    def plan_size_of(self, arm: str) -> int:
        """The most an arm measures in one round: its own plan size, else the study's."""
        return dict(self.plan_sizes).get(arm, self.plan_size)

    @property
    def blocks(self) -> list[tuple[str, int]]:
        """Every (task, seed), in the order a run takes them: seed by seed, so that stopping early
        leaves whole seeds."""
        return [(task, seed) for seed in self.seeds for task in self.tasks]

    def plan(self) -> dict[str, Any]:
        """What decides a verdict, as plain data (the hash's input)."""
        peers, analysis = dict(self.peers), self.analysis
        return {"arms": {name: {"peer": peers[name]} if name in peers else list(overrides)
                         for name, overrides in self.arms}, "common": list(self.common),
                "tasks": list(self.tasks), "seeds": list(self.seeds),
                "budget": {"trials": self.trials, "plan_size": self.plan_size,
                           **({"plan_sizes": dict(self.plan_sizes)} if self.plan_sizes else {})},
                "adjudication": asdict(self.adjudication),
                "panel": {"configs": self.panel_configs, "drift_bound": self.drift_bound},
                "target": {"fraction": self.target_fraction},
                "analysis": {"claims": [claim_plan(c) for c in analysis.claims],
                             "controls": [claim_plan(c) for c in analysis.controls], "alpha": analysis.alpha,
                             "min_blocks": analysis.min_blocks, "interim": analysis.interim,
                             **({"looks": list(analysis.looks)} if analysis.looks else {})}}

    @property
    def plan_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.plan(), sort_keys=True).encode()).hexdigest()[:16]


def study_file(name: str) -> Path:
    """conf/study/<name>.yaml of the lab, else of the first TUNELAB_CONF_DIRS directory that has it."""
    if not NAME.fullmatch(name):
        raise ConfigError(f"study: {name!r} is not a study name (letters, digits, '_', '.', '-')")
    places = [CONF_DIR, *env_conf_dirs()]
    for place in places:
        if (place / "study" / f"{name}.yaml").is_file():
            return place / "study" / f"{name}.yaml"
    raise ConfigError(f"study: no study {name!r} in {', '.join(str(p / 'study') for p in places)} "
                      "(declare your own directory in TUNELAB_CONF_DIRS)")


def load_study(name: str) -> StudySpec:
    path = study_file(name)
    try:
        node = OmegaConf.load(path)
    except Exception as error:  # a YAML error of any kind: said with the file
        raise ConfigError(f"study: cannot read {path} ({error})") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"study: {path} is not a mapping")
    return study_spec(name, node)


def study_spec(name: str, node: DictConfig) -> StudySpec:
    """The spec of `node`, or a ConfigError listing every problem, each naming its key."""
    problems = [f"study.{key}: unknown key (known: {', '.join(KEYS)})" for key in node if key not in KEYS]
    data = OmegaConf.to_container(node, resolve=False)
    assert isinstance(data, dict)
    common = _overrides(data.get("common", []), "study.common", problems)
    arms = _arms(data.get("arms"), problems)
    tasks = _strings(data.get("tasks"), "study.tasks", problems)
    seeds = _seeds(data.get("seeds"), problems)
    budget = _mapping(data.get("budget"), "study.budget", ("trials", "plan_size", "plan_sizes"), problems)
    trials = _int(budget.get("trials"), "study.budget.trials", 1, problems)
    plan_size = _int(budget.get("plan_size"), "study.budget.plan_size", 1, problems)
    peers = _peers(data.get("arms") if isinstance(data.get("arms"), dict) else None)
    plan_sizes = _plan_sizes(budget.get("plan_sizes"), [a for a, _ in arms], dict(peers), trials, problems)
    adj = _mapping(data.get("adjudication", {}), "study.adjudication", ("top_k", "rereads", "confirm"), problems)
    adjudication = Adjudication(_int(adj.get("top_k", 3), "study.adjudication.top_k", 1, problems),
                                _int(adj.get("rereads", 5), "study.adjudication.rereads", 1, problems),
                                _int(adj.get("confirm", 5), "study.adjudication.confirm", 1, problems))
    panel = _mapping(data.get("panel", {}), "study.panel", ("configs", "drift_bound"), problems)
    target = _mapping(data.get("target", {}), "study.target", ("fraction",), problems)
    analysis = _mapping(data.get("analysis"), "study.analysis",
                        ("claims", "controls", "alpha", "min_blocks", "interim", "looks"), problems)
    names = [a for a, _ in arms]
    plan = Plan(claims=tuple(_claims(analysis.get("claims"), "study.analysis.claims", names, problems)),
                controls=tuple(_claims(analysis.get("controls", []), "study.analysis.controls", names, problems)),
                alpha=analysis.get("alpha", 0.05), min_blocks=analysis.get("min_blocks", 8),
                planned_blocks=len(tasks) * len(seeds), interim=str(analysis.get("interim", "obrien_fleming")),
                looks=_looks(analysis.get("looks"), problems))
    problems += _analysis_problems(plan, planned=bool(tasks and seeds))
    spec = StudySpec(
        name=name, description=str(data.get("description", "")), common=tuple(common), arms=tuple(arms),
        tasks=tuple(tasks), seeds=tuple(seeds), trials=trials, plan_size=plan_size, adjudication=adjudication,
        panel_configs=_int(panel.get("configs", 3), "study.panel.configs", 1, problems),
        drift_bound=_number(panel.get("drift_bound", 1.10), "study.panel.drift_bound", 1.0, problems),
        target_fraction=_number(target.get("fraction", 0.95), "study.target.fraction", 0.0, problems, high=1.0),
        analysis=plan, results=Path(str(data.get("results", f"studies/{name}"))),
        peers=peers, plan_sizes=plan_sizes, report=_report(data.get("report"), len(plan.claims), problems))
    if trials and plan_size and plan_size > trials:
        problems.append(f"study.budget.plan_size: {plan_size} is more than budget.trials {trials}")
    if problems:
        raise ConfigError("invalid study:\n  " + "\n  ".join(dict.fromkeys(problems)))
    return spec


# ---- the checks, each naming its key ----------------------------------------------------------------
def _mapping(value, key: str, known: tuple[str, ...], problems: list[str]) -> dict:
    if not isinstance(value, dict):
        problems.append(f"{key}: expected a mapping of {', '.join(known)}, got {value!r}")
        return {}
    problems += [f"{key}.{k}: unknown key (known: {', '.join(known)})" for k in value if k not in known]
    return value


def _int(value, key: str, low: int, problems: list[str]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        problems.append(f"{key}: expected an integer >= {low}, got {value!r}")
        return 0
    return value


def _number(value, key: str, low: float, problems: list[str], high: float | None = None) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if not ok or value <= low or (high is not None and value > high):
        bounds = f"in ({low}, {high}]" if high is not None else f"> {low}"
        problems.append(f"{key}: expected a number {bounds}, got {value!r}")
        return 0.0
    return float(value)


def _strings(value, key: str, problems: list[str]) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and NAME.fullmatch(v) for v in value):
        problems.append(f"{key}: expected a non-empty list of names, got {value!r}")
        return []
    if len(set(value)) != len(value):
        problems.append(f"{key}: a name is listed twice")
    return value


def _overrides(value, key: str, problems: list[str]) -> list[str]:
    if isinstance(value, ListConfig):
        value = list(value)
    if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
        problems.append(f"{key}: expected a list of Hydra overrides (group=option, key=value), got {value!r}")
        return []
    for item in value:
        if item.lstrip("+~").startswith(RESERVED):
            problems.append(f"{key}: {item!r} sets what each block sets itself (seed, model, budget, output_dir, "
                            "tracking, hydra); say it in study.seeds, study.tasks or study.budget")
    return value


def _arms(value, problems: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    if not isinstance(value, dict) or len(value) < 2:
        problems.append(f"study.arms: expected a mapping of two or more arm names to their overrides, got {value!r}")
        return []
    arms: list[tuple[str, tuple[str, ...]]] = []
    for name, overrides in value.items():
        if not NAME.fullmatch(str(name)):
            problems.append(f"study.arms.{name}: not an arm name (letters, digits, '_', '.', '-')")
        if isinstance(overrides, dict):  # a peer: {peer: metaschedule}
            if set(overrides) != {"peer"} or overrides["peer"] not in PEERS:
                problems.append(f"study.arms.{name}: a list of overrides, or {{peer: {' | '.join(PEERS)}}}, "
                                f"got {overrides!r}")
            arms.append((str(name), ()))
        else:
            arms.append((str(name), tuple(_overrides(overrides, f"study.arms.{name}", problems))))
    return arms


def _peers(value) -> tuple[tuple[str, str], ...]:
    return tuple((str(name), str(arm["peer"])) for name, arm in (value or {}).items()
                 if isinstance(arm, dict) and arm.get("peer") in PEERS)


def _plan_sizes(value, arms: list[str], peers: dict, trials: int, problems: list[str]) -> tuple[tuple[str, int], ...]:
    """budget.plan_sizes: {arm: its round size}, for arms the lab tunes (a peer runs whole), each at most
    budget.trials; in the arms' order."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        problems.append(f"study.budget.plan_sizes: expected a mapping of arm names to round sizes, got {value!r}")
        return ()
    sizes = {}
    for arm, size in value.items():
        key = f"study.budget.plan_sizes.{arm}"
        if arm not in arms or arm in peers:
            problems.append(f"{key}: not an arm the lab tunes ({', '.join(a for a in arms if a not in peers)})")
        elif _int(size, key, 1, problems) and trials and size > trials:
            problems.append(f"{key}: {size} is more than budget.trials {trials}")
        else:
            sizes[arm] = size
    return tuple((arm, sizes[arm]) for arm in arms if arm in sizes)


def _analysis_problems(plan: Plan, planned: bool) -> list[str]:
    """The analysis's own checks (tuning/study/analysis.py plan_problems), named by the study's keys; the
    count of planned blocks is the tasks and seeds, named there once both are readable."""
    problems = []
    for problem in plan_problems(plan):
        if not problem.startswith("analysis.planned_blocks"):
            problems.append("study." + problem)
        elif planned:
            problems.append(f"study.seeds: {plan.planned_blocks} block(s) planned (tasks x seeds), fewer than "
                            f"analysis.min_blocks {plan.min_blocks!r}: no table would show an estimate")
    return problems


def _report(value, claims: int, problems: list[str]) -> Report | None:
    if value is None:
        return None
    item = _mapping(value, "study.report", ("page", "says"), problems)
    page, says = item.get("page"), item.get("says")
    if page is not None and not (isinstance(page, str) and page.endswith(".md") and not page.startswith("/")
                                 and ".." not in Path(page).parts):
        problems.append(f"study.report.page: a results page relative to the repository (docs/results/NAME.md), "
                        f"got {page!r}")
        page = None
    if not (isinstance(says, list) and len(says) == claims and all(isinstance(s, str) and s.strip() for s in says)):
        problems.append(f"study.report.says: one sentence per claim of study.analysis.claims ({claims}), got {says!r}")
        says = []
    return Report(page, tuple(says))


def _looks(value, problems: list[str]) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not value or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in value):
        problems.append(f"study.analysis.looks: a list of block counts (e.g. [5, 10]), got {value!r}")
        return ()
    return tuple(value)


def _seeds(value, problems: list[str]) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return list(range(value))
    if isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                  for s in value) and len(set(value)) == len(value):
        return value
    problems.append(f"study.seeds: expected a count >= 1 or a list of distinct seeds >= 0, got {value!r}")
    return []


def _claims(value, key: str, arms: list[str], problems: list[str]) -> list[Claim]:
    """The claims as written; that each names arms of the study is checked here, the rest (kind, margin,
    an arm against itself, at least one claim) by the analysis's own plan_problems."""
    if not isinstance(value, list):
        problems.append(f"{key}: expected a list of {{arm, baseline, kind[, margin]}}")
        return []
    claims = []
    for i, item in enumerate(value):
        where = f"{key}[{i}]"
        item = _mapping(item, where, ("arm", "baseline", "kind", "margin", "measure"), problems)
        arm, baseline, kind = (item.get(k) for k in ("arm", "baseline", "kind"))
        margin: Any = item.get("margin")
        for part, name in (("arm", arm), ("baseline", baseline)):
            if name not in arms:
                problems.append(f"{where}.{part}: {name!r} is not an arm ({', '.join(arms)})")
        if item:
            numeric = isinstance(margin, (int, float)) and not isinstance(margin, bool)
            claims.append(Claim(str(arm), str(baseline), str(kind), float(margin) if numeric else margin,
                                str(item.get("measure", "final"))))
    return claims
