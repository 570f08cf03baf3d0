"""The report tests' ``Page`` (one HTML page parsed) and ``judged_run`` (a run with a planted ``XSS``)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from keyshot.infer.cli import main as keyshot
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from keyshot.infer.testing.worlds import synthetic_trajectories
from tests.support import paths

REPO = paths.REPO
XSS = '<script>document.body.setAttribute("data-pwned","1")</script><img src=x onerror="document.body.dataset.pwned=1">'


class Page(HTMLParser):
    """Tags, attributes, script bodies and visible text of one page."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._in_script = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        (self.scripts if self._in_script else self.text).append(data)

    def find(self, tag: str, **attrs) -> list[dict]:
        return [a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in attrs.items())]


def judged_run(root: Path, n: int = 12, shots: int = 4, *overrides: str) -> Path:
    """A judged run whose first task carries a planted script and whose labels disagree on purpose;
    ``overrides`` (``key.sub=value``) go to ``keyshot judge``."""
    jsonl = synthetic_trajectories(root / "world", n, shots, seed=2)
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    lines[0]["task"] = "Buy a ticket " + XSS
    for i, line in enumerate(lines):  # ground truth: every third is a failure, one not executable
        line["human_label"] = "not_executable" if i == 1 else ("failure" if i % 3 == 0 else "success")
    lines[2]["screenshots"][1] = lines[2]["screenshots"][0]  # the same image twice: scored once
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = root / "run"
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        argv = ["judge", str(jsonl), "--config", str(REPO / "configs/judge/webjudge7b.yaml"), "--no-progress"]
        argv += [
            f"out={out}",
            f"judge.base_url={judge.base_url}",
            "judge.api_key_env=null",
            "judge.model=fake-judge",
        ]
        argv += [
            f"scorer.endpoint.base_url={scorer.base_url}",
            "scorer.endpoint.model=fake-scorer",
            "scorer.logprobs=2",
            *overrides,
        ]
        assert keyshot(argv) == 0
    return out
