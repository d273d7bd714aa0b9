"""AdaTune's ablation (Li et al. 2020, "AdaTune: adaptive tensor program compilation made efficient",
NeurIPS, §5.3) from the runs of `+experiment=adatune_ablation[_reduced]`: a preset of
`python -m tuning.tools.compare` (docs/compare.md), then AdaTune's own question, the adaptive evaluator
against the deterministic one.

    python experiments/adatune_table.py                                       # the latest ablation
    python experiments/adatune_table.py --experiment adatune_ablation_reduced
    python experiments/adatune_table.py --parent <multirun parent run id> --fraction 1.0

Methods are (cost_model, search, evaluator) under the paper's row names: XGB+SA+DE (AutoTVM's
tuner, the baseline), RFEI+SA+DE (cost_model=rf), RFEI+CSA+DE (search=csa) and RFEI+CSA+AE
(evaluator=adaptive: AdaTune). Besides the tool's curves, ratios, time to the target (95% of the
best throughput known, `--fraction`) and score, the final metrics run/run_s (seconds spent running
kernels: what the adaptive evaluator cuts) and run/tuning_wall_s are compared paired by seed.
Then each adaptive row is compared with the same scheme under DE, the paper's Figure 9. Every
statistic is the tool's.
"""
from __future__ import annotations

import os

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

from tuning.tools import compare  # noqa: E402
from tuning.tools.compare.ablation import run_preset  # noqa: E402

ROWS = {"xgb+sa+adatune_de": "XGB+SA+DE", "rf+sa+adatune_de": "RFEI+SA+DE", "rf+csa+adatune_de": "RFEI+CSA+DE",
        "rf+csa+adaptive": "RFEI+CSA+AE", "rf+csa+adaptive_code": "RFEI+CSA+AE code", "rf+csa+fixed": "RFEI+CSA+fixed",
        "xgb+sa+adaptive": "XGB+SA+AE", "xgb+sa+fixed": "XGB+SA+fixed"}
BASELINE = "XGB+SA+DE"
METRICS = ("run/run_s", "run/tuning_wall_s")
PAPER = ("the paper: 2.5x less measurement time with the adaptive evaluator (Figure 9); AdaTune 1.3-3.9x faster "
         "to the same quality than AutoTVM (§5.1). The goal tracked here: <= 0.4x the measurement seconds at "
         "<= 2% loss in final latency.")
ARGS = ["--method-by", "cost_model,search,evaluator", "--baseline", BASELINE,
        *(arg for metric in METRICS for arg in ("--metric", metric))]


def against_deterministic(result) -> list[str]:
    """Each row with an adaptive evaluator against the same scheme under DE: the same tool, the DE
    twin as the baseline, on those two rows' runs."""
    lines = []
    methods = sorted({c.method for c in result.curves})
    for method in methods:
        scheme, _, evaluator = method.rpartition("+")
        twin = f"{scheme}+DE"
        if not evaluator.startswith("AE") or twin not in methods:
            continue
        pair = compare.compare([c for c in result.curves if c.method in (method, twin)], result.truths, twin,
                               result.budgets, result.fraction,
                               run_metrics={k: v for k, v in result.run_metrics.items() if k[0] in (method, twin)},
                               metric_keys=METRICS)
        lines += [f"{method} vs {twin}:"] + [f"  {line}" for line in compare.verdict_lines(pair)]
    return lines


def main(argv=None) -> None:
    result = run_preset(__doc__, "adatune_ablation", ARGS, ROWS, argv)
    print("\n".join(["Adaptive against deterministic evaluation:", *against_deterministic(result), PAPER]))


if __name__ == "__main__":
    main()
