"""Do two revisions analyse cells to the very same bits? For speed work that must not
change any output.

    python benchmarks/check_identical_outputs.py --before REV [--synthetic 140] [--herlev PATH]
    python benchmarks/check_identical_outputs.py --dump OUT.npz   (with PYTHONPATH=a tree)
    python benchmarks/check_identical_outputs.py --compare BEFORE.npz AFTER.npz

Runs the analysis with this working tree and with git revision REV (a temporary git
worktree), each in its own process, and compares every mask, blank slide and feature
vector with ``np.array_equal`` (no tolerance). Cases, each cell fed as the product feeds it:

- synthetic cells (`pathmaster.image.synth`, every diagnosis, the generators the tests use):
  ``analyse_cell(image)`` (an upload: segmentation, slide estimate, features),
  ``analyse_cell(image, background)`` (segmentation against a given slide),
  ``analyse_cell(image, mask=mask)`` (slide estimated round a given mask) and
  ``extract_features`` with the true mask and slide;
- the real Herlev cells (../shared/data/herlev-40px, 917 cells of 40 px) as the importer
  completes them (slide estimated round the hand-drawn mask, then features), and as an
  upload (``analyse_cell(image)``), at 40 px and upscaled to 200 px (bilinear), which
  takes the half-resolution path of `complete_cell` that 40 px crops do not;
- the benchmark's 200 px sweep cell (`bench_features.sweep_cell`);
- the realistic uploads (../shared/data/herlev-224-dev: 224 px JPEG, letter-boxed, no mask
  or slide) as ``analyse_cell(image)``.

For the uploads also the patch the eye sees and the eye's vector of it (`pathmaster.eye`,
its default options, where the tree has one). With ``--rtol`` /
``--atol``, float arrays that differ by no more (``np.allclose``) are counted apart, for
changes that are exact only to floating-point rounding.

Prints the number of cells compared per case and every difference; exit status 1 on any.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HERLEV = REPO.parent / "shared" / "data" / "herlev-40px"
UPLOADS = REPO.parent / "shared" / "data" / "herlev-224-dev"


def _outputs(analysis) -> dict[str, np.ndarray]:
    outputs = {"mask": analysis.mask, "background": analysis.background, "features": analysis.features}
    if getattr(analysis, "patch", None) is not None:  # what a learnt network sees
        outputs["patch"] = analysis.patch
    return outputs


def _eye():
    """The tree's pretrained eye (its default options), None in a tree from before it."""
    try:
        from pathmaster.eye import open_eye
    except ImportError:
        return None
    return open_eye()


def dump(out: Path, synthetic: int, herlev: Path | None, uploads: Path | None = None) -> None:
    """Write every case's outputs, computed with the pathmaster first on sys.path, to `out` (.npz)."""
    import cv2

    from pathmaster.features import extract_features
    from pathmaster.records import DIAGNOSES, CellRecord
    from pathmaster.analysis.cell import analyse_cell
    from pathmaster.image.synth import cell_rng, synth_cell

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_features import sweep_cell

    arrays: dict[str, np.ndarray] = {}

    def keep(case: str, index: int, outputs: dict[str, np.ndarray]) -> None:
        for name, value in outputs.items():
            arrays[f"{case}/{index}/{name}"] = np.asarray(value)

    for i in range(synthetic):
        seed = (21, 22, 23, 24, 0)[i % 5]
        cell = synth_cell(DIAGNOSES[i % len(DIAGNOSES)], cell_rng(seed, i))
        keep("synthetic-upload", i, _outputs(analyse_cell(cell.image)))
        keep("synthetic-with-slide", i, _outputs(analyse_cell(cell.image, background=cell.background)))
        keep("synthetic-with-mask", i, _outputs(analyse_cell(cell.image, mask=cell.mask)))
        keep("synthetic-true", i, {"features": extract_features(cell.image, cell.background, cell.mask)})
    image, background, mask = sweep_cell(200)
    keep("sweep-200", 0, _outputs(analyse_cell(image)))
    if herlev is not None and herlev.is_dir():
        from pathmaster.importers import iter_dataset

        records = [r for r in iter_dataset(herlev, layout="herlev") if isinstance(r, CellRecord)]
        for i, record in enumerate(records):
            keep("herlev-imported", i, {"background": record.background,
                                        "features": extract_features(record.image, record.background, record.mask)})
            keep("herlev-upload", i, _outputs(analyse_cell(record.image)))
            big = cv2.resize(record.image, (200, 200), interpolation=cv2.INTER_LINEAR)
            keep("herlev-200-upload", i, _outputs(analyse_cell(big)))
    if uploads is not None and uploads.is_dir():
        from PIL import Image

        eye = _eye()
        for i, path in enumerate(sorted(uploads.glob("*/*.jpg"))):
            analysis = analyse_cell(np.asarray(Image.open(path).convert("RGB")))
            outputs = _outputs(analysis)
            if analysis.patch is not None and eye is not None:  # the eye's vector, as a site and the coordinator see it
                outputs["eye"] = eye.features(analysis.patch[None])
            keep("herlev-224-upload", i, outputs)
    np.savez_compressed(out, **arrays)


def compare(before: Path, after: Path, rtol: float = 0.0, atol: float = 0.0) -> int:
    """Print the cells compared per case and every array that differs; the number that
    differ beyond ``np.allclose(before, after, rtol, atol)`` (0, 0: any bit). Arrays that
    differ within it are counted apart, with the largest difference."""
    old, new = np.load(before), np.load(after)
    if set(old.files) != set(new.files):
        print(f"different cases: only before {sorted(set(old.files) - set(new.files))[:5]}, "
              f"only after {sorted(set(new.files) - set(old.files))[:5]}")
        return 1
    cells: dict[str, set] = {}
    differ, close, closest = 0, 0, 0.0
    for key in sorted(old.files):
        case, index, _ = key.split("/")
        cells.setdefault(case, set()).add(index)
        a, b = old[key], new[key]
        if a.dtype != b.dtype or not np.array_equal(a, b):
            if a.shape == b.shape and a.dtype.kind == "f" and b.dtype.kind == "f" and np.allclose(a, b, rtol, atol):
                close += 1
                closest = max(closest, float(np.max(np.abs(a.astype(float) - b))))
                continue
            differ += 1
            detail = "" if a.shape != b.shape or a.dtype != b.dtype else \
                f", {np.count_nonzero(a != b)} of {a.size} values, max |diff| {np.max(np.abs(a.astype(float) - b)):.3g}"
            print(f"DIFFERS {key}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}{detail}")
    for case, indices in cells.items():
        print(f"{case}: {len(indices)} cells compared")
    within = f", {close} more within rtol {rtol:g} + atol {atol:g} (max |diff| {closest:.3g})" if close else ""
    print(f"{len(old.files)} arrays compared, {differ} differ{within}"
          + ("" if differ or close else ": bit-identical"))
    return differ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="REV", help="git revision to compare this working tree with")
    parser.add_argument("--synthetic", type=int, default=140, help="synthetic cells (every diagnosis in turn)")
    parser.add_argument("--herlev", type=Path, default=HERLEV, help="herlev-40px folder (skipped if absent)")
    parser.add_argument("--uploads", type=Path, default=UPLOADS, help="herlev-224-dev folder (skipped if absent)")
    parser.add_argument("--dump", type=Path, metavar="NPZ", help="only write this tree's outputs to NPZ")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"),
                        help="only compare two --dump files")
    parser.add_argument("--rtol", type=float, default=0.0,
                        help="float arrays within np.allclose(rtol, atol) are counted apart, not as differing")
    parser.add_argument("--atol", type=float, default=0.0)
    args = parser.parse_args(argv)
    if args.compare:
        return 1 if compare(*args.compare, args.rtol, args.atol) else 0
    if args.dump:
        import old_layout  # this tree's names in a tree from before the core's rooms

        old_layout.install()
        dump(args.dump, args.synthetic, args.herlev, args.uploads)
        return 0
    if not args.before:
        parser.error("--before REV is required")
    if not args.herlev.is_dir():
        print(f"no Herlev cells at {args.herlev}: synthetic cells only")
    with tempfile.TemporaryDirectory(prefix="identical-") as tmp:
        old_tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(old_tree), args.before],
                       check=True)
        try:
            for tree, name in ((old_tree, "before"), (REPO, "after")):
                subprocess.run([sys.executable, __file__, "--dump", str(Path(tmp) / f"{name}.npz"),
                                "--synthetic", str(args.synthetic), "--herlev", str(args.herlev),
                                "--uploads", str(args.uploads)],
                               env={**os.environ, "PYTHONPATH": str(tree)}, check=True, timeout=3600)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_tree)], check=False)
        return 1 if compare(Path(tmp) / "before.npz", Path(tmp) / "after.npz", args.rtol, args.atol) else 0


if __name__ == "__main__":
    raise SystemExit(main())
