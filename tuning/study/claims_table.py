"""The lab's claims table, made from the studies' block files only.

    tunelab study claims             # print it
    tunelab study claims --write     # put it into README.md and docs/claims.md, between their marker lines
    tunelab study claims --check     # exit 1 where those files do not hold what the block files give

Every study of the lab (conf/study/NAME.yaml) with a `report` key gives a row per confirmatory claim:
what the claim says (report.says), what its verdict is about (each task with its space, the budget,
the blocks in of those planned, the host kinds that made them), the ratio with its interval and the
verdict at the look the blocks reach, and the dated page that discusses it (report.page). Nothing else
enters: no campaign-era number and no cell written by hand. The block files read are the checkout's
(each study's `results` folder, relative to the checkout), so the table is the same on any machine.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from tuning.config import ConfigError
from tuning.config.conf_dir import CONF_DIR
from tuning.study.analysis import MEASURE_WORDS, Row
from tuning.study.files import BlockFile
from tuning.study.run import Look, host_kinds, look, tasks_and_spaces
from tuning.study.spec import StudySpec, load_study

BEGIN = "<!-- the claims table: made by `tunelab study claims --write` from the studies' block files; not edited by hand -->"
END = "<!-- end of the claims table -->"
TARGETS = ("README.md", "docs/claims.md")  # the files that carry the table, relative to the checkout


def checkout_root() -> Path:
    """The checkout the lab runs from (its conf/ beside README.md and docs/), else a ConfigError."""
    root = CONF_DIR.parent
    if not all((root / target).is_file() for target in TARGETS):
        raise ConfigError(f"study claims: {root} is not a checkout of the lab (no {' or '.join(TARGETS)}); "
                          "the claims table is made in one")
    return root


def reported_studies(root: Path) -> list[StudySpec]:
    """The lab's studies with a report, in name order, each reading its block files under `root`."""
    studies = []
    for path in sorted((root / "conf" / "study").glob("*.yaml")):
        spec = load_study(path.stem)
        if spec.report is not None:
            results = spec.results if spec.results.is_absolute() else root / spec.results
            studies.append(dataclasses.replace(spec, results=results))
    return studies


def claims_markdown(root: Path) -> str:
    """The table, with the line saying how it was made."""
    lines = ["| claim | verdict | ratio [95% interval] | what it is about | page |", "|---|---|---|---|---|"]
    for spec in reported_studies(root):
        seen = look(spec)
        assert spec.report is not None
        for row, says in zip(seen.table.claims, spec.report.says):
            lines.append(f"| {says} ({_claim(row)}; study `{spec.name}`) | {_verdict(row, seen)} | {_ratio(row)} | "
                         f"{_about(spec, seen.files)} | {_page(spec)} |")
    lines += ["", "Each row is one pre-registered claim of a study (docs/studies.md): a ratio is the arm's "
              "adjudicated final latency over its baseline's, block by block (below 1: the arm's kernels "
              "are faster), or where the row says so its measurements or tuning seconds to the block's target "
              "(the median ratio, censored where an arm never reached it), with its interval at the look the "
              "blocks reach; a verdict is withheld until the study's min_blocks are in. Made from the "
              "committed block files by `tunelab study claims`."]
    return "\n".join(lines) + "\n"


def _claim(row: Row) -> str:
    claim = row.claim
    kind = "difference" if claim.kind == "difference" else f"equivalence within {claim.margin:g}"
    return f"{claim.arm} / {claim.baseline}{MEASURE_WORDS[claim.measure]}, {kind}"


def _verdict(row: Row, seen: Look) -> str:
    table = seen.table
    if row.withheld:
        return f"withheld ({table.n_blocks} of {table.plan.min_blocks} blocks needed)"
    look_of = "final look" if table.look == "final" else f"{table.look} look, alpha {table.look_alpha:.4g}"
    return f"{row.verdict} ({look_of})"


def _ratio(row: Row) -> str:
    estimate = row.estimate
    if row.withheld or estimate is None:
        return "-"
    return f"{estimate.ratio:.3f} [{estimate.low:.3f}, {estimate.high:.3f}]"


def _about(spec: StudySpec, files: list[BlockFile]) -> str:
    hosts = "; ".join(f"{kind} x{n}" for kind, n in host_kinds(files).items()) or "none yet"
    return (f"{tasks_and_spaces(spec, files)}; {spec.trials} measurements an arm; {len(files)} of "
            f"{len(spec.blocks)} blocks; hosts {hosts}")


def _page(spec: StudySpec) -> str:
    assert spec.report is not None
    page = spec.report.page
    return "-" if page is None else f"[{Path(page).stem[:10]}]({page})"


def placed(text: str, table: str, relative_to_docs: bool) -> str:
    """`text` with the part between its marker lines replaced by `table` (links made relative to docs/
    where the file is there); a ValueError where the markers are missing or out of order."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no '{BEGIN}' ... '{END}' pair")
    if relative_to_docs:
        table = table.replace("](docs/", "](")
    return text[:start + len(BEGIN)] + "\n\n" + table + "\n" + text[end:]


def stale(root: Path, table: str) -> list[str]:
    """The target files whose table is not `table` (each named, with why)."""
    out = []
    for target in TARGETS:
        text = (root / target).read_text()
        try:
            if placed(text, table, target.startswith("docs/")) != text:
                out.append(f"{target}: its claims table differs from the block files' (tunelab study claims --write)")
        except ValueError as error:
            out.append(f"{target}: {error}")
    return out


def write(root: Path, table: str) -> None:
    for target in TARGETS:
        path = root / target
        path.write_text(placed(path.read_text(), table, target.startswith("docs/")))
