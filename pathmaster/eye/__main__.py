"""``python -m pathmaster.eye --check``: load the eye, check its weights, print its description.

For a site's administrator checking an install: exit status 0 and the eye's description as
JSON (``describe()``: name, version, SHA-256, width, blocks, resolution, views) on standard
output when its weights package is installed and its file is the one recorded; exit status
1 and what is missing or altered on standard error otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys

from pathmaster.eye import DEFAULT_EYE, EYES, EyeUnavailable, open_eye


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pathmaster.eye", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", required=True,
                        help="load the eye, check its weights' SHA-256 and print its description (JSON)")
    parser.add_argument("--eye", default=DEFAULT_EYE, choices=sorted(EYES), help="which eye (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        eye = open_eye(args.eye)
    except EyeUnavailable as exc:
        print(f"python -m pathmaster.eye: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(eye.describe(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
