"""`perflab env`: the machine, as stored with every measurement."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="describe this machine and the torch settings that change numbers")
    p.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from perflab import env

    info = env.machine_info(args.device)
    print(json.dumps(info.to_dict(), indent=2) if args.json else info.describe())
    return 0
