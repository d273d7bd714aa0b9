"""The command-line tools agree on their flags (tuning/config/cli.py): every argument has help,
--help shows defaults, `--tracking-uri` is the one visible MLflow-location flag and defaults to
$MLFLOW_TRACKING_URI, the old spellings still parse, and `prog` names the tool in usage. Parsers only:
no TVM build, no MLflow run."""
from __future__ import annotations

import argparse
import importlib

import pytest

from tuning.config.cli import OLD_TRACKING_FLAGS

# the module whose build_parser(prog) each tool uses -> the name its usage shows by default
TOOLS = {
    "tuning.tools.apply": "python -m tuning.tools.apply",
    "tuning.tools.export": "python -m tuning.tools.export",
    "tuning.tools.sync": "python -m tuning.tools.sync",
    "tuning.tools.dataset": "python -m tuning.tools.dataset",
    "tuning.tools.pretrain": "python -m tuning.tools.pretrain",
    "tuning.tools.compare.cli": "python -m tuning.tools.compare",
    "tuning.tools.value": "python -m tuning.tools.value",
    "tuning.tools.study": "python -m tuning.tools.study",
}
# the commands that name an MLflow store, each with the least its command line holds
MLFLOW_COMMANDS = [
    ("tuning.tools.compare.cli", ["--baseline", "sa"]),
    ("tuning.tools.pretrain", ["--store", "lab.sqlite"]),
    ("tuning.tools.value", ["train", "--store", "lab.sqlite"]),
    ("tuning.tools.value", ["improve", "--model", "models:/v/1", "--store", "lab.sqlite", "--network", "gemm_64"]),
    ("tuning.tools.sync", ["outputs/runs/day/time"]),
]
LOCATION_WORDS = ("uri", "registry")  # --no-mlflow-run, --mlflow-experiment name no location


def parser_of(module: str, prog: str | None = None) -> argparse.ArgumentParser:
    return importlib.import_module(module).build_parser(prog)


def with_subcommands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += with_subcommands(sub)
    return found


def every_parser():
    return [(module, p) for module in TOOLS for p in with_subcommands(parser_of(module))]


def visible_options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings}


def tracking_dest(parser: argparse.ArgumentParser) -> str:
    [action] = [a for a in parser._actions if "--tracking-uri" in a.option_strings]
    return action.dest


def command_parser(module: str, argv: list[str]) -> argparse.ArgumentParser:
    """The parser (or subcommand's parser) that reads `argv`."""
    parser = parser_of(module)
    subs = {p.prog.rsplit(" ", 1)[-1]: p for p in with_subcommands(parser)[1:]}
    return subs.get(argv[0], parser)


@pytest.mark.parametrize("module, parser", every_parser(), ids=lambda x: getattr(x, "prog", None))
def test_every_argument_says_what_it_is(module, parser):
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and action.help.strip(), f"{parser.prog}: {action.option_strings or action.dest}"
        if action.help == argparse.SUPPRESS:  # hidden: only the MLflow location's old spellings
            assert set(action.option_strings) <= set(OLD_TRACKING_FLAGS), action.option_strings


def has_a_default(action: argparse.Action) -> bool:
    """An option a user may leave out whose value then is something (not a flag's False, not nothing)."""
    return bool(action.option_strings) and action.nargs != 0 and not action.required \
        and action.default not in (None, [], argparse.SUPPRESS)


@pytest.mark.parametrize("module, parser", every_parser(), ids=lambda x: getattr(x, "prog", None))
def test_help_shows_defaults_and_the_tracking_uri_alone(module, parser):
    text = parser.format_help()
    assert issubclass(parser.formatter_class, argparse.ArgumentDefaultsHelpFormatter), parser.prog
    formatter = parser.formatter_class(parser.prog)
    for action in filter(has_a_default, parser._actions):
        assert "default" in formatter._get_help_string(action), f"{parser.prog}: {action.option_strings}"
    assert "default" in text or not any(map(has_a_default, parser._actions)), parser.prog
    locations = {o for o in visible_options(parser) if any(word in o for word in LOCATION_WORDS)}
    assert locations <= {"--tracking-uri"}, f"{parser.prog}: {locations}"
    for old in OLD_TRACKING_FLAGS:
        assert old not in text.replace("--tracking-uri", ""), parser.prog
    assert "(default: None)" not in text and "(default: [])" not in text, parser.prog


@pytest.mark.parametrize("module, argv", MLFLOW_COMMANDS, ids=lambda x: x if isinstance(x, str) else x[0])
def test_the_commands_that_talk_to_mlflow_take_tracking_uri_and_the_old_spellings(module, argv):
    parser = parser_of(module)
    assert "--tracking-uri" in visible_options(command_parser(module, argv))
    dest = tracking_dest(command_parser(module, argv))
    for flag in ("--tracking-uri", *OLD_TRACKING_FLAGS):
        args = parser.parse_args([*argv, flag, "postgresql://db/mlflow"])
        assert getattr(args, dest) == "postgresql://db/mlflow", flag
    with pytest.raises(SystemExit):
        parser.parse_args([*argv, "--tracking-uri", " "])


@pytest.mark.parametrize("module, argv", MLFLOW_COMMANDS[:-1], ids=lambda x: x if isinstance(x, str) else x[0])
def test_tracking_uri_defaults_to_MLFLOW_TRACKING_URI_else_the_labs_store(module, argv, monkeypatch, tmp_path):
    dest = tracking_dest(command_parser(module, argv))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert getattr(parser_of(module).parse_args(argv), dest) == "http://tracking.example:5000"
    assert "http://tracking.example" not in command_parser(module, argv).format_help()  # a URI may hold a password
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setenv("TUNELAB_OUTPUTS", str(tmp_path))
    assert getattr(parser_of(module).parse_args(argv), dest) == f"sqlite:///{tmp_path}/mlflow.db"


def test_sync_writes_to_the_runs_own_store_unless_told(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    parser = parser_of("tuning.tools.sync")
    assert parser.parse_args(["outputs/runs/day/time"]).tracking_uri is None  # sync() reads the run's tracking.uri
    assert "default: the run's own tracking.uri" in " ".join(parser.format_help().split())


@pytest.mark.parametrize("module", TOOLS)
def test_usage_names_the_tool_as_it_was_called(module):
    assert parser_of(module).format_usage().startswith(f"usage: {TOOLS[module]} ")
    name = TOOLS[module].rsplit(".", 1)[-1]
    for parser in with_subcommands(parser_of(module, prog=f"tunelab {name}")):
        assert parser.format_usage().startswith(f"usage: tunelab {name}"), parser.format_usage()


@pytest.mark.parametrize("argv", [
    ["build", "--store", "s.sqlite", "--model", "conv_l8", "gemm_64", "hardware=synthetic", "evaluator=adaptive"],
    ["build", "hardware=synthetic", "--store", "s.sqlite", "evaluator=adaptive", "--model", "conv_l8", "gemm_64"],
    ["build", "--model", "conv_l8", "gemm_64", "--configs", "5", "hardware=synthetic", "--store", "s.sqlite",
     "evaluator=adaptive"],
    ["build", "--store", "s.sqlite", "--model", "conv_l8", "gemm_64", "--", "hardware=synthetic", "evaluator=adaptive"],
])
def test_dataset_build_takes_hydra_overrides_anywhere_in_the_order_typed(argv):
    from tuning.tools.dataset import parse_args

    args = parse_args(argv)
    assert args.model == ["conv_l8", "gemm_64"]
    assert args.overrides == ["hardware=synthetic", "evaluator=adaptive"]


@pytest.mark.parametrize("argv, message", [
    (["build", "--store", "s.sqlite", "--model", "hardware=synthetic"], "--model: expected model names"),
    (["build", "--store", "s.sqlite", "--model", "gemm_64", "--bogus", "x=1"], "unrecognized arguments: --bogus"),
    (["stats", "--store", "s.sqlite", "x=1"], "unrecognized arguments: x=1"),
])
def test_dataset_refuses_what_is_neither_an_option_nor_an_override(argv, message, capsys):
    from tuning.tools.dataset import parse_args

    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_child_json_reads_the_last_line_and_names_a_failed_child(tmp_path):
    import sys

    from tuning.config.cli import child_json

    printed = "print('progress'); print('{\"seconds\": 1.5}')"
    assert child_json([sys.executable, "-c", printed], "unused", cwd=tmp_path) == {"seconds": 1.5}
    failing = "import sys; print('x' * 5000 + 'the cause', file=sys.stderr); sys.exit(3)"
    with pytest.raises(SystemExit) as stopped:
        child_json([sys.executable, "-c", failing], "tunelab: the default process failed")
    text = str(stopped.value)
    assert text.startswith("tunelab: the default process failed:\n") and text.endswith("the cause\n")
    assert len(text) < 3100  # the end of the child's stderr, not all of it
