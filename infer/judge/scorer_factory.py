"""Builds the key-screenshot scorer a ``keyshot judge`` run's config describes: its back-end, the image
policy it was trained with and its answer limit."""

from __future__ import annotations

import dataclasses
import logging

from keyshot.infer.client.cache import CallCache
from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
from keyshot.infer.client.pool import EndpointPool
from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.common.config import ConfigError
from keyshot.infer.judge.config import JudgeRunConfig, JudgeRunError, ScorerConfig
from keyshot.infer.judge.local_scorer import TransformersScorer
from keyshot.infer.judge.scorers import KeyScreenshotScorer, OpenAIScorer, checkpoint_image_policy
from keyshot.infer.model.checkpoint import trained_answer_tokens
from keyshot.infer.protocol.images import DEFAULT_POLICY, ImagePolicy
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.serve.command import VLLMServer
from keyshot.infer.serve.plan import ServeConfig

logger = logging.getLogger(__name__)


def scorer_policy(cfg: ScorerConfig) -> ImagePolicy | None:
    if cfg.checkpoint:
        return checkpoint_image_policy(cfg.checkpoint)
    if cfg.min_pixels is not None and cfg.max_pixels is not None:
        return ImagePolicy(min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
    if cfg.backend == "openai":
        logger.warning(
            "scorer.checkpoint is not set: images use keyshot's default policy (%d..%d px); set it so "
            "the scorer sees images as it was trained",
            DEFAULT_POLICY.min_pixels,
            DEFAULT_POLICY.max_pixels,
        )
    return None


#: The in-process scorer's answer limit when neither scorer.max_tokens nor the checkpoint says one.
DEFAULT_LOCAL_MAX_TOKENS = 512


def scorer_max_tokens(sc: ScorerConfig, default: int) -> int:
    """The scorer's answer limit: ``scorer.max_tokens``, else ``default`` (the endpoint's ``max_tokens``),
    raised with a log line to the longest answer the checkpoint was trained on (``keyshot.json``), so
    that no answer like the trained ones is cut. An explicit ``scorer.max_tokens`` below that length is
    refused. A scorer whose checkpoint is unknown (a remote endpoint) keeps its limit."""
    longest = trained_answer_tokens(sc.checkpoint)
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
    cfg: JudgeRunConfig, cache: CallCache | None, ledger: UsageLedger, endpoint: EndpointConfig | None = None
) -> KeyScreenshotScorer | None:
    """The configured scorer (None for the reference configuration), knowing the longest answer its
    checkpoint was trained on (named when its answers are cut)."""
    scorer = _configured_scorer(cfg, cache, ledger, endpoint)
    if scorer is not None:
        scorer.trained_answer_tokens = trained_answer_tokens(cfg.scorer.checkpoint)
    return scorer


def _configured_scorer(
    cfg: JudgeRunConfig, cache: CallCache | None, ledger: UsageLedger, endpoint: EndpointConfig | None
) -> KeyScreenshotScorer | None:
    sc = cfg.scorer
    prompts = load_prompt_set(cfg.pipeline.prompt_variant)
    if sc.backend == "none":
        return None
    if sc.backend == "transformers":
        if not sc.checkpoint:
            raise JudgeRunError("scorer.backend=transformers needs scorer.checkpoint (a model folder)")
        return TransformersScorer(
            sc.checkpoint,
            prompts,
            device=sc.device,
            dtype=sc.dtype,
            batch_size=sc.batch_size,
            max_new_tokens=scorer_max_tokens(sc, DEFAULT_LOCAL_MAX_TOKENS),
            parse_mode=cfg.pipeline.parse_mode,
            logprobs=sc.logprobs,
        )
    endpoint = endpoint or sc.endpoint
    if endpoint is None and not sc.endpoints:
        raise JudgeRunError("scorer.backend=openai needs scorer.endpoint (or --serve-scorer CHECKPOINT)")
    client = (
        JudgeClient(endpoint, cache, ledger)
        if endpoint is not None
        else EndpointPool(sc.endpoints, cache, ledger, cooldown_s=sc.cooldown_s)
    )
    served_limit = endpoint.max_tokens if endpoint is not None else min(e.max_tokens for e in sc.endpoints)
    limit = scorer_max_tokens(sc, served_limit)
    return OpenAIScorer(
        client,
        prompts,
        parse_mode=cfg.pipeline.parse_mode,
        logprobs=sc.logprobs,
        max_tokens=limit if limit != served_limit else sc.max_tokens,  # None: each endpoint's own
        policy=scorer_policy(sc),
        retry_invalid=sc.retry_invalid,
    )


def start_served_scorer(
    cfg: JudgeRunConfig, checkpoint: str, log_file: str
) -> tuple[VLLMServer, EndpointConfig]:
    """``--serve-scorer CHECKPOINT``: vLLM serving the checkpoint under the process guard (``scorer.serve``
    settings, its log in ``log_file`` unless they name one), and the endpoint the scorer calls, keeping
    the configured endpoint's concurrency, answer limit and timeout."""
    serve_cfg = dataclasses.replace(cfg.scorer.serve or ServeConfig(), model=checkpoint)
    serve_cfg.prompt_variant = cfg.pipeline.prompt_variant
    serve_cfg.log_file = serve_cfg.log_file or log_file
    server = VLLMServer(serve_cfg).start()
    base = cfg.scorer.endpoint
    kept = {
        "max_concurrency": base.max_concurrency,
        "max_tokens": base.max_tokens,
        "timeout_s": base.timeout_s,
    }
    return server, server.endpoint(**(kept if base else {}))
