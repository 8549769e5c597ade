"""Every command line behaves alike (contract.cli): `--help` shows each default, each flag parses
spelled `--a_b` and `--a-b`, a mistyped flag names the nearest one, a usage error is one `error:`
line and exit 2, and a command's `--help` does without Grain, JAX and (the audit's) Apache Beam."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from contract import cli
from contract.rundir import RunDir

# (the module whose main() the command runs, the arguments before --help)
COMMANDS = [
    ("trainer.main", []),
    ("trainer.compile", []),
    ("trainer.downstream.__main__", []),
    ("trainer.convert.__main__", []),
    ("trainer.convert.__main__", ["to-hf"]),
    ("compare.cli", []),
    ("lessons.cli", []),
    ("audit.__main__", []),
    ("pipelines.tokenize", []),
    ("pipelines.mixture.__main__", []),
    ("pipelines.mixture.__main__", ["from-olmo-mix"]),
    ("pipelines.downstream_tasks", []),
    ("pipelines.leakage.index", []),
]


def one_spaced(text: str) -> str:
    return " ".join(text.split())


def help_of(module: str, before: list[str], monkeypatch, capsys) -> tuple[cli.Parser, str]:
    """(the parser that printed the help, the help text) of `python -m <module> <before> --help`."""
    printed: list[cli.Parser] = []
    original = cli.Parser.print_help

    def print_help(self, file=None):
        printed.append(self)
        original(self, file)

    monkeypatch.setattr(cli.Parser, "print_help", print_help)
    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main([*before, "--help"])
    assert e.value.code == 0
    return printed[-1], capsys.readouterr().out


@pytest.mark.parametrize("module, before", COMMANDS, ids=[" ".join([m, *b]) for m, b in COMMANDS])
def test_every_commands_help_shows_each_default_and_both_spellings_of_each_flag_parse(
    module, before, monkeypatch, capsys
):
    parser, text = help_of(module, before, monkeypatch, capsys)
    assert isinstance(parser, cli.Parser)
    flat = one_spaced(text)
    shown = [a for a in parser._actions if cli.shows_default(a)]
    for action in shown:
        assert one_spaced(f"default: {action.default}") in flat, (action.option_strings, action.default)
    assert "--a_b flag may also be written --a-b" in flat
    for flag in (f for a in parser._actions for f in a.option_strings if f.startswith("--") and f[2:].strip("-_")):
        for other in cli.other_spelling(flag):
            assert parser.canonical([other, f"{other}=1"]) == [flag, f"{flag}=1"], other


def test_both_spellings_reach_the_same_setting_and_a_typo_names_the_nearest_flag(capsys):
    from audit.__main__ import parse_args as audit_args
    from compare.cli import parse_args as compare_args
    from trainer.main import parse_args as trainer_args

    assert trainer_args(["--run-dir", "r1"]).run_dir == trainer_args(["--run_dir=r1"]).run_dir == RunDir.resolved("r1")
    assert compare_args(["a", "b", "--out", "o", "--after-tokens", "5"]).after_tokens == 5.0
    cfg = audit_args(["--data", "m.json", "--out", "o", "--mixture_tolerance", "0.2", "--brute-force-limit=7"])
    assert (cfg.mixture.tolerance, cfg.brute_force_limit) == (0.2, 7)
    with pytest.raises(SystemExit) as e:
        trainer_args(["--run_dri", "r"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error: ") and "\n" not in err
    assert "did you mean --run_dir?" in err
    with pytest.raises(SystemExit) as e:
        compare_args(["a", "b", "--out", "o", "--tolerence", "0.1"])
    assert e.value.code == 2 and "did you mean --tolerance?" in capsys.readouterr().err


def test_a_value_out_of_range_is_one_error_line_naming_the_flag(capsys):
    from compare.cli import parse_args as compare_args

    for bad in ("nan", "-1", "inf"):
        with pytest.raises(SystemExit) as e:
            compare_args(["a", "b", "--out", "o", "--tolerance", bad])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and err.startswith("error: argument --tolerance:") and "\n" not in err, err


def test_every_command_resolves_a_run_directory_to_one_value_however_it_is_spelled(tmp_path, monkeypatch, capsys):
    """`~`, a path relative to another working directory and a symlink name one run directory:
    each command turns its run-directory argument into the same contract.RunDir, once, where it
    parses it (the trainer's --run_dir, the audit's --run, compare's run, trainer.downstream's
    --step_dir through RunDir.of_step), and the trainer's start-up, lock, loop and checkpoints take
    that value (tests/trainer/test_main.py runs one)."""
    from audit.__main__ import parse_args as audit_args
    from compare.cli import parse_args as compare_args
    from trainer.main import parse_args as trainer_args

    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    (home / "runs" / "r").mkdir(parents=True)
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(home / "runs")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(elsewhere)
    one = RunDir(home / "runs" / "r")
    spellings = ["~/runs/r", "../home/runs/r", str(tmp_path / "link" / "r"), "../link/r/", "~/runs/../runs/r"]
    for text in spellings:
        assert trainer_args(["--run_dir", text]).run_dir == one, text
        assert audit_args(["--run", text, "--out", "o"]).run == one, text
        assert compare_args([text, "reference", "--out", "o"]).run == one, text
        assert RunDir.of_step(f"{text}/checkpoints/5") == one, text
    assert one.path.is_absolute() and str(trainer_args([]).run_dir) == str(elsewhere / "runs" / "tiny")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")  # one that cannot be resolved: one error line, exit 2
    with pytest.raises(SystemExit) as e:
        trainer_args(["--run_dir", str(tmp_path / "loop" / "r")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error: argument --run_dir:") and "\n" not in err, err


@pytest.mark.parametrize("text", ["gs://bucket/run", "s3://b/r"])
def test_a_remote_run_directory_is_refused_where_the_command_line_is_parsed(tmp_path, monkeypatch, capsys, text):
    """A run directory is a local folder (RunDir: a resolved Path): `--run_dir gs://bucket/run` used
    to train a step into ./gs:/bucket/run, then fail writing its checkpoint (exit 1)."""
    from trainer.main import parse_args as trainer_args

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        trainer_args(["--run_dir", text])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err, err
    assert err.startswith(f"error: argument --run_dir: {text}: a remote location; a run directory is a local folder")
    assert list(tmp_path.iterdir()) == []


# What a command's --help must not import: its work's heavy dependencies. Grain (and the JAX it
# imports) came with every `dataloader` submodule the audit and compare read (the package's
# __init__ and dataloader.order imported it at their tops); Beam is the audit's passes'.
HELP_LEAVES_OUT = [
    ("audit", ("apache_beam", "grain", "jax")),
    ("compare", ("grain", "jax")),
    ("pipelines.tokenize", ("grain", "jax")),
]


@pytest.mark.parametrize("command, heavy", HELP_LEAVES_OUT)
def test_a_commands_help_imports_neither_grain_nor_jax_nor_beam_where_its_work_alone_needs_them(command, heavy):
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{command!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_module({command!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        f"loaded = sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r}))\n"
        "assert not loaded, f'--help imported {loaded}'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-2000:]
    if command == "audit":
        assert "--data_checks" not in proc.stdout and "--data-checks" in proc.stdout


def test_trainer_prints_its_resolved_config_and_lists_its_recipes(capsys):
    import json

    from trainer import main
    from trainer.config.schema import load_config

    assert main.main(["--print-config", "steps=3", "lr=0.5"]) == 0
    printed = json.loads(capsys.readouterr().out)
    want = load_config(main.config_path("tiny"), ["steps=3", "lr=0.5"]).to_dict()
    assert printed == json.loads(json.dumps(want)) and printed["steps"] == 3
    assert main.main(["--list_recipes"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert "tiny" in names and "olmo3-7b-stage1" in names
    assert main.main(["--config", "olmo3-7b-stage1", "--print_config"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "olmo3-7b"
    assert main.main(["--config", "no-such-recipe", "--print_config"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
