"""Value-function search (the fifth seed paper: Steiner, Cummins, He, Leather, "Value function based
performance optimization of deep learning workloads"): learn once from measured schedules, then
schedule without measuring.

    encoding.py   a schedule as a sequence of decisions; a state (prefix) as numbers
    net.py        V: an LSTM over the state's rows, the sum of its per-step outputs; training targets
                  V(s) = the best measured completion of s
    beam.py       greedy (Alg. 1) and beam search over V
    tuning/tools/value.py          python -m tuning.tools.value train ...: V trained on measurement stores,
                                   registered in MLflow; value_improve.py its improvement loop (Alg. 2)
    tuning/search/value.py   search=value, which proposes V's best completions

docs/methods.md §Value function maps the paper's Halide actions to MetaSchedule's decisions.
"""
