"""`pathmaster experiment run FILE|NAME --out DIR` and `pathmaster experiment report DIR`."""

from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser("experiment", help="run QoS experiments in the testbed and report on them",
                                   description="Run a QoS experiment (a TOML file or a built-in name) in the "
                                               "testbed, and make tables and plots from its raw data.")
    sub = parser.add_subparsers(dest="experiment_command", metavar="ACTION", required=True)

    run = sub.add_parser("run", help="run (or resume) an experiment; needs root",
                         description="Run every run of the experiment in shuffled order, storing raw data "
                                     "per run in DIR/runs/. Run the same command again to resume.")
    run.add_argument("experiment", metavar="FILE|NAME",
                     help="an experiment file, or a built-in: pathmaster2002, wan-latency, bursty, smoke")
    run.add_argument("--out", required=True, metavar="DIR", help="output directory (created; resumed if it exists)")
    run.add_argument("--max-runs", type=int, default=None, help="stop after this many new runs")
    run.add_argument("--through-look", type=int, default=None, metavar="K",
                     help="an experiment with [sequential] looks: stop once every cell has look K's runs")
    run.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--allow-dirty", action="store_true",
                     help="run even if the code has uncommitted changes (recorded in the metadata)")
    run.add_argument("--allow-code-change", action="store_true",
                     help="resume even if the code differs from the code the experiment started with "
                          "(recorded in the metadata)")
    run.set_defaults(func=cmd_run)

    report = sub.add_parser("report", help="tables and plots from an experiment's raw data",
                            description="Write DIR/report/: summary and Table 1 (CSV, Markdown), "
                                        "significance tests, and figures (PNG, SVG).")
    report.add_argument("out", metavar="DIR", help="the output folder of `pathmaster experiment run`")
    report.add_argument("--no-plots", action="store_true", help="tables only, no figures")
    report.add_argument("--findings", metavar="FILE|NAME", default=None,
                        help="test the [[findings]] of this experiment file instead of those the raw data "
                             "declare (the report says they were declared after the data)")
    report.set_defaults(func=cmd_report)

    power = sub.add_parser("power", help="a sequential design's power, simulated from committed runs",
                           description="Simulate the experiment's [sequential] design by drawing every cell's "
                                       "runs from a committed raw folder's cells (with replacement) and testing "
                                       "its findings at its looks as the report does; prints each finding's "
                                       "share of either verdict (reproduced, not reproduced) by each look.")
    power.add_argument("experiment", metavar="FILE|NAME", help="an experiment with [sequential] looks")
    power.add_argument("--from", dest="source", required=True, metavar="DIR",
                       help="a raw folder whose cells (strategy, level) give the runs to draw from")
    power.add_argument("--simulations", type=int, default=1000, help="simulated experiments (1-100000)")
    power.add_argument("--seed", type=int, default=0)
    power.add_argument("--json", action="store_true", help="the rows as JSON")
    power.set_defaults(func=cmd_power)

    show = sub.add_parser("list", help="the built-in experiments")
    show.set_defaults(func=cmd_list)


def cmd_run(args: argparse.Namespace) -> int:
    from pathmaster.records import InvalidInput
    from qos.experiment.runner import look_runs
    from qos.experiment.spec import load_spec

    try:
        experiment = load_spec(args.experiment)
        if args.through_look is not None:
            look_runs(experiment, args.through_look)
    except InvalidInput as exc:
        print(f"pathmaster experiment: {exc}", file=sys.stderr)
        return 2
    from qos.experiment.store import check_provenance, git_state

    try:  # before the testbed is built: a refusal should cost nothing
        check_provenance(git_state(), args.allow_dirty)
    except InvalidInput as exc:
        print(f"pathmaster experiment: {exc}", file=sys.stderr)
        return 2
    import os

    if os.geteuid() != 0:
        print("pathmaster experiment: running an experiment needs root (it builds network namespaces)",
              file=sys.stderr)
        return 2
    from services.experiment.bench import TestbedBench
    from qos.machine import experiment_lock
    from qos.experiment.report import write_report
    from qos.experiment.runner import run_experiment
    from qos.netns import CommandError

    try:
        # Alone on the machine: the emulator shares its cores with whatever else runs.
        with experiment_lock(f"experiment {experiment.name} --out {args.out}"), TestbedBench(experiment) as bench:
            store = run_experiment(experiment, args.out, bench, progress=not args.quiet, max_runs=args.max_runs,
                                   through_look=args.through_look, allow_dirty=args.allow_dirty,
                                   allow_code_change=args.allow_code_change)
    except (InvalidInput, ValueError, CommandError) as exc:
        print(f"pathmaster experiment: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted; run the same command again to resume into {args.out}", file=sys.stderr)
        return 130
    if not args.no_report:
        folder = write_report(store.root)
        print(f"report: {folder / 'report.md'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pathmaster.records import InvalidInput
    from qos.experiment.report import write_report

    try:
        later = None
        if args.findings:
            from qos.experiment.spec import load_spec

            later = load_spec(args.findings)
        folder = write_report(args.out, plots=not args.no_plots, findings_from=later)
    except InvalidInput as exc:
        print(f"pathmaster experiment: {exc}", file=sys.stderr)
        return 2
    print(f"report: {folder / 'report.md'}")
    print((folder / "table1.md").read_text())
    return 0


def cmd_power(args: argparse.Namespace) -> int:
    import json

    from pathmaster.records import InvalidInput
    from qos.experiment.power import committed_cells, simulate
    from qos.experiment.report import markdown_table
    from qos.experiment.spec import load_spec

    try:
        experiment = load_spec(args.experiment)
        if experiment.sequential is None:
            raise InvalidInput(f"{experiment.name} declares no [sequential] looks", experiment.source)
        rows = simulate({"experiment": experiment.to_dict()}, committed_cells(args.source),
                        simulations=args.simulations, seed=args.seed)
    except (InvalidInput, ValueError) as exc:
        print(f"pathmaster experiment: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1) if args.json else markdown_table(rows, list(rows[0])))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from qos.experiment.matrix import expand
    from qos.experiment.spec import builtin_names, load_spec

    for name in builtin_names():
        exp = load_spec(name)
        print(f"{name:16s} {len(expand(exp)):4d} runs  {exp.description}")
    return 0
