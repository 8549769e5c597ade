"""Every command line's parser and its one way out, so that all of olmax's commands behave alike:

    def main(argv: list[str] | None = None) -> int:
        p = cli.Parser("python -m pkg.command", __doc__)
        p.add_argument("--out_dir", default="out", help="where it writes")
        args = p.parse_args(argv)
        return cli.run_main(lambda: body(args))  # Refused → 2, Stopped → 1, one `error:` line

``Parser`` is argparse's, with what argparse leaves out (hand-written here because argparse 3.11
has none of it; 3.14's ``suggest_on_error`` is the second item alone):

* each ``--a_b`` flag is also ``--a-b`` and the other way round (the spelling the command defines
  is the one ``--help`` shows);
* an unknown flag names the nearest known one (``--tolerence: did you mean --tolerance?``);
* ``--help`` shows every default (``(default: X)`` after the flag's help);
* a usage error is one ``error:`` line and exit 2, as a refusal is.

No JAX, no Beam: a command builds its parser before it imports what its work needs, so that
``--help`` and a usage error cost nothing.
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

from contract.errors import STOPPED_BY_VERDICT_COMMAND, run_main
from contract.outputs import REMOTE
from contract.rundir import RunDir

__all__ = [
    "STOPPED_BY_VERDICT_COMMAND",
    "HelpFormatter",
    "Parser",
    "integer",
    "nearest",
    "number",
    "run_dir",
    "run_main",
    "share",
    "shows_default",
]


def shows_default(action: argparse.Action) -> bool:
    """Whether ``--help`` states the action's default: a flag's (or an optional positional's)
    default that says something (not None, False, empty, or suppressed)."""
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):  # argparse's own kinds
        return False
    default = action.default
    if default is None or default is False or default is argparse.SUPPRESS:
        return False
    if isinstance(default, (list, tuple, dict)) and not default:
        return False
    return bool(action.option_strings) or action.nargs in ("?", "*")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The module docstring as written, and ``(default: X)`` after each flag's help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or not shows_default(action):
            return text
        return f"{text} (default: %(default)s)".lstrip()

    def _split_lines(self, text: str, width: int) -> list[str]:
        # argparse wraps with textwrap's defaults, which cut a word longer than the line (a default
        # that is a long path) and break at hyphens: a default is shown whole, on a line of its own
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)


def other_spelling(flag: str) -> list[str]:
    """``--a_b`` → [``--a-b``], ``--a-b`` → [``--a_b``] (a short flag or one without either: [])."""
    if not flag.startswith("--"):
        return []
    name = flag[2:]
    return [f"--{x}" for x in {name.replace("-", "_"), name.replace("_", "-")} if x != name]


def nearest(flag: str, known: Iterable[str]) -> str | None:
    """The known flag closest to a mistyped ``flag`` (``_`` and ``-`` the same), None when none is close."""
    name = flag.split("=", 1)[0]
    by_key = {k.replace("-", "_"): k for k in known if k.startswith("--")}
    found = difflib.get_close_matches(name.replace("-", "_"), list(by_key), n=1, cutoff=0.6)
    return by_key[found[0]] if found else None


class Parser(argparse.ArgumentParser):
    """argparse's parser with olmax's command-line rules (this module's docstring)."""

    def __init__(self, prog: str, description: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        epilog = "Each --a_b flag may also be written --a-b."
        kwargs["epilog"] = f"{kwargs['epilog']}\n\n{epilog}" if kwargs.get("epilog") else epilog
        super().__init__(prog=prog, description=description, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.help is None and shows_default(action):  # a flag without help still shows its default
            action.help = "(default: %(default)s)"
        return action

    def canonical(self, args: Sequence[str]) -> list[str]:
        """``args`` with each flag spelled as the parser defines it (``--a-b=1`` → ``--a_b=1``);
        unknown flags and everything after ``--`` as given."""
        out: list[str] = []
        for i, arg in enumerate(args):
            if arg == "--":
                return out + list(args[i:])
            if isinstance(arg, str) and arg.startswith("--"):
                name, eq, value = arg.partition("=")
                if name not in self._option_string_actions:
                    name = next((x for x in other_spelling(name) if x in self._option_string_actions), name)
                arg = name + eq + value
            out.append(arg)
        return out

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        return super().parse_known_args(self.canonical(sys.argv[1:] if args is None else list(args)), namespace)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(self.unrecognized(extra))
        return parsed

    def unrecognized(self, extra: Sequence[str]) -> str:
        """argparse's message, with the nearest known flag of each unknown one."""
        hints = []
        for arg in extra:
            guess = nearest(arg, self._option_string_actions) if arg.startswith("--") else None
            if guess is not None:
                hints.append(f"{arg.split('=', 1)[0]}: did you mean {guess}?")
        return f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else "")

    def error(self, message: str) -> NoReturn:
        """One ``error:`` line naming ``--help``, exit 2 (argparse prints its usage block and the prog)."""
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


# argparse types shared by the commands: a value out of range is refused at parsing (exit 2, the
# flag named by argparse) instead of failing inside the work. NaN and infinities are refused
# everywhere: NaN passes no comparison (a gate silently off), an infinity means none.


def integer(least: int) -> Callable[[str], int]:
    """An int ≥ ``least`` (a negative step count, a zero host count refused)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be ≥ {least}, got {value}")
        return value

    return parse


def number(*, positive: bool = False) -> Callable[[str], float]:
    """A finite float ≥ 0 (> 0 when ``positive``): a negative tolerance would invert a comparison."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(f"must be a finite number {'> 0' if positive else '≥ 0'}, got {text!r}")
        return value

    return parse


def share(text: str) -> float:
    """A finite share in [0, 1]."""
    value = number()(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be a finite share in [0, 1], got {text!r}")
    return value


def run_dir(text: str) -> RunDir:
    """A run directory flag (``--run_dir``, ``--run``): the ``RunDir`` it names, resolved here, at
    the command line's edge (``RunDir.resolved``); the command passes that value on."""
    if REMOTE.match(text):  # RunDir is a local Path: gs://b/r would be the folder ./gs:/b/r
        raise argparse.ArgumentTypeError(
            f"{text}: a remote location; a run directory is a local folder (a mounted bucket is one)"
        )
    try:
        return RunDir.resolved(text)
    except (OSError, RuntimeError) as e:  # a symlink loop, an unreadable link: pathlib's words
        raise argparse.ArgumentTypeError(f"{text!r} cannot be resolved: {e}") from None
