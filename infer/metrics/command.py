"""``keyshot metrics``: a judge's verdicts against the truth: success rate, agreement, SR gap, precision,
recall and F1, of a keyshot run (its folder or verdicts.jsonl) or of a released ARB WebJudge run.

Examples::

    keyshot metrics runs/om2w/verdicts.jsonl --human-labels data/online_mind2web/human_label.json --out runs/om2w/metrics
    keyshot metrics runs/arb/verdicts.jsonl --arb-index data/arb_webjudge/dev/index.csv --out runs/arb/metrics
    keyshot metrics --arb-index data/arb_webjudge/dev/index.csv --arb-judge webjudge_7B --out runs/released_7b
    keyshot metrics runs/mine/verdicts.jsonl --human-labels labels.csv --agent MyAgent --out runs/mine/metrics

The truth of each trajectory, and every table names where it came from: human labels (--human-labels:
Online-Mind2Web's human_label.json, a JSON object {task_id: 0|1} or {task_id: {"label": 0|1, "agent":
NAME}}, or a CSV with the header task_id,label[,agent]), AgentRewardBench's annotation (--arb-index), else
the benchmark's own reward recorded with the run (AgentLab/BrowserGym cum_reward > 0: success).

Verdicts that rest on no readable screenshot score are not counted (dropped as "no readable scores"), and
a run of stand-in models (the demo's untrained model) says so above every table.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from keyshot.infer.common.command import Command
from keyshot.infer.metrics.config import (
    ARB_PARSE_MODES,
    DEFAULTS,
    LABEL_2_POLICIES,
    OBJECTIVES,
    MetricsConfig,
)
from keyshot.infer.metrics.run import MetricsInputs, run_metrics


def _configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "verdicts",
        nargs="?",
        type=Path,
        help="a keyshot judge output folder or its verdicts.jsonl (or released judge records); leave out to "
        "score the released records listed in --arb-index",
    )
    parser.add_argument(
        "--human-labels",
        type=Path,
        help="human labels: Online-Mind2Web human_label.json, {task_id: 0|1} JSON, or task_id,label[,agent] CSV",
    )
    parser.add_argument(
        "--agent", help="the agent of verdicts judged without one (joined with the labels by it)"
    )
    parser.add_argument("--benchmark", help="the benchmark of verdicts judged without one")
    parser.add_argument(
        "--label-2",
        choices=LABEL_2_POLICIES,
        default=DEFAULTS.label_2,
        help="how to count Online-Mind2Web's human label 2 (not executable); the paper counts it as not success",
    )
    parser.add_argument(
        "--arb-index", type=Path, help="AgentRewardBench WebJudge index.csv (human labels, records)"
    )
    parser.add_argument(
        "--arb-judge", help="judge folder in --arb-index to score when no verdict file is given"
    )
    parser.add_argument(
        "--arb-parse-mode",
        choices=ARB_PARSE_MODES,
        default=DEFAULTS.arb_parse_mode,
        help="how to read the released records' outcome answers",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for metrics.{json,md,csv,png}")
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default=DEFAULTS.objective,
        help="what the p_success threshold maximises on the tune split (reported on the test split)",
    )
    parser.add_argument(
        "--split-seed", default=DEFAULTS.split_seed, help="seed of the task-hash tune/test split"
    )
    parser.add_argument("--bins", type=int, default=DEFAULTS.n_bins, help="bins of the reliability diagram")
    return parser


#: The option (its dest) of each field of MetricsInputs and MetricsConfig, where it is not the field's name.
OPTION_OF = {"n_bins": "bins"}


def _from_options(cls: type, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, OPTION_OF.get(f.name, f.name)) for f in dataclasses.fields(cls)})


def run(args: argparse.Namespace) -> int:
    inputs, config = _from_options(MetricsInputs, args), _from_options(MetricsConfig, args)
    print(run_metrics(inputs, args.out, config).text())
    return 0


COMMAND = Command(
    "metrics",
    help="success rate, agreement, SR gap, precision/recall/F1 against the truth (human labels or the "
    "runs' own reward)",
    description=__doc__,
    arguments=_configure,
    run=run,
)
