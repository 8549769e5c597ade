"""`python -m pipelines.mixture from-olmo-mix MIX.txt --root URI [...] > mixture.yaml`: an OLMo-core
mix file → a mixture YAML of `format: tokens` sources (the conversion: `pipelines.olmo_mix`), checked
by `pipelines.mixture.parse_mixture` before it is printed. The header of what it prints is the whole
command, every option spelled out: re-running it prints the same bytes.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

from contract.cli import Parser, integer, run_main
from contract.manifest import HELDOUT
from pipelines import olmo_mix
from pipelines.bestfit import BEST_FIT
from pipelines.mixture import MixtureError, parse_mixture


def _from_olmo_mix_cli(argv: list[str]) -> int:
    """`python -m pipelines.mixture from-olmo-mix MIX.txt --root URI [...] > mixture.yaml`."""
    return run_main(lambda: _from_olmo_mix(from_olmo_mix_parser().parse_args(argv)))


def from_olmo_mix_parser(ap: Parser | None = None) -> Parser:
    """The flags of `from-olmo-mix` (on ``ap``, the command's subparser, else a parser of its own)."""
    ap = ap or Parser("python -m pipelines.mixture from-olmo-mix", FROM_OLMO_MIX)
    ap.add_argument(
        "mix",
        help="an OLMo-core mix file, or the bare name of one that ships with the installed "
        "ai2-olmo-core (olmo_core/data/mixes/*.txt)",
    )
    ap.add_argument("--root", required=True, help="where the mix's relative paths live (e.g. gs://BUCKET/ai2-llm)")
    ap.add_argument(
        "--tokenizer",
        default=olmo_mix.DEFAULT_TOKENIZER_ID,
        help="replaces {TOKENIZER} (OLMo-core's DataMix.build uses dolma2-tokenizer for its validation mixes)",
    )
    ap.add_argument("--name", help="mixture name (default: the mix file's name)")
    ap.add_argument("--seq-len", type=integer(1), default=olmo_mix.DEFAULT_SEQ_LEN, help="tokens per instance")
    ap.add_argument("--split", choices=[HELDOUT], help="heldout: every source is held out (validation mixes)")
    ap.add_argument(
        "--source-permutation-seed",
        type=integer(0),
        help="list the files as OLMo-core's source_permutation_seed orders them (OLMo 3 stage 3: 123)",
    )
    ap.add_argument(
        "--packing", choices=[BEST_FIT], help="best_fit: OLMo-core's packed dataset (NumpyPackedFSLDataset)"
    )
    ap.add_argument(
        "--group", type=integer(1), help="with --packing best_fit: files packed together (source_group_size)"
    )
    return ap


def _packing_arg(args: Any) -> dict[str, Any] | None:
    if args.group is not None and args.packing is None:
        raise MixtureError("--group is for --packing best_fit")
    if args.packing is None:
        return None
    return {"method": args.packing, **({"group": args.group} if args.group is not None else {})}


def _optional(args: Any, *names: str) -> list[str]:
    """The flags among `names` that were given, spelled out for the header's command."""
    out: list[str] = []
    for n in names:
        if getattr(args, n) is not None:
            out += ["--" + n.replace("_", "-"), str(getattr(args, n))]
    return out


def _from_olmo_mix(args: Any) -> int:
    base = os.path.basename(args.mix)
    name = args.name or base.removesuffix(".txt")
    path = olmo_mix.locate_mix(args.mix)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        mixture = olmo_mix.mixture_from_olmo_mix(
            text,
            args.root,
            tokenizer_id=args.tokenizer,
            name=name,
            seq_len=args.seq_len,
            split=args.split,
            where=args.mix,
            permutation_seed=args.source_permutation_seed,
            packing=_packing_arg(args),
        )
        parse_mixture(mixture, where="generated mixture")  # what we print, the job accepts
    except (OSError, UnicodeDecodeError) as e:  # (OlmoMixError, MixtureError: refusals as they are)
        raise MixtureError(f"{path}: {e}") from None
    n_files = sum(len(s["paths"]) for s in mixture["sources"])
    # The whole command, every option spelled out: re-running it prints these bytes again.
    command = shlex.join(
        [
            "python",
            "-m",
            "pipelines.mixture",
            "from-olmo-mix",
            args.mix,
            "--root",
            args.root,
            "--tokenizer",
            args.tokenizer,
            "--name",
            name,
            "--seq-len",
            str(args.seq_len),
            *(["--split", args.split] if args.split else []),
            *_optional(args, "source_permutation_seed", "packing", "group"),
        ]
    )
    use = (
        "held out: never trained on; add its manifest to the trainer's data for held-out evaluation"
        if args.split
        else "which numbers OLMo-core's instances: train with data_order: olmo-core; weights do not apply then"
    )
    order = (
        "in the mix file's line order"
        if args.source_permutation_seed is None
        else f"in the order OLMo-core's source_permutation_seed={args.source_permutation_seed} gives them"
    )
    if args.packing:
        use += f"; packed by best-fit as OLMo-core's NumpyPackedFSLDataset, {args.group or 1} file(s) per group"
    header = (
        f"Generated by `{command}`\nfrom OLMo-core's {base}: {len(mixture['sources'])} sources, "
        f"{n_files} token files, {order}\n({use})."
    )
    sys.stdout.write(olmo_mix.to_yaml(mixture, header))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m pipelines.mixture from-olmo-mix ...` (its one command)."""
    ap = Parser("python -m pipelines.mixture", "mixture files")
    sub = ap.add_subparsers(dest="command", required=True)
    from_olmo_mix_parser(sub.add_parser("from-olmo-mix", help=FROM_OLMO_MIX, description=FROM_OLMO_MIX))
    args = ap.parse_args(argv)
    return run_main(lambda: _from_olmo_mix(args))


FROM_OLMO_MIX = "OLMo-core mix file → mixture YAML of format: tokens sources (labels become sources, in order)"

if __name__ == "__main__":
    sys.exit(main())
