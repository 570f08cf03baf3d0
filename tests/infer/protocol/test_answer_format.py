"""The answer formats constrained decoding holds answers to (keyshot.infer.protocol.answer_format): every
string a pattern allows is read by the protocol's own parsers (strict mode), to the value it ends with,
within the call's token limit; the parsers' happy-path answers fit the patterns; the request body and the
run config that carry them."""

from __future__ import annotations

import random
import re

import pytest

from keyshot.infer.client.endpoint import EndpointConfig, build_payload
from keyshot.infer.common.config import ConfigError, load_config
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.fingerprint import protocol_fingerprint
from keyshot.infer.protocol.answer_format import AnswerFormat, AnswerFormatError, answer_format
from keyshot.infer.protocol.parsing import parse_key_points, parse_score, parse_status, split_key_points
from keyshot.infer.protocol.prompts import STEPS, VARIANTS
from keyshot.infer.runs.run_record import CONSTRAINED, constrained_text
from tests.support.regex_strings import RegexStrings, width

# Strings that trip parsers, tried inside the free text of every pattern.
TRAPS = [
    "Score: 5",
    "**Score**: 1",
    "### Score: 2",
    "Score (1-5): 3",
    "Credit Score 750",
    "Status: success",
    'Status: "failure"',
    "status:",
    "**Status:** unsuccessful",
    "not successful",
    "**Key Points**:",
    "Key Points:",
    "**Reasoning**:",
    "### Reasoning:",
    "\n\n",
    "\n",
    "2. ",
    "**",
    "#",
]
LIMITS = (None, 64, 128, 1024)  # None: the least limit the step takes
DRAWS = 150


def _limits(fmt: AnswerFormat) -> list[int]:
    return [fmt.min_tokens() if limit is None else limit for limit in LIMITS]


def _check(fmt: AnswerFormat, text: str) -> None:
    """``text`` is read by the strict parser of its step, to the value the pattern put at its end."""
    if fmt.step == "key_points":
        points = split_key_points(parse_key_points(text, "strict"))
        assert points and all(p.strip() for p in points), text
    elif fmt.step == "key_screenshot":
        result = parse_score(text, "strict", fmt.variant)
        assert result.valid and result.score == int(text[-1]), text
    else:
        result = parse_status(text, "strict")
        assert result.valid and result.success == text.endswith('"success"'), text


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("step", STEPS)
def test_every_string_a_pattern_allows_parses_within_its_limit(variant, step):
    fmt = answer_format(variant, step)
    rng = random.Random(f"{variant}/{step}")
    for limit in _limits(fmt):
        pattern = fmt.regex(limit)
        assert width(pattern)[1] <= limit - 1  # every answer ends before the limit: none is cut
        compiled = re.compile(pattern)
        strings = RegexStrings(pattern, rng, TRAPS)
        for _ in range(DRAWS):
            text = strings.draw()
            assert compiled.fullmatch(text), text
            _check(fmt, text)


def test_the_draws_reach_the_traps_and_both_ends():
    """The test above is only as good as its draws: they hold labels inside the reasoning, and both the
    shortest and the longest answers."""
    fmt = answer_format("online_mind2web", "key_screenshot")
    pattern = fmt.regex(128)
    strings = RegexStrings(pattern, random.Random(0), TRAPS)
    drawn = [strings.draw() for _ in range(DRAWS)]
    assert any("Score: 5" in t[:-1] for t in drawn)
    assert {len(t) for t in drawn} >= {width(pattern)[0], width(pattern)[1]}


# The parsers' happy-path answers (tests/infer/protocol/test_parsing.py) and the prompt sets' own formats.
HAPPY = {
    ("online_mind2web", "key_screenshot"): [
        "**Reasoning**: a login page.\n\n**Score**: 2",
        "**Reasoning**: shows a Credit Score 750 field.\n\n**Score**: 4",
        "1. **Reasoning**: The cart shows two iPads.\n2. **Score**: 5",
    ],
    ("general", "key_screenshot"): ["### Reasoning: the search results are sorted by price.\n### Score: 3"],
    ("online_mind2web", "outcome"): [
        'Thoughts: fine.\nStatus: "success"',
        'Thoughts: no.\nStatus: "failure"',
    ],
    ("general", "outcome"): ['Thoughts: the filter is applied.\nSo it is done.\nStatus: "success"'],
    ("online_mind2web", "key_points"): ["**Key Points**:\n1. Find a hotel\n2. Sort by price"],
    ("general", "key_points"): ["**Key Points**:\n1. Search for iPad\n2. Filter by highest rating"],
}


@pytest.mark.parametrize(("variant", "step"), list(HAPPY))
def test_the_parsers_happy_answers_fit_the_patterns(variant, step):
    fmt = answer_format(variant, step)
    for text in HAPPY[(variant, step)]:
        assert re.fullmatch(fmt.regex(1024), text), text
        _check(fmt, text)


def test_a_limit_too_small_is_refused():
    fmt = answer_format("online_mind2web", "key_screenshot")
    with pytest.raises(AnswerFormatError, match=f"needs max_tokens >= {fmt.min_tokens()}"):
        fmt.regex(fmt.min_tokens() - 1)


def _endpoint(**kw) -> EndpointConfig:
    return EndpointConfig(base_url="http://127.0.0.1:8000/v1", model="m", api_key_env=None, **kw)


def test_only_a_constrained_endpoint_sends_the_format():
    fmt = answer_format("online_mind2web", "outcome")
    messages = [{"role": "user", "content": "x"}]
    free = build_payload(_endpoint(), messages, answer_format=fmt)
    assert "structured_outputs" not in free
    held = build_payload(_endpoint(constrained=True, max_tokens=200), messages, answer_format=fmt)
    assert held["structured_outputs"] == {"regex": fmt.regex(200)}
    # the call's own limit decides the pattern's length
    shorter = build_payload(_endpoint(constrained=True), messages, max_tokens=64, answer_format=fmt)
    assert shorter["structured_outputs"] == {"regex": fmt.regex(64)}


BASE = {
    "judge": {"base_url": "http://127.0.0.1:8000/v1", "model": "j", "api_key_env": None},
    "scorer": {"endpoint": {"base_url": "http://127.0.0.1:8001/v1", "model": "s", "api_key_env": None}},
}


def _config(tmp_path, *overrides: str) -> JudgeRunConfig:
    import yaml

    path = tmp_path / "judge.yaml"
    path.write_text(yaml.safe_dump(BASE))
    return load_config(JudgeRunConfig, path, list(overrides))


def test_constrained_is_per_role_off_by_default_and_recorded(tmp_path):
    free = _config(tmp_path)
    assert free.constrained_roles() == [] and CONSTRAINED not in protocol_fingerprint(free)
    assert constrained_text(protocol_fingerprint(free)) is None
    judge_only = _config(tmp_path, "judge.constrained=true")
    assert protocol_fingerprint(judge_only)[CONSTRAINED] == ["judge"]
    both = _config(tmp_path, "judge.constrained=true", "scorer.endpoint.constrained=true")
    assert protocol_fingerprint(both)[CONSTRAINED] == ["judge", "scorer"]
    assert "judge and scorer's answers were constrained" in constrained_text(protocol_fingerprint(both))


def test_reference_mode_and_small_limits_refuse_constrained_answers(tmp_path):
    with pytest.raises(
        ConfigError, match="scorer.endpoint.constrained=true with pipeline.parse_mode=reference"
    ):
        _config(tmp_path, "scorer.endpoint.constrained=true", "pipeline.parse_mode=reference")
    least = answer_format("online_mind2web", "key_screenshot").min_tokens()
    with pytest.raises(ConfigError, match=f"scorer.endpoint.max_tokens=20 .* set it to {least} or more"):
        _config(tmp_path, "scorer.endpoint.constrained=true", "scorer.endpoint.max_tokens=20")
    with pytest.raises(ConfigError, match="pipeline.outcome_max_tokens=16 .* constrained outcome"):
        _config(tmp_path, "judge.constrained=true", "pipeline.outcome_max_tokens=16")


def test_preflight_refuses_a_constrained_endpoint_not_known_to_be_vllm():
    """An API judge (here the fake OpenAI server, whose model card is not vLLM's) is refused in one line
    naming the key; the same endpoint unconstrained passes. (A vLLM server passes: tests/e2e/test_demo.py.)"""
    from keyshot.infer.client.preflight import PreflightError, preflight
    from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge

    with FakeOpenAI(make_judge(), model="gpt-4o") as server:
        held = EndpointConfig(base_url=server.base_url, model="gpt-4o", api_key_env=None, constrained=True)
        with pytest.raises(PreflightError) as refused:
            preflight([held], sections=["judge"])
        line = str(refused.value)
        assert "\n" not in line and "judge.constrained=true needs a vLLM server" in line
        assert "owned_by 'keyshot-tests', not 'vllm'" in line and line.endswith("set judge.constrained=false")
        free = EndpointConfig(base_url=server.base_url, model="gpt-4o", api_key_env=None)
        preflight([free], sections=["judge"])
        assert server.stats.completions_served == 0  # nothing was asked, constrained or not
