"""Run a study block by block, and print its pre-registered table (docs/studies.md).

    python -m tuning.tools.study plan NAME                 # the study as declared, and its plan's hash
    python -m tuning.tools.study run NAME [--blocks N] [--hours H] [--tracking-uri URI | --no-tracking]
    python -m tuning.tools.study table NAME
    python -m tuning.tools.study log NAME [--tracking-uri URI]   # block files not yet in MLflow
    python -m tuning.tools.study claims [--write | --check]       # the lab's claims table, from the block files

NAME is conf/study/NAME.yaml, or study/NAME.yaml in a directory of TUNELAB_CONF_DIRS. `run` takes the
blocks no host has finished, each start to finish on this machine; a killed block is run again from its
start by the next `run`. `table` reads the block files under the study's `results` folder. Each block
is logged to MLflow as it is made (experiment `study-NAME`, a run per block file); `log` logs the block
files other hosts made. `claims` makes the lab's claims table from every reported study's block files
(tuning/study/claims_table.py): printed, written into README.md and docs/claims.md, or checked against them.
"""
from __future__ import annotations

import argparse
import json
import sys

from tuning.config import ConfigError
from tuning.config.cli import add_command, add_tracking_uri, new_parser, tunelab_command
from tuning.config.untrusted import without_secrets


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = new_parser("python -m tuning.tools.study", __doc__.split("\n\n")[0], prog)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     help="plan, run, table, log or claims (see each one's --help)")
    plan = add_command(commands, "plan", "the study as declared, and its plan's hash")
    plan.add_argument("name", help="the study: conf/study/NAME.yaml or a TUNELAB_CONF_DIRS directory's")
    run = add_command(commands, "run", "run the blocks no host has finished, each from its start")
    run.add_argument("name", help="the study: conf/study/NAME.yaml or a TUNELAB_CONF_DIRS directory's")
    run.add_argument("--blocks", type=int, default=None, metavar="N", help="at most N blocks this call; default: all")
    run.add_argument("--hours", type=float, default=None, metavar="H",
                     help="start no block the hours left would not hold; default: no limit")
    add_tracking_uri(run, help="the MLflow store each finished block is logged to")
    run.add_argument("--no-tracking", action="store_true", help="log nothing to MLflow (the block files stand alone)")
    table = add_command(commands, "table", "the pre-registered table from the block files made so far")
    table.add_argument("name", help="the study: conf/study/NAME.yaml or a TUNELAB_CONF_DIRS directory's")
    log = add_command(commands, "log", "log the block files not yet in MLflow (those other hosts made)")
    log.add_argument("name", help="the study: conf/study/NAME.yaml or a TUNELAB_CONF_DIRS directory's")
    add_tracking_uri(log, help="the MLflow store the blocks are logged to")
    claims = add_command(commands, "claims", "the lab's claims table from the reported studies' block files")
    how = claims.add_mutually_exclusive_group()
    how.add_argument("--write", action="store_true", help="write it into README.md and docs/claims.md")
    how.add_argument("--check", action="store_true", help="exit 1 where README.md or docs/claims.md differ from it")
    return parser


def main(argv=None, prog: str | None = None) -> None:
    from tuning.study.run import run_study, study_table
    from tuning.study.spec import load_study
    from tuning.study.tracking import experiment_name, log_blocks

    args = build_parser(prog).parse_args(argv)
    if getattr(args, "blocks", None) is not None and args.blocks < 1:
        raise SystemExit("tunelab: --blocks: at least 1")
    if getattr(args, "hours", None) is not None and not args.hours > 0:
        raise SystemExit("tunelab: --hours: a positive number")
    try:
        if args.command == "claims":
            claims(args)
            return
        spec = load_study(args.name)
        if args.command == "plan":
            print(json.dumps({"study": spec.name, "plan_hash": spec.plan_hash, **spec.plan()}, indent=2))
        elif args.command == "run":
            say = lambda line: print(line, file=sys.stderr)  # noqa: E731
            log = None if args.no_tracking else lambda _: log_blocks(spec, args.tracking_uri, say)
            made = run_study(spec, args.blocks, args.hours, say=say, on_block=log)
            print(f"{len(made)} block(s) made; table: {tunelab_command('study', 'table', spec.name)}")
        elif args.command == "log":
            count = log_blocks(spec, args.tracking_uri, say=lambda line: print(line, file=sys.stderr))
            print(f"{count} block(s) logged to {without_secrets(args.tracking_uri)} (experiment "
                  f"{experiment_name(spec)})")
        else:
            print(study_table(spec))
    except ConfigError as error:
        raise SystemExit(f"tunelab: {error}") from None


def claims(args) -> None:
    from tuning.study import claims_table

    root = claims_table.checkout_root()
    table = claims_table.claims_markdown(root)
    if args.check:
        problems = claims_table.stale(root, table)
        if problems:
            raise SystemExit("tunelab: " + "\n  ".join(problems))
        print(f"the claims table in {' and '.join(claims_table.TARGETS)} is the block files'")
    elif args.write:
        claims_table.write(root, table)
        print(f"the claims table written into {' and '.join(claims_table.TARGETS)}")
    else:
        print(table, end="")


if __name__ == "__main__":
    main()
