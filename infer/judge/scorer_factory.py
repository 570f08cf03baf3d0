"""Builds the key-screenshot scorer a ``keyshot judge`` run's config describes: its back-end, the image
policy it was trained with and its answer limit."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator

from keyshot.infer.client.cache import CallCache
from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
from keyshot.infer.client.pool import EndpointPool
from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.common.config import ConfigError, load_config
from keyshot.infer.common.registry import Registry
from keyshot.infer.judge.config import JudgeRunConfig, JudgeRunError, ScorerConfig
from keyshot.infer.judge.local_scorer import TransformersScorer
from keyshot.infer.judge.pipeline import WebJudge
from keyshot.infer.judge.protocol_record import JUDGE_SCORES_BACKEND, ScorerFacts
from keyshot.infer.judge.scorers import JUDGE_SCORES, JudgeScores, KeyScreenshotScorer, OpenAIScorer
from keyshot.infer.model.checkpoint import (
    CheckpointDescription,
    describe_checkpoint,
    looks_like_local_path,
    model_folder_problem,
)
from keyshot.infer.protocol.images import DEFAULT_POLICY, REFERENCE_POLICY, ImagePolicy
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.serve.plan import ServeConfig
from keyshot.infer.serve.server import VLLMServer

logger = logging.getLogger(__name__)


def describe_scorer(sc: ScorerConfig) -> CheckpointDescription | None:
    """The scorer checkpoint's description (None when the config names no checkpoint): read once per run
    and handed to everything below."""
    return describe_checkpoint(sc.checkpoint) if sc.checkpoint else None


def scorer_policy(sc: ScorerConfig, checkpoint: CheckpointDescription | None) -> ImagePolicy | None:
    """The image policy the scorer sees images with: its checkpoint's (``scorer.min_pixels``/``max_pixels``
    set beside it must equal its bounds), else the configured bounds, else None (keyshot's default)."""
    if checkpoint is not None:
        policy = checkpoint.require_image_policy()
        for key, given, trained in (
            ("min_pixels", sc.min_pixels, policy.min_pixels),
            ("max_pixels", sc.max_pixels, policy.max_pixels),
        ):
            if given is not None and given != trained:
                raise ConfigError(
                    f"scorer.{key}={given} differs from the {key} {checkpoint.model} was trained with "
                    f"({trained}); the scorer must see images as it was trained: remove scorer.{key}"
                )
        return policy
    bounds = sc.pixel_bounds()
    return ImagePolicy(min_pixels=bounds[0], max_pixels=bounds[1]) if bounds else None


def scorer_facts(
    cfg: JudgeRunConfig, checkpoint: CheckpointDescription | None
) -> tuple[ScorerFacts, ImagePolicy]:
    """What the protocol says of the configured scorer, and the image policy it sees screenshots with,
    read from the config (the scorer :func:`build_scorer` builds from it says the same of itself:
    :meth:`~keyshot.infer.judge.scorers.KeyScreenshotScorer.facts`)."""
    sc = cfg.scorer
    SCORER_BACKENDS.get(sc.backend)  # an unknown back-end is named before anything is recorded
    if sc.backend == JUDGE_SCORES_BACKEND:
        return ScorerFacts(JUDGE_SCORES_BACKEND), REFERENCE_POLICY
    served = sc.endpoint or (sc.endpoints[0] if sc.endpoints else None)
    facts = ScorerFacts(
        sc.backend,
        sc.checkpoint or (served.model if served else None),
        checkpoint.hash if checkpoint is not None else None,
        "scorer" in cfg.constrained_roles(),
    )
    return facts, scorer_policy(sc, checkpoint) or DEFAULT_POLICY


def warn_default_policy(sc: ScorerConfig, policy: ImagePolicy | None) -> None:
    """Say that a served scorer of unknown training sees keyshot's default policy."""
    if policy is None and sc.backend == "openai":
        logger.warning(
            "scorer.checkpoint is not set: images use keyshot's default policy (%d..%d px); set it (the "
            "served folder or hub id) so the scorer sees images as it was trained",
            DEFAULT_POLICY.min_pixels,
            DEFAULT_POLICY.max_pixels,
        )


#: The in-process scorer's answer limit when neither scorer.max_tokens nor the checkpoint says one.
DEFAULT_LOCAL_MAX_TOKENS = 512


def scorer_max_tokens(sc: ScorerConfig, default: int, checkpoint: CheckpointDescription | None) -> int:
    """The scorer's answer limit: ``scorer.max_tokens``, else ``default`` (the endpoint's ``max_tokens``),
    raised with a log line to the longest answer the checkpoint was trained on (its ``keyshot.json``), so
    that no answer like the trained ones is cut. An explicit ``scorer.max_tokens`` below that length is
    refused. A scorer whose checkpoint is unknown (a remote endpoint) keeps its limit."""
    longest = checkpoint.answer_tokens if checkpoint is not None else None
    if sc.max_tokens is not None:
        if longest and sc.max_tokens < longest:
            raise ConfigError(
                f"scorer.max_tokens={sc.max_tokens} is below the longest answer {sc.checkpoint} was trained on "
                f"({longest} tokens, its keyshot.json answer_tokens): its answers would be cut; remove "
                f"scorer.max_tokens or set it to at least {longest}"
            )
        return sc.max_tokens
    if longest and default < longest:
        logger.info(
            "scorer max_tokens raised from %d to %d, the longest answer %s was trained on",
            default,
            longest,
            sc.checkpoint,
        )
        return longest
    return default


def build_scorer(
    cfg: JudgeRunConfig,
    cache: CallCache | None,
    ledger: UsageLedger,
    endpoint: EndpointConfig | None = None,
    checkpoint: CheckpointDescription | None = None,
) -> KeyScreenshotScorer | JudgeScores:
    """The configured scorer (:data:`~keyshot.infer.judge.scorers.JUDGE_SCORES` for the reference
    configuration, ``scorer.backend: none``), knowing its checkpoint and the longest answer it was trained on
    (named when its answers are cut). ``checkpoint``: the description of ``scorer.checkpoint`` its caller
    read (:func:`describe_scorer`); read here when not given."""
    if checkpoint is None:
        checkpoint = describe_scorer(cfg.scorer)
    scorer = _configured_scorer(cfg, cache, ledger, endpoint, checkpoint)
    if isinstance(scorer, KeyScreenshotScorer):
        scorer.checkpoint = checkpoint
        scorer.trained_answer_tokens = checkpoint.answer_tokens if checkpoint is not None else None
    return scorer


#: The scorer back-ends by name (``scorer.backend``): each builds the configured scorer from ``(cfg, cache,
#: ledger, endpoint, checkpoint)``; a new back-end is a builder registered here (docs/contributing.md).
SCORER_BACKENDS: Registry[Callable[..., KeyScreenshotScorer | JudgeScores]] = Registry(
    "scorer back-end", "scorer.backend"
)


def _configured_scorer(
    cfg: JudgeRunConfig,
    cache: CallCache | None,
    ledger: UsageLedger,
    endpoint: EndpointConfig | None,
    checkpoint: CheckpointDescription | None,
) -> KeyScreenshotScorer | JudgeScores:
    return SCORER_BACKENDS.get(cfg.scorer.backend)(cfg, cache, ledger, endpoint, checkpoint)


@SCORER_BACKENDS.register(JUDGE_SCORES_BACKEND)
def _judge_scores(cfg, cache, ledger, endpoint, checkpoint) -> JudgeScores:
    """The reference configuration: no scorer, the judge scores every screenshot."""
    return JUDGE_SCORES


@SCORER_BACKENDS.register("transformers")
def _in_process(cfg, cache, ledger, endpoint, checkpoint) -> KeyScreenshotScorer:
    """The checkpoint in this process (``scorer.checkpoint``, a model folder)."""
    sc = cfg.scorer
    if not sc.checkpoint:
        raise JudgeRunError("scorer.backend=transformers needs scorer.checkpoint (a model folder)")
    return TransformersScorer(
        sc.checkpoint,
        load_prompt_set(cfg.pipeline.prompt_variant),
        device=sc.device,
        dtype=sc.dtype,
        batch_size=sc.batch_size,
        max_new_tokens=scorer_max_tokens(sc, DEFAULT_LOCAL_MAX_TOKENS, checkpoint),
        parse_mode=cfg.pipeline.parse_mode,
        logprobs=sc.logprobs,
        checkpoint=checkpoint,
        tower_cuda_graphs=sc.tower_cuda_graphs,
    )


@SCORER_BACKENDS.register("openai")
def _served(cfg, cache, ledger, endpoint, checkpoint) -> KeyScreenshotScorer:
    """An OpenAI-compatible endpoint (``scorer.endpoint``, or the pool ``scorer.endpoints``)."""
    sc = cfg.scorer
    endpoint = endpoint or sc.endpoint
    if endpoint is None and not sc.endpoints:
        raise JudgeRunError("scorer.backend=openai needs scorer.endpoint (or --serve-scorer CHECKPOINT)")
    client = (
        JudgeClient(endpoint, cache, ledger)
        if endpoint is not None
        else EndpointPool(sc.endpoints, cache, ledger, cooldown_s=sc.cooldown_s)
    )
    served_limit = endpoint.max_tokens if endpoint is not None else min(e.max_tokens for e in sc.endpoints)
    limit = scorer_max_tokens(sc, served_limit, checkpoint)
    policy = scorer_policy(sc, checkpoint)
    warn_default_policy(sc, policy)
    return OpenAIScorer(
        client,
        load_prompt_set(cfg.pipeline.prompt_variant),
        parse_mode=cfg.pipeline.parse_mode,
        logprobs=sc.logprobs,
        max_tokens=limit if limit != served_limit else sc.max_tokens,  # None: each endpoint's own
        policy=policy,
        retry_invalid=sc.retry_invalid,
    )


def check_model_folder(model: str) -> None:
    """Refuse a checkpoint given as a local path that is not a model folder; a hub id
    (``osunlp/WebJudge-7B``) passes, the server's plan reads it. The one check of ``--serve-scorer`` and
    ``scorer.checkpoint`` under ``keyshot judge`` and ``keyshot reward serve``."""
    if looks_like_local_path(model) and (problem := model_folder_problem(model)):
        raise JudgeRunError(
            f"{model}: not a model checkpoint ({problem}); pass the folder a training run wrote (RUN/final) "
            "or a hub id such as osunlp/WebJudge-7B"
        )


def add_serve_scorer_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--serve-scorer CHECKPOINT``, the same flag on every
    command that takes it (``keyshot judge``, ``keyshot reward serve``)."""
    parser.add_argument(
        "--serve-scorer",
        metavar="CHECKPOINT",
        help=f"start vLLM for this scorer checkpoint (a folder, or a hub id such as osunlp/WebJudge-7B; the "
        f"config's scorer.serve settings) {what}",
    )


def add_scorer_url_argument(parser: argparse.ArgumentParser) -> None:
    """``--scorer-url URL``, repeatable: the scorer served at these URLs (:func:`scorer_served_at`)."""
    parser.add_argument(
        "--scorer-url",
        action="append",
        default=[],
        metavar="URL",
        help="the scorer is served at URL (an OpenAI-compatible /v1 base, e.g. keyshot serve); repeat it for a "
        "pool, each call to the least-loaded live server; each keeps the config's scorer endpoint settings "
        "(model, max_tokens, timeout_s, max_concurrency)",
    )


def scorer_served_at(cfg: JudgeRunConfig, urls: list[str]) -> JudgeRunConfig:
    """``cfg`` with its scorer at ``urls`` (``--scorer-url``): the configured scorer endpoint (or the pool's
    first) with each URL as its ``base_url``; one URL is the endpoint, more are a pool (``scorer.endpoints``)."""
    if not urls:
        return cfg
    if cfg.scorer.backend != "openai":
        raise ConfigError(f"--scorer-url needs scorer.backend=openai (the config has {cfg.scorer.backend!r})")
    base = cfg.scorer.base_endpoint
    if base is None:
        raise ConfigError(
            "--scorer-url: the config has no scorer.endpoint to take the model name and settings from"
        )
    members = [dataclasses.replace(base, base_url=url) for url in urls]
    one = len(members) == 1
    scorer = dataclasses.replace(
        cfg.scorer, endpoint=members[0] if one else None, endpoints=None if one else members
    )
    return dataclasses.replace(cfg, scorer=scorer)


def apply_serve_scorer(cfg: JudgeRunConfig, checkpoint: str) -> None:
    """``--serve-scorer CHECKPOINT`` on ``cfg``, as every command takes it: the checkpoint checked
    (:func:`check_model_folder`), and the scorer described by it unless ``scorer.checkpoint`` names its
    folder already. The server starts later (:func:`start_served_scorer`), once nothing else is wrong."""
    check_model_folder(checkpoint)
    cfg.scorer.checkpoint = cfg.scorer.checkpoint or checkpoint


def start_served_scorer(
    cfg: JudgeRunConfig, checkpoint: str, log_file: str, description: CheckpointDescription | None = None
) -> tuple[VLLMServer, EndpointConfig]:
    """``--serve-scorer CHECKPOINT``: vLLM serving the checkpoint under the process guard (``scorer.serve``
    settings, its log in ``log_file`` unless they name one), and the endpoint the scorer calls, keeping
    the configured endpoint's concurrency, answer limit and timeout (a config without ``scorer.endpoint``
    takes the server's). ``description``: the checkpoint's, when the caller has read it
    (:func:`describe_scorer`). A command starts it through :func:`served_scorer`, which stops it."""
    serve_cfg = dataclasses.replace(cfg.scorer.serve or ServeConfig(), model=checkpoint)
    serve_cfg.prompt_variant = cfg.pipeline.prompt_variant
    serve_cfg.log_file = serve_cfg.log_file or log_file
    if description is not None and description.model != checkpoint:
        description = None  # scorer.checkpoint names another folder than the one served: read this one
    base = cfg.scorer.endpoint
    kept = (
        {
            "max_concurrency": base.max_concurrency,
            "max_tokens": base.max_tokens,
            "timeout_s": base.timeout_s,
            "constrained": base.constrained,  # vLLM holds answers to the format, as the protocol records
        }
        if base is not None
        else {}
    )
    server = VLLMServer(serve_cfg, checkpoint=description).start()
    try:
        return server, server.endpoint(**kept)
    except BaseException:
        server.stop()
        raise


@contextlib.contextmanager
def served_scorer(
    cfg: JudgeRunConfig,
    checkpoint: str | None,
    log_file: str,
    description: CheckpointDescription | None = None,
) -> Iterator[EndpointConfig | None]:
    """The one way a command serves its scorer (``keyshot judge``, ``keyshot reward serve``): with
    ``checkpoint`` (``--serve-scorer``), vLLM started by :func:`start_served_scorer` and the endpoint it
    serves, the server stopped when the block ends however it ends; without, None and nothing started."""
    if not checkpoint:
        yield None
        return
    server, endpoint = start_served_scorer(cfg, checkpoint, log_file, description)
    try:
        yield endpoint
    finally:
        server.stop()


def webjudge_from_config(config: str | os.PathLike | None = None, *overrides: str) -> WebJudge:
    """A :class:`~keyshot.infer.judge.pipeline.WebJudge` built as ``keyshot judge`` builds it, from a judge
    config (a YAML file or a shipped config's name, ``webjudge7b``) and ``key.sub=value`` overrides: its
    judge client and its scorer (a served endpoint, the judge's own scores for the reference
    configuration, or a local model), the config's concurrency. No preflight, no cache and no run
    folder: ``judge_sync(trajectories)``, or ``await judge(t)`` then ``aclose()``."""
    cfg = load_config(JudgeRunConfig, config, list(overrides))
    ledger = UsageLedger()
    webjudge = WebJudge(JudgeClient(cfg.judge, None, ledger), build_scorer(cfg, None, ledger), cfg.pipeline)
    webjudge.concurrency = cfg.concurrency
    return webjudge
