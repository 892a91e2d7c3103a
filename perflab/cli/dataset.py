"""`perflab dataset build|verify`: build the synthetic data set offline from a seed, or check it against its manifest."""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dataset", help="build or verify the synthetic JPEG data set (offline, seeded)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    b = actions.add_parser("build", help="draw the data set into an ImageFolder of JPEGs with a manifest "
                                         "(kept as is when already built and intact)")
    _common(b)
    b.add_argument("--seed", type=int, default=0, help="generation seed (default 0)")
    b.add_argument("--workers", type=int, default=None,
                   help="build processes (default: 1 for tiny, small and photo, up to 8 for full)")
    b.set_defaults(func=run_build)

    v = actions.add_parser("verify", help="check every file of a built set against its manifest")
    _common(v)
    v.set_defaults(func=run_verify)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", choices=("tiny", "small", "photo", "full"), default="tiny", help="which set (default tiny)")
    p.add_argument("--root", type=Path, default=None,
                   help="the folder the set lives in (default: $PERFLAB_DATA_DIR/SIZE, else datasets/build/SIZE)")


def run_build(args: argparse.Namespace) -> int:
    from perflab import dataset

    reused = dataset.is_built(args.size, args.root, args.seed)
    start = time.perf_counter()
    root = dataset.build(args.size, root=args.root, seed=args.seed, workers=args.workers)
    elapsed = time.perf_counter() - start
    verb = "verified existing" if reused else "built"
    print(f"{verb} {args.size} set in {root} ({elapsed:.1f} s)")
    print(_summary(dataset.read_manifest(root)))
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from perflab import dataset

    root = args.root if args.root is not None else dataset.default_root(args.size)
    if not (root / dataset.MANIFEST).is_file():
        where = f" --root {root}" if args.root is not None else ""
        raise FileNotFoundError(f"{root}: no {dataset.MANIFEST}, the set is not built; "
                                f"build it with: perflab dataset build --size {args.size}{where}")
    start = time.perf_counter()
    dataset.verify(root)
    manifest = dataset.read_manifest(root)
    print(f"ok: {len(manifest['files'])} files in {root} match {dataset.MANIFEST} "
          f"({time.perf_counter() - start:.1f} s)")
    print(_summary(manifest))
    return 0


def _summary(manifest: dict) -> str:
    count = manifest["count"]
    classes = manifest["classes"]
    return (f"{len(classes)} classes ({', '.join(classes)}), {count['train']} train + {count['val']} val JPEGs, "
            f"{manifest['image_side']} px, seed {manifest['seed']}, recipe v{manifest['recipe_version']}")
