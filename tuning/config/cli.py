"""What the command-line tools share: one help layout, one flag for the MLflow location, one way
to read a child process's result (`child_json`: experiments time each setting in a fresh process), and
one way to print a next step (`tunelab_command`: a line that runs as printed).

    parser = new_parser("python -m tuning.tools.sync", description, prog)  # prog: a dispatcher's name for it
    add_tracking_uri(parser, help="the MLflow store the run is written to")
    print(f"continue with: {tunelab_command('run', f'resume={out_dir}')}")

Every tool builds its parser with `build_parser(prog=None)` (tests/test_tool_flags.py checks them all).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tuning.config import storage

OLD_TRACKING_FLAGS = ("--uri", "--registry")  # the spellings before --tracking-uri: still read, not shown


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Descriptions laid out as written, and each option's default after its help, except where there
    is nothing to show (a flag, a required option, no default) or the help already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.nargs == 0 or action.required or action.default is None or action.default == [] \
                or "default" in text:
            return text
        return super()._get_help_string(action)


def tunelab_command(*args: str) -> str:
    """`tunelab ARGS` as a line that runs as printed on this host, with this installation: `tunelab`
    where the one on PATH is this environment's, else this environment's own script by its path (a
    checkout whose venv is not active), else `PYTHON -m tunelab` with the running interpreter."""
    return shlex.join([*tunelab_program(), *args])


def tunelab_program() -> list[str]:
    """The words that start the `tunelab` of the running environment (see tunelab_command)."""
    here = Path(sys.executable).absolute().parent
    on_path = shutil.which("tunelab")
    if on_path and _environment_of(Path(on_path)) == here:
        return ["tunelab"]
    beside = here / "tunelab"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    return [sys.executable, "-m", "tunelab"]


def _environment_of(script: Path) -> Path:
    """The folder of the interpreter a console script runs (its #! line), else the script's own folder."""
    try:
        with script.open("rb") as file:
            first = file.readline(512).decode(errors="replace")
    except OSError:
        return script.absolute().parent
    words = first[2:].split() if first.startswith("#!") else []
    return Path(words[0]).absolute().parent if words and words[0].startswith("/") else script.absolute().parent


def child_json(command: list[str], failure: str, **run) -> dict:
    """The JSON object on the last line a child process printed; SystemExit naming `failure`, with the
    end of the child's stderr, when it exits non-zero. `run`: subprocess.run's cwd, env."""
    done = subprocess.run(command, capture_output=True, text=True, **run)
    if done.returncode != 0:
        raise SystemExit(f"{failure}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def new_parser(default_prog: str, description: str, prog: str | None = None) -> argparse.ArgumentParser:
    """A tool's parser; `prog` is the name a dispatcher shows in usage (`tunelab compare`)."""
    return argparse.ArgumentParser(prog=prog or default_prog, description=description, formatter_class=HelpFormatter)


def add_command(commands, name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand's parser, in the same layout (argparse does not hand the formatter down)."""
    return commands.add_parser(name, help=help, description=description or help, formatter_class=HelpFormatter)


def add_tracking_uri(parser, help: str, dest: str = "tracking_uri", default_text: str | None = None) -> None:
    """--tracking-uri URI: MLflow's tracking and model-registry location. Its default is tuning/config/storage.py's
    (an explicit URI > $MLFLOW_TRACKING_URI > the lab's store), resolved now; with `default_text` the tool
    resolves the default itself (the value is None when not given) and the help says what it is."""
    default = None if default_text else storage.mlflow_uri()
    parser.add_argument("--tracking-uri", dest=dest, default=default, type=_uri, metavar="URI",
                        help=f"{help}; default: {default_text or _lab_default()}".replace("%", "%%"))
    for old in OLD_TRACKING_FLAGS:
        parser.add_argument(old, dest=dest, default=argparse.SUPPRESS, type=_uri, help=argparse.SUPPRESS)


def _lab_default() -> str:
    """The default as --help shows it: the variable's value is not printed (a URI may hold a password)."""
    if os.environ.get(storage.MLFLOW_ENV):
        return f"${storage.MLFLOW_ENV} (set here)"
    return f"${storage.MLFLOW_ENV} if set, else the lab's store {storage.mlflow_uri()}"


def _uri(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a URI, e.g. sqlite:////abs/path/mlflow.db or http://host:5000")
    return text
