"""The documentation is true to the repository: the README stays a front door (tests/test_readme.py runs
its commands), every relative link resolves, every `docs/<file>.md §<heading>` a file cites exists,
docs/usage.md's group table lists exactly the options conf/ holds, every example that tunes searches
(a second round: some measurement fed back), and nothing speaks of how the work was organised (the
repository describes itself, not its to-do list)."""
from __future__ import annotations

import ast
import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORK_ITEM = r"\b" + "iss" + r"ue('s)? ?[0-9]*\b|d" + r"one[- ]when"  # spelled apart: this file would match


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / line for line in out.splitlines() if (REPO / line).is_file()]


def headings(path: Path) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", path.read_text(), re.M)}


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    assert "tunelab run" in "\n".join(lines) and "import tunelab" in "\n".join(lines)


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for doc in tracked("README.md", "docs/*.md", "docs/**/*.md"):
        text = re.sub(r"```.*?```|`[^`\n]*`|^    [^\n]*$", "", doc.read_text(), flags=re.S | re.M)  # code is not a link
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#", 1)[0]
            if path and not re.match(r"[a-z]+://|mailto:", path) and not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
    assert not broken


def test_every_cited_docs_section_exists():
    missing = []
    for path in tracked("*.py", "*.yaml", "*.md", "Makefile"):
        for doc, section in re.findall(r"docs/([\w/.-]+\.md) §([^;,)\n`\"]+)", path.read_text(errors="replace")):
            cited = section.strip().rstrip(".:")
            known = headings(REPO / "docs" / doc) if (REPO / "docs" / doc).is_file() else set()
            if not cited.startswith("<") and not any(h.startswith(cited) or cited.startswith(h) for h in known):
                missing.append(f"{path.relative_to(REPO)}: docs/{doc} §{section.strip()}")
    assert not missing


def test_nothing_speaks_of_work_items():
    hits = [f"{p.relative_to(REPO)}: {line.strip()}" for p in tracked() if p.suffix not in (".png", ".ipynb", ".jsonl")
            for line in p.read_text(errors="replace").splitlines() if re.search(WORK_ITEM, line, re.I)]
    assert not hits


# ---- docs/usage.md's config groups, against conf/ -------------------------------------------------
NOT_RUN_GROUPS = {
    "hydra/help": "Hydra's own: the text of `tunelab run --help`",
    "hydra/job_logging": "Hydra's own: the lab's log format",
    "study": "studies, read by `tunelab study`, not a run's group (docs/studies.md)",
}


def usage_group_table() -> dict[str, set[str]]:
    """group -> the options docs/usage.md §Config groups lists for it (`a`..`b` spelled out)."""
    text = (REPO / "docs" / "usage.md").read_text()
    table = re.search(r"^## Config groups\n(.*?)(?=^## )", text, re.M | re.S).group(1)
    groups: dict[str, set[str]] = {}
    for group, options in re.findall(r"^\| `([\w/]+)`(?: \(\w+\))? \| ([^|]*) \|", table, re.M):
        names = set(re.findall(r"`(\w+)`", options))
        for m in re.finditer(r"`(\w+?)(\d+)`\.\.`\w+?(\d+)`", options):  # `conv_l1`..`conv_l8`
            names |= {f"{m.group(1)}{i}" for i in range(int(m.group(2)), int(m.group(3)) + 1)}
        groups.setdefault(group, set()).update(names)
    return groups


def conf_groups() -> dict[str, set[str]]:
    conf = REPO / "conf"
    groups: dict[str, set[str]] = {}
    for path in conf.rglob("*.yaml"):
        group = path.parent.relative_to(conf).as_posix()
        if group != "." and group not in NOT_RUN_GROUPS:
            groups.setdefault(group, set()).add(path.stem)
    return groups


def test_usage_lists_every_config_group_and_option():
    documented, real = usage_group_table(), conf_groups()
    assert sorted(documented) == sorted(real), "docs/usage.md §Config groups: groups differ from conf/"
    wrong = {g: {"missing": sorted(real[g] - documented[g]), "not in conf/": sorted(documented[g] - real[g])}
             for g in real if documented[g] != real[g]}
    assert not wrong, f"docs/usage.md §Config groups against conf/<group>/*.yaml: {wrong}"


def test_usage_shows_what_bad_input_prints(tmp_path):
    """The transcript under "Bad input stops before any work" is what the lab prints, as typed."""
    text = (REPO / "docs" / "usage.md").read_text()
    block = re.search(r"^    \$ (tunelab run [^\n]*)\n((?:    [^$\n][^\n]*\n)+)", text, re.M)
    command, shown = block.group(1), [line[4:].rstrip() for line in block.group(2).splitlines()]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TUNELAB_"))}
    done = subprocess.run([str(Path(sys.executable).with_name("tunelab")), *shlex.split(command)[1:],
                           "hardware=synthetic"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    printed = (done.stdout + done.stderr).splitlines()
    assert done.returncode != 0
    assert all(line in printed for line in shown), f"usage.md shows {shown}, the lab printed {printed}"


# ---- every example that tunes searches --------------------------------------------------------------
KERNELS = {"resnet18": 22, "tiny_cnn": 7}  # distinct kernels of the networks an example gives a total budget
SWEEP_SYNTAX = re.compile(r"[(]")  # a sweeper's choice/interval/tag: the sweeper picks the value


def example_runs() -> list[tuple[str, list[str]]]:
    """(where, overrides) of each `tunelab run` / `python run.py` line in a code block of README.md and
    docs/*.md (not docs/results/: records of what ran), and of each `tunelab.tune([...])` there."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        code = "\n".join(block for block in re.findall(r"^```\w*\n(.*?)^```", text, re.M | re.S))
        code += "\n" + "\n".join(line for line in text.splitlines() if line.startswith("    "))
        code = re.sub(r"\\\n\s*", " ", code)
        for line in code.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            for prefix in ("tunelab run ", "python run.py "):
                if line.startswith(prefix):
                    found.append((f"{doc.name}: {line}", shlex.split(line)[len(prefix.split()):]))
        for listed in re.findall(r"tunelab\.tune\((\[[^]]*\])", code):
            found.append((f"{doc.name}: tunelab.tune({listed})", list(ast.literal_eval(listed))))
    return found


def jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs of a command line's overrides: flags and Hydra's own settings dropped, a grid's
    comma lists spelled out, a sweeper's search spaces left to the preset's defaults."""
    axes = []
    for item in overrides:
        item = re.sub(r"<(\w+)>", r"\1", item)  # a placeholder: outputs/runs/<date>/<time>
        key, _, value = item.partition("=")
        if item.startswith("-") or key.startswith(("hydra/", "hydra.")) or SWEEP_SYNTAX.search(value):
            continue
        split = "," in value and not re.search(r"[\[{'\"]", value)
        axes.append([f"{key}={v}" for v in value.split(",")] if split else [item])
    return [list(job) for job in itertools.product(*axes)]


def one_round_only(cfg) -> str | None:
    """The lab's own no-feedback warning for this job's budget (tuning/engine/budget.py), or None."""
    from dataclasses import replace

    from tuning.engine.budget import resolve_budget, with_plan_size
    from tuning.engine.spec import BudgetSpec, ModelSpec

    whole = cfg.model.get("kind") in ("network", "onnx")
    name = cfg.model.get("network") or cfg.model.name
    assert not whole or cfg.budget.trials is None or name in KERNELS, f"add {name}'s number of kernels to KERNELS"
    kernels = cfg.model.get("kernels")  # +model.kernels=[...]: that many of the model's
    tasks = list(range(len(kernels) if whole and kernels else KERNELS.get(name, 2) if whole else 1))
    plan = resolve_budget(BudgetSpec.of(cfg.budget), ModelSpec.of(cfg.model), tasks)
    if len(tasks) > 1:  # the run's own plan size (a single operator's is cut to its space only where smaller)
        plan = with_plan_size(plan, cfg.search.default_plan_size, tasks, hardware=None)
    else:
        plan = replace(plan, plan_size=cfg.budget.plan_size or cfg.search.default_plan_size)
    return plan.no_feedback(tasks)


EXAMPLES = example_runs()


@pytest.mark.parametrize("where,overrides", EXAMPLES, ids=[where[:80] for where, _ in EXAMPLES])
def test_every_example_run_searches(where, overrides):
    import hydra_plugins.tunelab_optuna_sweeper.config  # noqa: F401  (hydra/sweeper=optuna, as a run finds it)
    import tunelab

    for job in jobs(overrides):
        warning = one_round_only(tunelab.compose(job))
        assert warning is None, f"{where}: {job}: {warning}"
