"""The core commands: ``synth``, ``index``, ``cells``, ``search``, ``evaluate``.

Each handler imports what it needs when it runs, so ``pathmaster --help`` stays instant.
Bad input ends a command with one line on stderr naming the file and the problem, and a
non-zero exit status (2), never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2


def _reports_bad_input(handler):
    """Turn the errors a user can cause into one clear line and exit status 2."""

    @functools.wraps(handler)
    def run(args) -> int:
        from pathmaster.records import InvalidInput

        try:
            return handler(args)
        except (InvalidInput, FileNotFoundError, NotADirectoryError, ValueError) as exc:
            print(f"pathmaster {args.command}: error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT

    return run


NO_SITE_SCORE_HELP = ("skip the site's own abnormality score (cross-validated, each training fold learns what "
                      "indexing learns: with a network, minutes a fold)")


def register(subparsers) -> None:
    """Add the core subcommands to the ``pathmaster`` parser."""
    p = subparsers.add_parser("synth", help="write a synthetic cytology dataset",
                              description="Write N synthetic Pap-smear cells (image, blank-slide background, "
                                          "4-region mask) in Herlev's 7 classes, deterministic for a seed.")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--cells", type=int, default=1400, help="number of cells (default 1400 = 7 x 200)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.set_defaults(func=_synth)

    _register_index(subparsers)

    _register_cells(subparsers)

    p = subparsers.add_parser("search", help="the most similar database cells to one test cell",
                              description="Analyse one cell image and print the k most similar cells of the site.")
    p.add_argument("image", type=Path, metavar="IMAGE", help="the test cell image (PNG, BMP, JPEG or TIFF)")
    p.add_argument("--db", required=True, type=Path, metavar="SITE_DIR")
    p.add_argument("--background", type=Path, help="blank-slide image taken with the same lighting")
    p.add_argument("--mask", type=Path, help="label image: 0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus")
    p.add_argument("--k", type=int, default=5, help="number of matches (default 5)")
    p.add_argument("--json", action="store_true", help='print {"matches": [{"cell_id", "diagnosis", "distance"}, ...]}')
    p.add_argument("--exclude-self", action="store_true",
                   help="leave out database cells with the query's own pixels (the query is already in the database)")
    p.set_defaults(func=_search)

    p = subparsers.add_parser("evaluate", help="retrieval quality of a site (cross-validated, or held-out queries)",
                              description="Stratified k-fold cross-validation over the site's own cells, folds "
                                          "split by slide image (the site's representation refitted on each "
                                          "training fold), leave-one-out, or held-out query cells from another "
                                          "dataset: top-1, precision@5, majority@5, mAP, binary normal/abnormal "
                                          "accuracy, abnormal sensitivity and specificity with 95%% confidence "
                                          "intervals, the ROC of the per-cell abnormality score, simulated 6-cell "
                                          "cases, recall per class, the confusion matrix and, cross-validated, "
                                          "classifiers on the same folds and representation as a ceiling.")
    p.add_argument("--db", required=True, type=Path, metavar="SITE_DIR")
    p.add_argument("--queries", type=Path, metavar="DATASET_DIR", help="held-out query cells (default: cross-validation)")
    p.add_argument("--folds", type=int, default=5, help="stratified folds (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fold split, bootstrap and classifiers (default 0)")
    p.add_argument("--loo", action="store_true",
                   help="leave-one-out in the site's stored space instead (fitted to every cell, queries included)")
    p.add_argument("--no-ceiling", action="store_true", help="skip the classifier ceiling")
    p.add_argument("--no-site-score", action="store_true", help=NO_SITE_SCORE_HELP)
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_evaluate)



def _register_index(subparsers) -> None:
    """``pathmaster index``: ingest a dataset into a site directory and (re)build its index."""
    p = subparsers.add_parser("index", help="add a dataset's cells to a site database and (re)build its index",
                              description="Ingest a dataset (synthetic, Herlev, SIPaKMeD or class folders of images) "
                                          "into a site directory. Re-running skips cells already there and completes "
                                          "an interrupted run; unreadable files are reported and skipped.")
    p.add_argument("dataset", type=Path, metavar="DATASET_DIR",
                   help="the dataset folder: synthetic, Herlev, SIPaKMeD or class folders (datasets/README.md)")
    p.add_argument("--db", required=True, type=Path, metavar="SITE_DIR", help="site directory (created if needed)")
    p.add_argument("--algorithm", choices=("auto", "flat", "ivf", "hnsw"), default=None,
                   help="search index: exact (flat), IVF or HNSW; auto = exact up to 200k cells (default: as before, else auto)")
    p.add_argument("--features", choices=("auto", "all", "fisher", "forward", "lda"), default=None,
                   help="feature weighting: all equal, Fisher-ratio weights, forward selection, linear "
                        "discriminant axes learnt from the site's labels (lda), or auto = "
                        "whichever retrieves diagnoses best under cross-validation (default: as before, else auto)")
    p.add_argument("--similarity", choices=("auto", "features", "embedding", "fused"), default=None,
                   help="what the site compares: its features, what a frozen pretrained network (the eye) sees "
                        "of the cells' pixels through a lens fitted to its own labelled cells, both fused, or "
                        "auto = whichever its cross-validation finds best (default: as before, else auto)")
    p.add_argument("--eye-views", type=int, default=None, metavar="N",
                   help="how many of each cell patch's rotations/flips the eye averages: 1, 2, 4 or 8 (each a "
                        "pass of the network, on every upload too; default: as before, else the eye's default)")
    p.add_argument("--eye-resolution", type=int, default=None, metavar="PX",
                   help="the side the eye resizes each cell patch to: a multiple of 16 from 96 up to the "
                        "patch's side (fewer pixels, less CPU; default: as before, else the eye's default)")
    p.add_argument("--vocabulary", metavar="NAME|FILE",
                   help="the site's diagnosis labels: herlev, sipakmed, bethesda, or a TOML file (labels, which "
                        "are abnormal, each one's Bethesda term; see pathmaster/vocabulary.py); set on the first "
                        "run and kept (default: the dataset's, herlev for most)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="cells per committed transaction: at most this much work is redone after a crash (default 32)")
    p.add_argument("--workers", type=int, default=None,
                   help="local processes analysing cells in parallel (default: one per core; 1: in the "
                        "indexing process itself)")
    p.add_argument("--ray-address", metavar="HOST:PORT",
                   help="analyse on this running Ray cluster instead, one task per CPU (needs the site "
                        "extra; the cluster's nodes must see DATASET_DIR at the same path)")
    p.add_argument("--relearn", action="store_true",
                   help="fit what the site learns from its cells (z-scores, feature choice) to all of them "
                        "again; without it new cells join the search index and that is kept, unless they "
                        "have drifted from the cells it was fitted to")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_index)


def _register_cells(subparsers) -> None:
    """`pathmaster cells remove|relabel`."""
    p = subparsers.add_parser("cells", help="remove or relabel cells of a site database",
                              description="Remove cells from a site (rows, files and search index) or give a "
                                          "cell another diagnosis. What the site learnt is kept until "
                                          "`pathmaster index --relearn`.")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    remove = actions.add_parser("remove", help="remove cells by id", description="Remove cells by their site id.")
    remove.add_argument("cell_ids", nargs="+", metavar="CELL_ID", help="the cells' ids (16 hex digits)")
    remove.add_argument("--db", required=True, type=Path, metavar="SITE_DIR")
    remove.set_defaults(func=_cells_remove)
    relabel = actions.add_parser("relabel", help="give a cell another diagnosis",
                                 description="Give a cell another diagnosis, a label of the site's vocabulary.")
    relabel.add_argument("cell_id", metavar="CELL_ID", help="the cell's id (16 hex digits)")
    relabel.add_argument("diagnosis", metavar="DIAGNOSIS", help="a label of the site's vocabulary")
    relabel.add_argument("--db", required=True, type=Path, metavar="SITE_DIR")
    relabel.set_defaults(func=_cells_relabel)

@_reports_bad_input
def _synth(args) -> int:
    from tqdm import tqdm

    from pathmaster.image.synth import write_dataset

    with tqdm(total=args.cells, unit="cell", desc="synthesising") as bar:
        out = write_dataset(args.out, args.cells, args.seed, progress=lambda done: bar.update(done - bar.n))
    print(f"wrote {args.cells} cells to {out}")
    return 0


@_reports_bad_input
def _index(args) -> int:
    from pathmaster.site.ingest import ingest, local_cores

    if not args.dataset.is_dir():
        raise NotADirectoryError(f"{args.dataset}: not a dataset directory")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    eye = _eye_choice(args)
    if eye:
        from pathmaster.site.fitting import eye_options

        eye_options(**eye)   # refused before anything is ingested
    workers = local_cores() if args.workers is None else args.workers
    if not 1 <= workers <= 1024:
        raise ValueError(f"--workers must be 1 to 1024, got {workers}")
    vocabulary = None
    if args.vocabulary:
        from pathmaster.vocabulary import load_vocabulary

        vocabulary = load_vocabulary(args.vocabulary)
    report = ingest(args.dataset, args.db, progress=not args.quiet, algorithm=args.algorithm,
                    features=args.features, batch_size=args.batch_size, vocabulary=vocabulary,
                    workers=workers, ray_address=args.ray_address, relearn=args.relearn,
                    similarity=args.similarity, eye=eye)
    for source, problem in report.problems:
        print(f"skipped {source}: {problem}", file=sys.stderr)
    print(f"{report.added} cells added, {report.skipped} already there, {len(report.problems)} problems; "
          f"{report.total_cells} cells in {args.db} ({report.cells_per_second:.1f} cells/s, analysed in "
          f"{report.where})")
    if report.index:
        projection = report.index["projection"]
        names = projection["names"]
        shown = ", ".join(names) if len(names) <= 20 else f"{', '.join(names[:20])}, ..."
        print(f"index: {report.index['algorithm']}, features by {projection['method']} ({len(names)}): {shown}")
        from pathmaster.site.search import SiteIndex

        site = SiteIndex.open(args.db)
        print(f"similarity: {site.similarity_note()}; abnormality score: {site.learnt.score} >= "
              f"{site.learnt.threshold:.3g} (the site's operating point)")
        if site.eye is not None:
            print(f"eye: {site.eye.name} at {site.eye.resolution} px, {site.eye.views} "
                  f"view{'s' if site.eye.views > 1 else ''} averaged")
    return 0 if report.total_cells else 1


def _eye_choice(args) -> dict | None:
    """The eye's options given on the command line (``fitting.eye_options`` checks them), or
    None to keep the site's."""
    given = {key: value for key, value in (("views", args.eye_views), ("resolution", args.eye_resolution))
             if value is not None}
    return given or None


def _known_cells(handler):
    """An unknown cell id ends the command with one line naming it, exit status 2."""

    @functools.wraps(handler)
    def run(args) -> int:
        try:
            return handler(args)
        except KeyError as exc:
            print(f"pathmaster cells: error: no cell {exc.args[0]!r} in {args.db}", file=sys.stderr)
            return EXIT_BAD_INPUT

    return run


@_reports_bad_input
@_known_cells
def _cells_remove(args) -> int:
    from pathmaster.site.growth import remove_cells

    config = remove_cells(args.db, args.cell_ids)
    print(f"removed {len(set(args.cell_ids))} cells; {config['n_cells']} cells in {args.db}")
    return 0


@_reports_bad_input
@_known_cells
def _cells_relabel(args) -> int:
    from pathmaster.site.growth import relabel_cell

    label = relabel_cell(args.db, args.cell_id, args.diagnosis)
    print(f"cell {args.cell_id} is now {label!r} (`pathmaster index --relearn` fits the site to its labels again)")
    return 0


def _read_cell(args):
    from pathmaster.image.io import read_image, read_mask
    from pathmaster.analysis.uploads import check_cell_image

    image = read_image(args.image)
    check_cell_image(image, args.image)
    background = read_image(args.background) if args.background else None
    mask = read_mask(args.mask, image.shape) if args.mask else None
    return image, background, mask


@_reports_bad_input
def _search(args) -> int:
    from pathmaster.site.search import SiteIndex
    from pathmaster.site.database import image_hash

    image, background, mask = _read_cell(args)
    if args.k < 1:
        raise ValueError(f"--k must be at least 1, got {args.k}")
    site = SiteIndex.open(args.db)
    analysis = site.analyse(image, background, mask, source=str(args.image))
    itself = site.cells_with_hash(image_hash(image))  # the query is already in the database
    left_out = set(itself) if args.exclude_self else set()
    matches = [m for m in site.search_analysis(analysis, k=args.k + len(left_out)) if m.cell_id not in left_out]
    matches = matches[: args.k]
    if args.json:
        print(json.dumps({
            "query": str(args.image),
            "algorithm": site.algorithm,
            "background_estimated": analysis.background_estimated,
            "mask_estimated": analysis.mask_estimated,
            "cell_choice": analysis.cell_choice,
            "vocabulary": site.vocabulary.name,
            "in_database": itself,
            "self_excluded": bool(left_out),
            "matches": [{"cell_id": m.cell_id, "diagnosis": m.diagnosis, "distance": round(m.distance, 6),
                         "bethesda": site.vocabulary.to_bethesda(m.diagnosis),
                         "source_id": m.source_id, "same_image": m.cell_id in itself} for m in matches],
        }, indent=1))
        return 0
    notes = [what for what, flag in (("background", analysis.background_estimated),
                                     ("mask", analysis.mask_estimated)) if flag]
    if notes:
        print(f"note: no {' or '.join(notes)} given; estimated from the image")
    if itself:
        print(f"note: this image is already in the database (cell {', '.join(itself)}); "
              + ("left out of the matches" if left_out else "it matches itself: --exclude-self leaves it out"))
    print(f"{'rank':>4}  {'cell_id':16}  {'distance':>8}  {'diagnosis':22}  source")
    for rank, m in enumerate(matches, 1):
        same = "  (the query itself)" if m.cell_id in itself else ""
        print(f"{rank:>4}  {m.cell_id:16}  {m.distance:8.3f}  {str(m.diagnosis):22}  {m.source_id}{same}")
    return 0


def _site_score_fit(db, site, X, labels, groups, labelled, options: dict, seed: int):
    """``crossval.site_score_fit`` for an indexed site: with its cells' eye vectors when it
    looks through an eye, so each training fold learns its lens as indexing did."""
    from pathmaster.evaluation import crossval
    from pathmaster.site.fitting import eye_vectors

    vectors = eye = None
    if site.eye is not None:
        cells = db.cells()
        vectors = eye_vectors(db, [c for c, keep in zip(cells, labelled) if keep], site.eye)
        eye = site.eye.describe()
    return crossval.site_score_fit(X[labelled], labels[labelled], groups[labelled], site.feature_names,
                                   site.vocabulary.abnormal, choice=options.get("features", "auto"),
                                   similarity_choice=options.get("similarity", "auto"), eye_vectors=vectors,
                                   eye=eye, seed=seed)


@_reports_bad_input
def _evaluate(args) -> int:
    import numpy as np

    from pathmaster.evaluation import crossval
    from pathmaster.evaluation.report import format_report
    from pathmaster.site.search import SiteIndex
    from pathmaster.site.database import SiteDB

    if args.folds < 2:
        raise ValueError(f"--folds must be at least 2, got {args.folds}")
    site = SiteIndex.open(args.db)
    problems = []
    projection = site.config["projection"]
    if args.queries:
        from pathmaster.importers import iter_dataset

        metrics, problems = crossval.held_out(site, iter_dataset(args.queries, vocabulary=site.vocabulary))
        metrics["mode"] = f"held-out queries from {args.queries}"
    elif args.loo:
        labels = site.labels()
        labelled = [i for i, label in enumerate(labels) if label is not None]
        metrics = crossval.leave_one_out(site.vectors()[labelled], [labels[i] for i in labelled])
        metrics["mode"] = "leave-one-out (in the space fitted to all cells)"
    else:
        labels = np.array(site.labels(), dtype=object)
        labelled = np.array([label is not None for label in labels], dtype=bool)
        with SiteDB(args.db) as db:
            _, X = db.feature_matrix()
            options = db.get_config("index_options", {})
            choice = options.get("features", "auto")
            groups = np.array([c.group for c in db.cells()], dtype=object)
            site_score = None if args.no_site_score else _site_score_fit(db, site, X, labels, groups, labelled,
                                                                         options, args.seed)
        fit = crossval.site_similarity_fit(site.feature_names, choice, args.seed)
        metrics = crossval.cross_validate(X[labelled], labels[labelled], fit, groups=groups[labelled],
                                          abnormal_labels=site.vocabulary.abnormal, folds=args.folds,
                                          seed=args.seed, progress=not args.quiet,
                                          ceilings=() if args.no_ceiling else tuple(crossval.CEILINGS),
                                          site_score=site_score)
        metrics["mode"] = f"{metrics['folds']}-fold cross-validation, feature choice {choice!r} refitted per fold"
    metrics["algorithm"] = site.algorithm
    metrics["database_cells"] = len(site)
    cv = {h["method"]: h["cv_precision_at_5"] for h in projection.get("history", []) if "method" in h}
    metrics["feature_choice"] = {"method": projection.get("method", "all"),
                                 "features": len(projection["columns"]),
                                 "cv_precision_at_5": cv.get(projection.get("method"))}
    for source, problem in problems:
        print(f"skipped query {source}: {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps(metrics, indent=1))
    else:
        print(f"{metrics['mode']} on {args.db} ({len(site)} cells, {site.algorithm})")
        if metrics["feature_choice"]["cv_precision_at_5"] is not None and args.loo:
            # Leave-one-out reuses the cells the feature choice was fitted to.
            print(f"(features chosen on these cells; their cross-validated precision@5 was "
                  f"{metrics['feature_choice']['cv_precision_at_5']:.3f})")
        print(format_report(metrics))
    return 0
