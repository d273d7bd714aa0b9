"""Where a tuned whole model's time goes: each VM call timed, tuned kernels against everything else.

    python experiments/profile_model.py outputs/runs/DAY/TIME [--runs 20]

Compiles the run's model with its exported MetaSchedule database (as the end-to-end check does), at
the run's threads, and runs it `--runs` times under a VM instrument that times every call: the tuned
kernels (the run's tasks), other compiled functions and the VM's builtins (allocations, reshapes,
copies). Prints each call's median per model run, grouped, and the sums against the uninstrumented
latency. The instrument runs Python between calls, long enough for TVM's worker threads to go to
sleep, so each kernel timed here also pays their wake-up: kernel times are upper bounds, and the
builtins' times are the direct reading. One process, one sitting: proportions, not a benchmark.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from tuning.hardware.kernel_context import PREPACKED


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a whole-model run folder with database/")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: must be >= 1")
    if not (args.run / "database" / "database_tuning_record.json").is_file():
        parser.error(f"run: {args.run} has no database/ (a finished whole-model run, or python -m tuning.tools.apply)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from omegaconf import OmegaConf

    from tuning.core.task import is_whole_model
    from tuning.engine.run_folder import load_config
    from tuning.engine.validate import validate

    cfg = load_config(args.run / "config.yaml", "run")
    validate(cfg)
    if not is_whole_model(cfg.model):
        raise SystemExit(f"tunelab: model: {args.run} tunes a single operator; profile a whole-model run")
    threads = (cfg.hardware.get("backend") or cfg.hardware).num_threads  # a replayed run: its backend's
    os.environ["TVM_NUM_THREADS"] = str(threads)  # before TVM's runtime starts
    from hydra.utils import instantiate

    from tuning.hardware.relax_models import profile_calls

    hardware = instantiate(cfg.hardware)
    try:
        model = OmegaConf.to_container(cfg.model, resolve=True)
        tvm_hardware = getattr(hardware, "backend", hardware)  # a replayed run's kernels run on its backend
        device = tvm_hardware.attached().devices[0]  # the run's runner says which device (hardware.runner)
        profile = profile_calls(model, cfg.seed, tvm_hardware.target, str(args.run / "database"), args.runs,
                                tvm_hardware.weight_prepack, device=device)
    finally:
        hardware.close()
    tasks = {t["name"] for t in json.loads((args.run / "tasks.json").read_text())}
    print(report(profile, tasks, threads))


def report(profile: dict, tasks: set, threads: int) -> str:
    medians = {symbol: float(np.median(v)) * 1e3 for symbol, v in profile["calls"].items()}
    kernels = {s: ms for s, ms in medians.items() if s.removesuffix(PREPACKED) in tasks}
    other = {s: ms for s, ms in medians.items() if s.removesuffix(PREPACKED) not in tasks}
    plain, whole = float(np.median(profile["plain"])) * 1e3, float(np.median(profile["whole"])) * 1e3
    counts = profile.get("counts", {})
    lines = [f"{threads} threads, medians over {len(profile['plain'])} runs (ms per model run)",
             f"  uninstrumented latency {plain:8.3f}", f"  instrumented latency   {whole:8.3f}",
             f"  tuned kernels          {sum(kernels.values()):8.3f}  ({len(kernels)} functions)",
             f"  everything else        {sum(other.values()):8.3f}  ({len(other)} functions)",
             f"  instrument overhead    {whole - sum(medians.values()):8.3f}"]
    for title, group in (("calls outside the tuned kernels", other), ("tuned kernels", kernels)):
        lines += ["", f"{title} (ms per model run, calls per model run):"]
        lines += [f"  {s[:60]:60s} {ms:8.3f}  x{counts.get(s, '?')}"
                  for s, ms in sorted(group.items(), key=lambda item: -item[1])]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
