"""Print the feature catalogue: `python -m pathmaster.features [--markdown]`."""

from __future__ import annotations

import argparse

from .catalog import FEATURES


def catalogue_lines(markdown: bool = False) -> list[str]:
    """One line per feature, in vector order: index, name, unit, group, doc."""
    if markdown:
        lines = ["| # | name | unit | group | what it measures |", "|---|---|---|---|---|"]
        lines += [f"| {i} | `{f.name}` | {f.unit} | {f.group} | {f.doc} |" for i, f in enumerate(FEATURES)]
        return lines
    width = max(len(f.name) for f in FEATURES)
    return [f"{i:3d}  {f.name:<{width}}  {f.unit:<7}  {f.group:<9}  {f.doc}" for i, f in enumerate(FEATURES)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pathmaster.features", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    print("\n".join(catalogue_lines(args.markdown)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
