"""keyshot synth run against two local teacher servers: labels, resume, faults, budgets, cost estimate."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.labelling_run import run_synth
from keyshot.data_synth.labels import LABELS_FILE, read_store
from keyshot.data_synth.run_folder import read_usage
from keyshot.data_synth.sources import load_human_labels
from keyshot.data_synth.teachers import image_token_count
from keyshot.infer.client.preflight import PreflightError
from keyshot.infer.protocol.images import DEFAULT_POLICY, REFERENCE_POLICY, visual_tokens
from keyshot.infer.protocol.parsing import parse_key_points
from keyshot.infer.testing.fake_openai import FakeOpenAI, key_points_answer, make_teacher
from tests.support import paths
from tests.support.synth_env import (
    FIXTURES,
    RULES,
    expected_scores,
    fixture_trajectories,
    synth_config,
    teacher_set,
)

N_TRAJ = 6
N_SHOTS = 20


@pytest.fixture(scope="module")
def teacher_servers():
    with FakeOpenAI(make_teacher(RULES["bright"])) as bright, FakeOpenAI(make_teacher(RULES["dark"])) as dark:
        yield {"bright": bright, "dark": dark}


def _urls(servers) -> dict[str, str]:
    return {name: srv.base_url for name, srv in servers.items()}


def _requests(servers) -> int:
    return sum(srv.stats.requests for srv in servers.values())


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, teacher_servers):
    """One complete labelling run (no dataset build) shared by the read-only tests below."""
    tmp = tmp_path_factory.mktemp("synth")
    cfg = synth_config(tmp / "synth.yaml", tmp / "run", teacher_set(_urls(teacher_servers)))
    before = _requests(teacher_servers)
    report = run_synth(cfg, build=False)
    return cfg, report, _requests(teacher_servers) - before


def test_every_screenshot_is_labelled_by_every_teacher(finished_run):
    cfg, report, requests = finished_run
    contents = read_store(Path(cfg.run_dir) / LABELS_FILE)
    trajs = fixture_trajectories()
    assert len(trajs) == N_TRAJ and sum(t.num_screenshots for t in trajs) == N_SHOTS
    assert set(contents.trajectories) == {t.uid for t in trajs}
    assert report.labels_new == 2 * N_SHOTS and report.labels_failed == 0
    # one key-point call per trajectory and one call per (screenshot, teacher): nothing asked twice
    assert requests == N_TRAJ + 2 * N_SHOTS
    for traj in trajs:
        kp = contents.key_points[(traj.uid, "judge")]
        assert kp.valid and kp.key_points.strip()
        for name, rule in RULES.items():
            got = [contents.labels[(traj.uid, i, name)].score for i in range(traj.num_screenshots)]
            assert got == expected_scores(traj, rule), (traj.uid, name)
            assert all(contents.labels[(traj.uid, i, name)].thought for i in range(traj.num_screenshots))


def test_second_run_resumes_without_a_single_call(finished_run, teacher_servers):
    cfg, _, _ = finished_run
    before = _requests(teacher_servers)
    report = run_synth(cfg, build=False)
    assert _requests(teacher_servers) == before
    assert report.labels_new == 0 and report.labels_skipped == 2 * N_SHOTS
    assert report.estimate.calls == 0


def test_lost_label_lines_are_answered_by_the_cache(finished_run, teacher_servers, tmp_path):
    cfg, _, _ = finished_run
    run = tmp_path / "run"
    shutil.copytree(cfg.run_dir, run)
    labels = (run / LABELS_FILE).read_text(encoding="utf-8").splitlines()
    kept = [line for line in labels if json.loads(line)["kind"] != "label"][: N_TRAJ * 2]
    # also leave a torn half line at the end, as a kill -9 in the middle of a write would
    (run / LABELS_FILE).write_text(
        "\n".join(kept) + "\n" + labels[-1][: len(labels[-1]) // 2], encoding="utf-8"
    )
    before = _requests(teacher_servers)
    cfg.run_dir = str(run)
    report = run_synth(cfg, build=False)
    assert _requests(teacher_servers) == before, "a call whose label line was lost was paid again"
    assert report.labels_new == 2 * N_SHOTS
    contents = read_store(run / LABELS_FILE)
    assert sum(lb.cached for lb in contents.labels.values()) == 2 * N_SHOTS


def test_faulty_teacher_is_retried_and_its_failures_recorded(tmp_path):
    # "flaky": 5xx, timeouts, drops and malformed bodies on 30% of requests, retried by the client;
    # "garbage": a third of the screenshots always get an answer without a score.
    faults = {"500": 0.1, "503": 0.05, "disconnect": 0.1, "malformed": 0.05}
    with (
        FakeOpenAI(make_teacher("brightness"), faults=faults) as flaky,
        FakeOpenAI(make_teacher("darkness", garbage_rate=0.34)) as garbage,
        FakeOpenAI(make_teacher("red_fraction"), faults={"500": 1.0}) as down,
    ):
        urls = {"flaky": flaky.base_url, "garbage": garbage.base_url, "down": down.base_url}
        teachers = teacher_set(urls, flaky={"max_retries": 8}, down={"max_retries": 1, "breaker_window_s": 0})
        teachers["key_points_judge"]["endpoint"]["max_retries"] = 8
        cfg = synth_config(tmp_path / "synth.yaml", tmp_path / "run", teachers)
        report = run_synth(cfg, build=False)
        assert flaky.stats.total_faults > 0
        down_requests = down.stats.requests

    contents = read_store(tmp_path / "run" / LABELS_FILE)
    by_teacher = {n: [lb for (_, _, t), lb in contents.labels.items() if t == n] for n in urls}
    assert len(by_teacher["flaky"]) == len(by_teacher["garbage"]) == N_SHOTS
    assert all(lb.valid for lb in by_teacher["flaky"]), "transient faults must be retried away"
    bad = [lb for lb in by_teacher["garbage"] if not lb.valid]
    assert 0 < len(bad) < N_SHOTS
    assert all(lb.error.startswith("unparseable answer") and lb.score is None for lb in bad)
    # the teacher that fails every request trips its breaker (8 failures in a row) and is stopped:
    # its failed calls are recorded as such (no label), and the run says it is down
    down_labels = by_teacher["down"]
    assert all(not lb.valid and "HTTP 500" in lb.error for lb in down_labels)
    assert down_requests <= 8 + 8  # the breaker's limit plus the requests already in flight
    assert len(report.endpoints_down) == 1 and "'down'" in report.endpoints_down[0]
    assert report.exit_code == 4
    assert report.labels_failed == len(bad) + len(down_labels)

    # the run folder still builds: failed labels are dropped, the others aggregated
    from keyshot.data_synth.dataset import build_dataset

    result = build_dataset(tmp_path / "run")
    assert result.report.teacher_labels["down"] == {"valid": 0, "invalid": len(down_labels)}
    assert sum(result.meta.rows.values()) == N_SHOTS


def test_failed_calls_are_asked_again_by_a_plain_rerun(tmp_path):
    with FakeOpenAI(make_teacher("brightness"), faults={"500": 1.0}) as down:
        teachers = teacher_set({"t": down.base_url})
        teachers["key_points_judge"]["endpoint"]["max_retries"] = 0
        cfg = synth_config(tmp_path / "s.yaml", tmp_path / "run", teachers)
        report = run_synth(cfg, build=False)
    assert report.key_points_failed == N_TRAJ and report.labels_new == 0
    assert report.calls_failed == N_TRAJ and report.exit_code == 3  # incomplete: re-run to retry
    with FakeOpenAI(make_teacher("brightness")) as healthy:
        cfg = synth_config(tmp_path / "s.yaml", tmp_path / "run", teacher_set({"t": healthy.base_url}))
        report = run_synth(cfg, build=False)  # no --retry-failed needed: a failed call made no label
        assert report.labels_new == N_SHOTS and report.labels_failed == 0 and report.exit_code == 0
        assert healthy.stats.requests == N_TRAJ + N_SHOTS
        # --retry-failed re-asks only unreadable answers; there are none, so nothing is sent
        assert run_synth(cfg, build=False, retry_failed=True).labels_new == 0
        assert healthy.stats.requests == N_TRAJ + N_SHOTS


def test_budget_cap_stops_a_teacher_and_a_later_run_finishes(tmp_path, teacher_servers):
    urls = _urls(teacher_servers)
    # the fake server counts ~1,600 prompt tokens per screenshot request: ~$1.6e-3 a call at $1/Mtok
    costly = {"price_input_per_mtok": 1.0, "budget_usd": 0.004, "max_concurrency": 1}
    cfg = synth_config(tmp_path / "s.yaml", tmp_path / "run", teacher_set(urls, dark=costly))
    report = run_synth(cfg, build=False)
    assert report.budget_stopped == ["dark"]
    contents = read_store(tmp_path / "run" / LABELS_FILE)
    dark = [lb for (_, _, t), lb in contents.labels.items() if t == "dark"]
    assert 1 <= len(dark) < N_SHOTS and all(lb.valid for lb in dark)
    spent = report.usage["dark"]["cost_usd"]
    assert 0.004 <= spent <= 0.004 + 0.003
    # the budget covers the run folder, not one session: resuming with the same cap sends nothing
    dark_requests = teacher_servers["dark"].stats.requests
    report = run_synth(cfg, build=False)
    assert report.budget_stopped == ["dark"] and teacher_servers["dark"].stats.requests == dark_requests
    assert read_usage(tmp_path / "run")["dark"]["cost_usd"] == pytest.approx(spent)
    costly["budget_usd"] = 1.0
    cfg = synth_config(tmp_path / "s.yaml", tmp_path / "run", teacher_set(urls, dark=costly))
    report = run_synth(cfg, build=False)
    assert report.budget_stopped == [] and report.labels_new == N_SHOTS - len(dark)


def test_dry_run_estimates_cost_and_makes_no_call(tmp_path, teacher_servers):
    urls = _urls(teacher_servers)
    priced = {"price_input_per_mtok": 2.5, "price_output_per_mtok": 10.0}
    cfg = synth_config(tmp_path / "s.yaml", tmp_path / "run", teacher_set(urls, bright=priced))
    before = _requests(teacher_servers)
    report = run_synth(cfg, dry_run=True)
    assert _requests(teacher_servers) == before
    assert not (tmp_path / "run" / LABELS_FILE).exists()
    est = report.estimate
    assert est.trajectories == N_TRAJ and est.screenshots == N_SHOTS
    assert est.endpoints["judge"].calls == N_TRAJ
    assert est.endpoints["bright"].calls == est.endpoints["dark"].calls == N_SHOTS
    image_tokens = sum(
        visual_tokens(*shot.load().size, DEFAULT_POLICY)
        for t in fixture_trajectories()
        for shot in t.screenshots
    )
    bright = est.endpoints["bright"]
    assert bright.prompt_tokens > image_tokens  # images plus the prompt text
    assert bright.completion_tokens == 50 * N_SHOTS
    assert bright.cost_usd == pytest.approx(
        (bright.prompt_tokens * 2.5 + bright.completion_tokens * 10.0) / 1e6
    )
    assert est.endpoints["dark"].cost_usd == 0.0
    assert "bright" in report.summary() and "dry run" in report.summary()


def test_image_token_rules_for_a_1280x720_screenshot():
    assert image_token_count("qwen", 1280, 720) == visual_tokens(1280, 720) == 46 * 26
    assert image_token_count("openai_tiles", 1280, 720) == 85 + 170 * 6
    # sent as 1288x728 (the default policy rounds to 28 px): 41 x 23 patches of 32 px
    assert image_token_count("openai_patches:1.62", 1280, 720) == math.ceil(41 * 23 * 1.62)
    # a full page sent unresized is capped at 1,536 patches
    assert image_token_count("openai_patches:1.62", 1280, 4000, REFERENCE_POLICY) == math.ceil(1536 * 1.62)
    assert image_token_count("claude", 1280, 720) == -(-1288 * 728 // 750)
    assert image_token_count("765", 1280, 720) == 765


def test_human_labels_join_from_online_mind2web_file():
    labels = load_human_labels(FIXTURES / "online_mind2web" / "human_label.json", "SeeAct")
    assert len(labels) == 300 and set(labels.values()) <= {"success", "failure", "not_executable"}
    assert load_human_labels(
        FIXTURES / "online_mind2web" / "human_label.json", "browser use"
    ) == load_human_labels(FIXTURES / "online_mind2web" / "human_label.json", "Browser_Use")
    with pytest.raises(SynthError, match="no human labels for agent 'Nobody'"):
        load_human_labels(FIXTURES / "online_mind2web" / "human_label.json", "Nobody")


def test_key_points_come_from_the_judge(finished_run):
    cfg, _, _ = finished_run
    contents = read_store(Path(cfg.run_dir) / LABELS_FILE)
    for traj in fixture_trajectories():
        answer = key_points_answer(traj.task)  # what the fake judge says for this task
        assert contents.key_points[(traj.uid, "judge")].key_points == parse_key_points(answer)


def test_missing_api_key_is_refused_before_any_call(tmp_path, monkeypatch):
    monkeypatch.delenv("KEYSHOT_TEST_MISSING_KEY", raising=False)
    teachers = teacher_set({"remote": "https://api.example.com/v1"})
    teachers["teachers"][0]["endpoint"]["api_key_env"] = "KEYSHOT_TEST_MISSING_KEY"
    cfg = synth_config(tmp_path / "s.yaml", tmp_path / "run", teachers)
    with pytest.raises(PreflightError, match="environment variable KEYSHOT_TEST_MISSING_KEY is not set"):
        run_synth(cfg)
    assert not (tmp_path / "run" / LABELS_FILE).exists()


def test_outcome_verdicts_feed_the_human_label_filter(tmp_path, teacher_servers):
    from datasets import load_from_disk

    cfg = synth_config(
        tmp_path / "s.yaml",
        tmp_path / "run",
        teacher_set(_urls(teacher_servers)),
        outcome=True,
        build={
            "splits": {"agents": {"train": ["SeeAct", "DemoAgent-gpt-4o", "Agent-E", "Operator"]}},
            "aggregation": {"outcome_filter": "per_teacher"},
        },
    )
    report = run_synth(cfg)
    assert report.outcomes_new == 2 * N_TRAJ
    contents = read_store(tmp_path / "run" / LABELS_FILE)
    dropped_teachers = {}
    for traj in fixture_trajectories():
        for name, rule in RULES.items():
            # the fake judge says success iff at least one kept (score >= 3) screenshot is attached
            want = any(score >= 3 for score in expected_scores(traj, rule))
            assert contents.outcomes[(traj.uid, name)].success is want
            if traj.human_label is not None and want != (traj.human_label == "success"):
                dropped_teachers.setdefault(traj.uid, set()).add(name)
    assert dropped_teachers, "the fixture should exercise the filter"
    for row in load_from_disk(str(report.dataset.path))["train"]:
        used = {t["teacher"] for t in row["teacher_scores"]}
        assert used == set(RULES) - dropped_teachers.get(row["uid"], set())


def test_synthesis_writes_no_secret(tmp_path, monkeypatch, capsys):
    key, password = "sk-live-SYNTH-SECRET-0123456789", "synth-url-password-42"
    monkeypatch.setenv("KEYSHOT_TEST_TEACHER_KEY", key)
    with FakeOpenAI(make_teacher("brightness"), faults={"500": 0.2}, leak_auth_in_errors=True) as server:
        url = server.base_url.replace("http://", f"http://user:{password}@")
        teachers = teacher_set({"t": url}, t={"api_key_env": "KEYSHOT_TEST_TEACHER_KEY", "max_retries": 6})
        cfg = synth_config(tmp_path / "s.yaml", tmp_path / "run", teachers)
        report = run_synth(cfg)
        assert server.stats.total_faults > 0 and report.dataset is not None
    printed = capsys.readouterr()
    for secret in (key, password):
        assert secret not in printed.out + printed.err + report.summary()
        for path in (tmp_path / "run").rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path


def _general_teacher():
    """A teacher answering in the `general` prompt set's format, with a two-paragraph reasoning."""
    from keyshot.infer.testing.fake_openai import (
        decode_image,
        identify_step,
        make_judge,
        score_image,
        user_parts,
    )

    judge = make_judge()

    def respond(request: dict) -> str:
        if identify_step(request) != "key_screenshot":
            return judge(request)
        image = decode_image(user_parts(request)[1][0])
        score = score_image("brightness", image)
        return (
            f"### Reasoning: The screenshot is a page of mean brightness {int(np.asarray(image.convert('L')).mean())}."
            f"\n\nIts second paragraph explains why it rates {score}.\n### Score: {score}"
        )

    return respond


def test_general_variant_targets_split_the_teacher_answer_like_judge_does(tmp_path):
    """Synthesis and `keyshot judge` read a `general` answer with the same rule (one implementation of
    the parse): the whole reasoning, both paragraphs, and the score after `### Score`."""
    from datasets import load_from_disk

    from keyshot.infer.cli import main as keyshot
    from keyshot.infer.protocol.verdicts import read_verdicts

    with FakeOpenAI(_general_teacher()) as server:
        teachers = teacher_set({"t": server.base_url})
        cfg = synth_config(tmp_path / "s.yaml", tmp_path / "run", teachers, prompt_variant="general")
        run_synth(cfg)
        out = tmp_path / "judged"
        argv = ["judge", str(FIXTURES / "trajectories" / "online_mind2web_v1"), "--no-progress"]
        argv += ["--config", str(paths.REPO / "configs/judge/webjudge7b.yaml"), f"out={out}"]
        argv += [f"judge.base_url={server.base_url}", "judge.api_key_env=null", "judge.model=fake-t"]
        argv += [f"scorer.endpoint.base_url={server.base_url}", "scorer.endpoint.model=fake-t"]
        argv += ["scorer.logprobs=null", "pipeline.prompt_variant=general", "agent=SeeAct"]
        assert keyshot(argv) == 0
    judged = {(v.task_id, s.index): s for v in read_verdicts(out / "verdicts.jsonl") for s in v.screenshots}
    labels = read_store(tmp_path / "run" / LABELS_FILE).labels
    compared = 0
    for (uid, step, _), label in labels.items():
        task_id = uid.rsplit("/", 1)[-1]
        if (task_id, step) in judged:
            assert (
                label.thought == judged[(task_id, step)].thought
                and label.score == judged[(task_id, step)].score
            )
            assert "second paragraph" in label.thought and "### Score" not in label.thought
            compared += 1
    assert compared == len(judged) > 0
    rows = load_from_disk(str(tmp_path / "run" / "dataset"))
    answers = [a for split in rows.values() for a in split["answer"]]
    assert answers and all("second paragraph" in a for a in answers)
