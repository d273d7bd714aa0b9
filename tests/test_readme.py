"""README.md is the lab's front door and its commands work as typed.

Every command README shows in a fenced code block (a shell line starting with `tunelab `, joined over
`\\` continuations, and each ```python snippet) is either run here as typed, `tunelab run` with
`hardware=synthetic` appended where the command does not name a hardware, or listed below as skipped
with the reason; a command README gains that is neither fails `test_every_readme_command_is_run_or_skipped`
until it is put in one list. The runs share one folder (their own outputs/, MLflow store and study
results), in README's order: `tunelab compare` reads the grid run before it. About 60 s of CPU.

README also lists every `tunelab` subcommand, says how to activate the checkout's environment, keeps
its claims table at one line a row with a dated page each, and leaves the dated readings to
docs/results/README.md."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TUNELAB = Path(sys.executable).with_name("tunelab")
MAX_LINES = 200
NO_FEEDBACK = "no measurement is fed back"  # tuning/engine/budget.py's warning: one round, nothing learned

GRID = "tunelab run -m search=random,sa model=gemm_512 seed=0,1,2"
STUDY_RUN = "tunelab study run synthetic_demo --blocks 2"

# command as README types it -> the command it needs run first (in this module's folder), or None
RUN = {
    "tunelab --help": None,
    "tunelab run hardware=synthetic model=gemm_64 budget.trials=64 budget.plan_size=16": None,
    "tunelab run": None,
    "tunelab run model=conv_l8 search=ppo sampler=kmeans": None,
    "tunelab run evaluator=adaptive cost_model=rf search=csa": None,
    GRID: None,
    "tunelab compare --experiment tunelab --baseline sa": GRID,
    "tunelab run --help": None,
    "tunelab study plan synthetic_demo": None,
    STUDY_RUN: None,
    "tunelab study table synthetic_demo": STUDY_RUN,
    "import tunelab\n"
    "o = tunelab.tune(['hardware=synthetic', 'model=gemm_64', 'budget.trials=64', 'budget.plan_size=16'])\n"
    "print(o.best)": None,
}

SKIPPED = {
    "tunelab run model=resnet18":
        "a whole network: its kernels are extracted by real TVM and the model is timed against torch (minutes)",
    "tunelab run resume=outputs/runs/<date>/<time>":
        "names a run folder of the reader's (tests/test_faults.py resumes killed runs)",
    "tunelab export outputs/runs/<date>/<time>":
        "names a run folder of the reader's, and builds its kernel with real TVM",
    "tunelab run hardware/runner=rpc hardware.runner.key=board":
        "needs a TVM RPC tracker with servers under the key `board` (tests/test_rpc.py starts its own)",
    "tunelab run -m hydra/launcher=ray storage=cluster search=sa,ppo seed=0,1":
        "needs a Ray cluster, PostgreSQL and an MLflow server (make cluster-demo; tests/test_cluster.py)",
    "tunelab dataset gpu-batch export --preset chameleon --out packs hardware.arch=sm_90":
        "compiles CUDA kernels with nvcc and real TVM (minutes; tests/test_cuda_pack.py)",
    "tunelab ui":
        "starts a server that runs until stopped (tests/test_mlflow_ui.py)",
}


# ---- README's commands ---------------------------------------------------------------------------
def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```\s*$", text, re.M | re.S)]


def without_comment(line: str) -> str:
    """A shell line without its trailing `# ...` comment (a '#' after whitespace)."""
    return re.sub(r"(^|\s)#.*$", "", line).strip()


def python_code(snippet: str) -> str:
    return "\n".join(line for line in (without_comment(raw) for raw in snippet.splitlines()) if line)


def readme_commands(text: str) -> list[str]:
    found = []
    for language, body in fenced_blocks(text):
        if language in ("sh", "bash", "shell", "console"):
            for line in re.sub(r"\\\n\s*", " ", body).splitlines():
                command = " ".join(without_comment(line).split())
                if command.startswith("tunelab ") or command == "tunelab":
                    found.append(command)
        elif language == "python":
            found.append(python_code(body))
    return found


COMMANDS = readme_commands(README.read_text())


# ---- running them ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """One folder for every run (cwd and TUNELAB_OUTPUTS: its own MLflow store), and what has run there."""
    folder = tmp_path_factory.mktemp("readme")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TUNELAB_"))}
    env.update(TUNELAB_OUTPUTS=str(folder / "outputs"), OMP_NUM_THREADS="1")
    return {"folder": folder, "env": env, "ran": {}}


def argv(command: str) -> list[str]:
    if "\n" in command or command.startswith("import "):
        return [sys.executable, "-c", command]
    words = shlex.split(command)
    words[0] = str(TUNELAB)
    if words[1:2] == ["run"] and "--help" not in words and not any(w.startswith("hardware=") for w in words):
        words.append("hardware=synthetic")
    return words


def run_once(workspace, command: str) -> subprocess.CompletedProcess:
    if command not in workspace["ran"]:
        if RUN.get(command):
            run_once(workspace, RUN[command])
        workspace["ran"][command] = subprocess.run(argv(command), cwd=workspace["folder"], env=workspace["env"],
                                                   capture_output=True, text=True, timeout=600)
    return workspace["ran"][command]


@pytest.mark.parametrize("command", COMMANDS, ids=[c[:60] if "\n" not in c else "python snippet" for c in COMMANDS])
def test_readme_command(workspace, command):
    if command in SKIPPED:
        pytest.skip(SKIPPED[command])
    assert command in RUN, f"README's {command!r} is neither run nor skipped here: add it to RUN or SKIPPED"
    done = run_once(workspace, command)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{command}\n{output[-3000:]}"
    assert NO_FEEDBACK not in output, f"{command} runs one round with no feedback:\n{output[-2000:]}"
    if command.startswith("tunelab run") and "--help" not in command or "tunelab.tune(" in command:
        assert re.search(r"\] best [\d.]+ us", output), output[-2000:]
    if command == "tunelab --help":
        assert all(f"  {name} " in done.stdout for name in subcommands())


def test_every_readme_command_is_run_or_skipped():
    assert COMMANDS, "README shows no command in a fenced block"
    unlisted = [c for c in COMMANDS if c not in RUN and c not in SKIPPED]
    assert not unlisted, f"README commands neither run nor skipped here: {unlisted}"
    gone = [c for c in [*RUN, *SKIPPED] if c not in COMMANDS]
    assert not gone, f"listed here, no longer in README: {gone}"
    assert not set(RUN) & set(SKIPPED)


def test_readme_code_is_fenced():
    """An indented block would hide its commands from the runs above."""
    text = re.sub(r"^```.*?^```\s*$", "", README.read_text(), flags=re.M | re.S)
    indented = [line for line in text.splitlines() if line.startswith("    ") and not line.lstrip().startswith(("-", "|"))]
    assert not indented, indented[:5]


# ---- a front door ------------------------------------------------------------------------------------
def subcommands() -> list[str]:
    from tunelab.cli import COMMANDS as TUNELAB_COMMANDS

    return list(TUNELAB_COMMANDS)


def section(text: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README has no '## {heading}'"
    return match.group(1)


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_readme_lists_every_subcommand():
    table = section(README.read_text(), "Subcommands")
    listed = re.findall(r"^\| `tunelab ([\w-]+)`", table, re.M)
    assert sorted(listed) == sorted(subcommands())
    gone = set(re.findall(r"`tunelab ([a-z][\w-]*)", README.read_text())) - set(subcommands())
    assert not gone, f"README names subcommands tunelab does not have: {gone}"


def test_readme_says_how_to_get_the_command():
    text = README.read_text()
    install = section(text, "Install")
    assert ". .venv/bin/activate" in install and "pip install ." in install
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    named = set(re.findall(r"\bmake ([a-z][\w-]*)", text))
    assert named and not named - targets, f"README names make targets the Makefile lacks: {named - targets}"


def test_readme_names_every_config_group():
    groups = section(README.read_text(), "Config groups")
    conf = REPO / "conf"
    run_groups = {p.parent.relative_to(conf).as_posix() for p in conf.rglob("*.yaml")} - {"."}
    run_groups = {g for g in run_groups if not g.startswith(("hydra", "study", "experiment/"))}
    missing = [g for g in sorted(run_groups) if f"`{g}`" not in groups]
    assert not missing, f"README's Config groups lacks {missing}"


def test_claims_table_is_one_line_a_row_with_its_page():
    text = README.read_text()
    rows = [line for line in section(text, "The seed papers' claims, re-tested").splitlines()
            if line.startswith("| ") and not line.startswith("| claim")]
    assert rows  # made from the studies' block files (tests/test_claims_table.py compares it with them)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 5, row
        claim, verdict, number, about, page = cells
        assert re.search(r"\d\.\d+x? \[\d", number) or (number == "-" and verdict.startswith("withheld")), row
        assert "measurements an arm" in about and "blocks" in about, row
        assert re.fullmatch(r"\[[^]]+\]\(docs/results/\d{4}-\d\d-\d\d-[\w.-]+\.md\)", page), row
        assert (REPO / page.split("(", 1)[1].rstrip(")")).is_file(), row
    assert "docs/studies.md" in section(text, "The seed papers' claims, re-tested")


def test_dated_readings_live_in_the_results_index():
    """Outside the claims table README links no dated page: the readings are indexed by topic there."""
    text = README.read_text()
    claims = section(text, "The seed papers' claims, re-tested")
    elsewhere = text.replace(claims, "")
    assert not re.findall(r"\]\(docs/results/\d{4}-", elsewhere)
    assert "docs/results/README.md" in elsewhere
    index = (REPO / "docs" / "results" / "README.md").read_text()
    topics = section(index, "By topic")
    unindexed = [p.name for p in (REPO / "docs" / "results").glob("20*.md") if f"({p.name})" not in topics]
    assert not unindexed, f"dated pages missing from docs/results/README.md §By topic: {unindexed}"


def test_roadmap_carries_no_counts_of_runs():
    roadmap = section(README.read_text(), "Roadmap")
    assert not re.search(r"\b\d+ of \d+\b|\bso far\b", roadmap), roadmap
