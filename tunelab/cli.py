"""`tunelab`: one command for the lab. `tunelab run` tunes (Hydra overrides, as `python run.py`); the
other subcommands are the tools (`python -m tuning.tools.<name>` runs the same code)."""
from __future__ import annotations

import importlib
import sys

# subcommand -> (module with main(argv, prog), one line of help)
COMMANDS = {
    "run": ("tunelab.run", "tune: Hydra overrides (group=option key=value), -m for a grid or sweep"),
    "study": ("tuning.tools.study", "a declared comparison run block by block, and its pre-registered table"),
    "compare": ("tuning.tools.compare.cli", "compare tracked methods: paired CIs, censoring, the methodology score"),
    "export": ("tuning.tools.export", "a run's best kernel as a shared library and a script that calls it"),
    "apply": ("tuning.tools.apply", "apply a (finished or killed) whole-model run's schedules and time the model"),
    "sync": ("tuning.tools.sync", "rebuild or repair a run's MLflow run from its folder"),
    "dataset": ("tuning.tools.dataset", "build, inspect or copy a measurement store (a dataset of timed configs)"),
    "pretrain": ("tuning.tools.pretrain", "train a cost model on measurement stores and register it in MLflow"),
    "value": ("tuning.tools.value", "value-function search: train, improve, schedule without measuring"),
    "rpc-server": ("tuning.hardware.rpc_server", "serve this machine's device to a TVM RPC tracker (hardware/runner=rpc)"),
    "ui": ("tunelab.ui", "serve the MLflow UI on the lab's tracking store"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_line}" for name, (_, help_line) in COMMANDS.items()]
    return ("usage: tunelab COMMAND [ARGS...]\n\ntensor-program autotuning on one harness (TVM, Hydra, MLflow, "
            "Optuna)\n\ncommands:\n" + "\n".join(lines)
            + "\n\n`tunelab COMMAND --help` shows a command's options (`tunelab run --help`: every config group).\n"
              "The MLflow location: `--tracking-uri` in the tools that talk to MLflow, `tracking.uri=` in run; "
              "both default to $MLFLOW_TRACKING_URI, else outputs/mlflow.db.")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        try:
            print(usage())
        except BrokenPipeError:  # `tunelab --help | head`
            pass
        return 0
    if argv[0] == "--version":
        from tunelab import __version__

        print(f"tunelab {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tunelab: unknown command {name!r}; one of: {', '.join(COMMANDS)}\n\n{usage()}", file=sys.stderr)
        return 2
    importlib.import_module(COMMANDS[name][0]).main(rest, prog=f"tunelab {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
