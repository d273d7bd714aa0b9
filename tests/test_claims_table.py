"""The lab's claims table (tuning/study/claims_table.py): made from the committed block files only, the
same on any machine, and what README.md and docs/claims.md hold."""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from tuning.config import ConfigError
from tuning.study import claims_table
from tuning.study.spec import load_study, study_spec


def test_the_committed_claims_table_is_what_the_committed_block_files_give():
    root = claims_table.checkout_root()
    assert claims_table.stale(root, claims_table.claims_markdown(root)) == []


def test_every_reported_study_has_its_page_and_a_row_per_claim():
    root = claims_table.checkout_root()
    studies = claims_table.reported_studies(root)
    assert studies, "no study reports to the claims table"
    table = claims_table.claims_markdown(root)
    for spec in studies:
        assert spec.report is not None and (root / spec.report.page).is_file(), spec.report
        assert table.count(f"study `{spec.name}`") == len(spec.analysis.claims)


def test_a_report_changes_no_plan_hash():
    spec = load_study("gemm_1024_peers")
    made = {json.loads(p.read_text())["plan_hash"]
            for p in (claims_table.checkout_root() / spec.results / "blocks").glob("*.json")}
    assert spec.report is not None and made == {spec.plan_hash}


def test_the_table_goes_between_the_markers_and_nowhere_else():
    text = f"before\n{claims_table.BEGIN}\nold rows\n{claims_table.END}\nafter\n"
    placed = claims_table.placed(text, "| a | [p](docs/results/x.md) |\n", relative_to_docs=False)
    assert placed == f"before\n{claims_table.BEGIN}\n\n| a | [p](docs/results/x.md) |\n\n{claims_table.END}\nafter\n"
    assert "](results/x.md)" in claims_table.placed(text, "| a | [p](docs/results/x.md) |\n", relative_to_docs=True)
    with pytest.raises(ValueError, match="no '<!-- the claims table"):
        claims_table.placed("no markers here\n", "| a |\n", relative_to_docs=False)


def test_a_stale_file_is_named(tmp_path):
    for target in claims_table.TARGETS:
        (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / target).write_text(f"{claims_table.BEGIN}\n\n| old |\n\n{claims_table.END}\n")
    assert claims_table.stale(tmp_path, "| old |\n") == []
    assert [line.split(":")[0] for line in claims_table.stale(tmp_path, "| new |\n")] == list(claims_table.TARGETS)


@pytest.mark.parametrize("report, key", [
    ({"says": []}, "study.report.says"),
    ({"says": ["one", "two"]}, "study.report.says"),
    ({"page": "/etc/passwd.md", "says": ["one"]}, "study.report.page"),
    ({"page": "docs/../../x.md", "says": ["one"]}, "study.report.page"),
    ({"says": ["one"], "colour": 1}, "study.report.colour"),
])
def test_a_bad_report_is_refused_naming_its_key(report, key):
    study = {"common": ["hardware=synthetic"], "arms": {"a": ["search=sa"], "b": ["search=random"]},
             "tasks": ["gemm_64"], "seeds": 3, "budget": {"trials": 16, "plan_size": 8},
             "analysis": {"claims": [{"arm": "a", "baseline": "b", "kind": "difference"}], "min_blocks": 2},
             "report": report}
    with pytest.raises(ConfigError, match=rf"(?m)^\s*{key}"):
        study_spec("bad", OmegaConf.create(study))
