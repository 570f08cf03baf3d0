"""``keyshot sweep``: the paper's threshold sweep (App. B.3, Table B.4) over a judged folder: only the outcome
call is asked again for each δ (the library: :mod:`keyshot.infer.judge.threshold_sweep`).

Examples::

    keyshot sweep runs/om2w --config webjudge7b --out runs/om2w-sweep
    keyshot sweep arb_records/webjudge_o4_mini --deltas 2,3,4 --config webjudge7b pipeline.outcome_logprobs=5 --out runs/arb-sweep
    keyshot metrics runs/om2w-sweep --human-labels data/online_mind2web/human_label.json --out runs/om2w-sweep/metrics

(``runs/om2w``: a folder keyshot judge wrote; ``arb_records/webjudge_o4_mini``: one judge's released
records, as in tests/fixtures/arb_records.) The judged folder is a keyshot run folder (or its
verdicts.jsonl) or released judge records. Each δ gets
its run folder, ``OUT/delta_<δ>``, and ``OUT/sweep.json`` counts what each δ sent and reused. The judge
comes from ``--config`` and ``key=value`` overrides (``judge.*``, ``pipeline.outcome_logprobs`` for
p_success), as for ``keyshot judge``; the pipeline settings that decided the judged verdicts are the
folder's: a config file's give way to them (said in one line), a ``pipeline.*`` override that differs
is refused (docs/operating-point.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from keyshot.infer.common.command import Command
from keyshot.infer.common.config import load_config, split_paths_and_overrides
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.sweep_plan import plan_markdown, plan_sweep
from keyshot.infer.judge.sweep_source import SweepError, pipeline_keys_given
from keyshot.infer.judge.threshold_sweep import (
    DEFAULT_DELTAS,
    closing_lines,
    parse_deltas,
    prepare_sweep,
    sweep_markdown,
)


# ---------------------------------------------------------------------------- CLI
def _configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "items",
        nargs="+",
        metavar="JUDGED|key=value",
        help="the judged folder (keyshot run folder, verdicts.jsonl or released judge records), then config overrides",
    )
    parser.add_argument(
        "--config",
        help="YAML JudgeRunConfig: the judge asked for the outcome calls (a file, or a shipped one by name)",
    )
    parser.add_argument("--out", type=Path, help="folder for OUT/delta_<δ>/ and sweep.json (not with --plan)")
    parser.add_argument(
        "--deltas",
        default=",".join(map(str, DEFAULT_DELTAS)),
        help="thresholds δ to sweep, comma-separated (default %(default)s)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="say what each δ keeps and would ask, from the recorded scores alone: no judge, no call",
    )
    parser.add_argument(
        "--allow-outside",
        action="append",
        default=[],
        metavar="DIR",
        help="also read screenshots the judged trajectories reference inside DIR (beside the folders the judged "
        "run read, which its run.json records)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def run(args: argparse.Namespace) -> int:
    paths, overrides = split_paths_and_overrides(args.items)
    if len(paths) != 1:
        raise SweepError(f"give one judged folder (got {len(paths)}: {' '.join(paths) or 'none'})")
    if args.out is None and not args.plan:
        raise SweepError("give --out OUT: the folder for the δ run folders and sweep.json (or --plan)")
    deltas = parse_deltas(args.deltas)
    if args.plan:
        print(plan_markdown(Path(paths[0]), plan_sweep(Path(paths[0]), deltas)))
        return 0
    cfg = load_config(JudgeRunConfig, args.config, overrides)
    sweep = prepare_sweep(
        Path(paths[0]),
        cfg,
        deltas,
        args.out,
        given=pipeline_keys_given(args.config, overrides),
        allow_outside=tuple(args.allow_outside),
    )
    print("\n".join(sweep.forecast_lines()), flush=True)
    sweep.check_judge()
    result = sweep.run(progress=not args.no_progress)
    print(sweep_markdown(result))
    lines, code = closing_lines(result, args.out)
    for line in lines:
        print(line)
    return code


COMMAND = Command(
    "sweep",
    help="the threshold sweep: the outcome call again per δ, key points and screenshot scores reused",
    description=__doc__,
    arguments=_configure,
    run=run,
    overrides="items",
)
