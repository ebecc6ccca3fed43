"""`speclens plan`: measure this machine (or read the cached plan) and print what Auto would do."""
from __future__ import annotations

import argparse
import json
import sys

from core.auto.cache import load_plan, plan_path
from core.auto.export import ENGINES, ExportError, export
from core.auto.plan import backend_threads, plan_key
from core.auto.strategy import get_plan
from core.cli_args import add_pair_arguments, open_pair
from core.sampling import SamplingParams


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speclens plan", description="Measure this machine and print Auto's plan.")
    add_pair_arguments(parser)
    parser.add_argument("--refresh", action="store_true", help="measure again even when a cached plan exists")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--export", choices=ENGINES, default=None,
                        help="print the command line that serves this pair on ENGINE with the plan's drafting")
    parser.add_argument("--served-target", metavar="ID", default=None,
                        help="with --export: the target as that engine loads it (default: the pair's Hugging Face "
                             "id, or its GGUF file for llama-server)")
    parser.add_argument("--served-draft", metavar="ID", default=None, help="with --export: the draft, likewise")
    args = parser.parse_args(argv)
    try:
        sampling = SamplingParams(temperature=args.temperature)
        target, draft = open_pair(args.pair, args.backend, args.draft_backend, args.device, args.target,
                                  args.draft)
    except Exception as exc:  # a missing model package or a bad setting: one clear line, no traceback
        print(f"speclens plan: {exc}", file=sys.stderr)
        return 2
    if args.no_draft:
        draft = None
    cached = None if args.refresh else load_plan(plan_key(target, draft, sampling))
    plan = cached or get_plan(target, draft, sampling, refresh=True,
                              report=lambda what, fraction: print(f"  {what}…", file=sys.stderr))
    if args.json:
        print(json.dumps(plan.to_json(), indent=1))
        return 0
    if args.export:
        try:
            names = served_names(args, target, draft)
            print(export(plan, args.export, *names).text())
        except ExportError as exc:
            print(f"speclens plan: {exc}", file=sys.stderr)
            return 2
        return 0
    print(f"Pair: {target.name} ({type(target).__name__}, {target.device}, {backend_threads(target)} threads)"
          + (f" with draft {draft.name} ({type(draft).__name__}, {draft.device})" if draft is not None else ""))
    print(f"Plan {'from the cache' if cached else 'measured now'}: {plan_path(plan.key)}\n")
    print(plan.describe())
    return 0


def served_names(args, target, draft) -> tuple[str, str]:
    """(target, draft) as the exported engine loads them: what the user said, else what this pair is known as."""
    from core.models import PAIRS

    if args.served_target and args.served_draft:
        return args.served_target, args.served_draft
    if args.export == "llama-server" and hasattr(target, "path") and hasattr(draft, "path"):
        known = (str(target.path), str(draft.path))
    elif args.target is None and PAIRS.get(args.pair) is not None and PAIRS[args.pair].hub:
        known = PAIRS[args.pair].hub
    else:
        raise ExportError(f"{args.export} needs to know where to load this pair from: "
                          "give --served-target and --served-draft")
    return args.served_target or known[0], args.served_draft or known[1]


if __name__ == "__main__":
    sys.exit(main())
