"""``keyshot report``: structure checked with a real HTML parser (fast tier); the browser tests are in
tests/infer/report/test_report_browser.py (slow tier, headless Chromium)."""

from __future__ import annotations

import html
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.report.model import load_run
from tests.support import paths
from tests.support.report_pages import XSS, Page, judged_run

REPO = paths.REPO


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, Path]:
    run = judged_run(tmp_path_factory.mktemp("report"))
    assert keyshot(["report", str(run), "--no-progress"]) == 0
    return run, run / "report"


def test_index_holds_config_counts_metrics_plots_and_every_trajectory(report):
    run, out = report
    index = Page((out / "index.html").read_text())
    verdicts = read_verdicts(run / "verdicts.jsonl")
    rows = json.loads(
        index.scripts[
            [
                i
                for i, (t, a) in enumerate(t for t in index.tags if t[0] == "script")
                if a.get("id") == "rows"
            ][0]
        ]
        if False
        else next(s for s in index.scripts if s.startswith("["))
    )
    assert len(rows) == len(verdicts) == 12
    text = " ".join(index.text)
    for needed in (
        "Protocol that produced these verdicts",
        "online_mind2web@",
        "fake-judge",
        "fake-scorer",
        "Agreement and success rates",
        "Precision / recall / F1",
    ):
        assert needed in text, needed
    images = [img for img in index.find("img") if "src" in img]  # (the lightbox has none until opened)
    assert {img["src"] for img in images} == {"plots/scores.png", "plots/agents.png", "plots/confusion.png"}
    for img in images:
        assert (out / img["src"]).stat().st_size > 1000
    assert index.find("link", rel="stylesheet")[0]["href"] == "./static/report.css"
    disagreements = [r for r in rows if r["agree"] is False]
    truths = {r["truth"] for r in rows}
    assert disagreements and truths == {"success", "failure", "not_executable"}
    assert [r["kind"] for r in rows].count("not executable") == 1


def pages_by_task(out: Path) -> dict[str, Path]:
    index = Page((out / "index.html").read_text())
    rows = json.loads(next(s for s in index.scripts if s.startswith("[")))
    return {r["task_id"]: out / r["href"] for r in rows}


def test_trajectory_page_shows_every_screenshot_its_score_and_kept_marker(report):
    run, out = report
    pages = pages_by_task(out)
    v = next(v for v in read_verdicts(run / "verdicts.jsonl") if v.task_id == "task-00003")
    page = Page(pages["task-00003"].read_text())
    thumbs = [a for a in page.find("img") if a.get("src", "").startswith("../images/")]
    assert len(thumbs) == len(v.screenshots) == 4
    assert all((out / "trajectories" / a["src"]).is_file() for a in thumbs)
    zoom = [a for t, a in page.tags if t == "a" and a.get("class") == "zoom"]
    assert len(zoom) == 4 and all((out / "trajectories" / a["href"]).is_file() for a in zoom)
    text = " ".join(page.text)
    assert text.count("kept") - text.count("not kept") >= len(v.kept)
    assert len([a for t, a in page.tags if t == "div" and a.get("class") == "shot kept"]) == len(v.kept)
    for s in v.screenshots:
        assert f"score {s.score}" in text and s.thought[:40] in text
        assert f"expected {s.expected_score:.2f}" in text
    assert v.outcome_text.splitlines()[0][:40] in text
    dup = Page(pages["task-00002"].read_text())
    assert "same image as #0: scored once" in " ".join(dup.text)


def test_strings_are_escaped_and_no_machine_path_leaks(report):
    run, out = report
    for path in [out / "index.html", *sorted((out / "trajectories").glob("*.html"))]:
        raw = path.read_text()
        assert "<script>document" not in raw and "<img src=x" not in raw  # only escaped forms
        assert str(run.parent) not in raw and "/tmp/" not in raw, path
        for _tag, attrs in Page(raw).tags:
            for key in ("src", "href"):
                if key in attrs:
                    assert not attrs[key].startswith(("/", "file:", "http")), (path, attrs)
    first = Page(pages_by_task(out)["task-00000"].read_text())
    assert XSS in " ".join(first.text)  # shown as text
    assert all(not s.strip().startswith("document.body") for s in first.scripts)


def test_no_file_of_the_report_holds_a_path_of_the_machine(report):
    """A report folder is made to be shared: the run's and the input's absolute paths appear nowhere
    in it (pages, thumbnail index, scripts, images)."""
    run, out = report
    machine_paths = {
        str(p).encode() for p in (run, run.parent / "world", run.resolve(), run.parent.resolve())
    }
    files = [p for p in out.rglob("*") if p.is_file()]
    assert (
        out / "images" / "index.json" in files
        and len(json.loads((out / "images" / "index.json").read_text())) >= 12
    )
    for path in files:
        data = path.read_bytes()
        assert not any(machine in data for machine in machine_paths), path


def test_rebuild_reuses_thumbnails_and_released_records_render(report, tmp_path, caplog):
    run, out = report
    import logging

    caplog.set_level(logging.INFO)
    started = time.perf_counter()
    assert keyshot(["report", str(run), "--no-progress"]) == 0
    assert "0 screenshots converted" in caplog.text and time.perf_counter() - started < 30
    records = paths.FIXTURES / "arb_records"
    assert keyshot(["report", str(records), "--out", str(tmp_path / "arb"), "--no-progress"]) == 0
    rows = next(s for s in Page((tmp_path / "arb" / "index.html").read_text()).scripts if s.startswith("["))
    assert len(json.loads(rows)) >= 1


def test_report_of_an_empty_or_missing_run_is_a_clear_error(tmp_path, capsys):
    assert keyshot(["report", str(tmp_path / "nothing")]) == 2
    assert "no such run folder" in capsys.readouterr().err


def test_metrics_png_style_plots_say_no_data(tmp_path):
    from keyshot.infer.report import plots

    png = plots.agent_success_rates(None)
    assert png.startswith(b"\x89PNG") and len(png) > 1000
    assert re.search(rb"IDAT", plots.confusion_matrix([]))


def test_a_run_with_a_corrupt_summary_or_run_file_is_reported_with_a_warning(report, tmp_path, caplog):
    run, _ = report
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("report"))
    (copy / "summary.json").write_text("{torn")
    (copy / "run.json").write_bytes(b"\xff\xfe")
    caplog.set_level("WARNING")
    loaded = load_run(copy)
    assert loaded.summary == {} and loaded.protocol == loaded.verdicts[0].config  # from the verdicts
    assert "summary.json: unreadable" in caplog.text and "run.json: not a keyshot run file" in caplog.text
    assert keyshot(["report", str(copy), "--no-progress"]) == 0


def test_pages_show_the_agents_actions_and_the_table_tells_runs_apart(report):
    """What the judge read beside each screenshot: the agent's action on that page (and its thought); the
    index's rows carry task id and run, and its title names the agent, not the folder ("run")."""
    from keyshot.infer.loaders import load_trajectories

    run, out = report
    v = next(v for v in read_verdicts(run / "verdicts.jsonl") if v.task_id == "task-00003")
    [t] = [t for t in load_trajectories(v.source) if t.task_id == "task-00003"]
    text = " ".join(Page(pages_by_task(out)["task-00003"].read_text()).text)
    assert t.actions and all(action in text for action in t.actions[: len(t.screenshots)])
    assert text.count("action:") == min(len(t.actions), len(t.screenshots))
    index = Page((out / "index.html").read_text())
    rows = json.loads(next(s for s in index.scripts if s.startswith("[")))
    assert all({"task_id", "run"} <= set(r) for r in rows)
    headers = [a.get("data-key") for t_, a in index.tags if t_ == "th" and "data-key" in a]
    assert headers[:3] == ["agent", "task_id", "run"]
    title = " ".join(index.text).split("·")[0]
    assert "synthetic-agent" in title and "keyshot report: run" not in title


def test_report_and_metrics_of_agent_runs_say_to_judge_them_first(tmp_path, capsys):
    """Raw agent runs are named a trajectory folder with the command to run first; the failed report
    leaves no report folder (nor its lock) beside the input."""
    raw = tmp_path / "runs"
    shutil.copytree(paths.FIXTURES / "trajectories" / "agentlab", raw)
    assert keyshot(["report", str(raw), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a trajectory folder" in err and f"keyshot judge {raw}" in err
    assert not (tmp_path / "report").exists()
    assert keyshot(["metrics", str(raw), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "is a trajectory folder" in err and "not a WebJudge reference record" not in err


def test_a_stand_in_run_says_so_in_its_report_and_every_metrics_table(report, tmp_path):
    from keyshot.infer.runs.run_record import mark_stand_in, read_protocol

    run, _ = report
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("report", ".lock"))
    protocol = read_protocol(copy)
    mark_stand_in(copy, "STAND-IN VERDICTS: noise")
    assert read_protocol(copy) == protocol  # the mark sits beside the protocol
    assert keyshot(["report", str(copy), "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    index = (tmp_path / "r" / "index.html").read_text()
    assert '<div class="banner">STAND-IN VERDICTS: noise</div>' in index
    assert "STAND-IN VERDICTS: noise" in (tmp_path / "r" / "trajectories" / "00000.html").read_text()
    assert keyshot(["metrics", str(copy), "--out", str(tmp_path / "m")]) == 0
    markdown = (tmp_path / "m" / "metrics.md").read_text()
    assert markdown.count("**STAND-IN VERDICTS: noise**") == 3  # above the counts and both tables


def test_each_screenshot_shows_the_key_points_first_met_there(tmp_path):
    """keyshot judge with pipeline.step_rewards=true, then keyshot report: each screenshot's card names the
    key points the judge says were first met there, and its progress; run.json says the step question was
    asked."""
    from keyshot.infer.protocol.parsing import split_key_points
    from keyshot.infer.report.model import first_met_here

    run = judged_run(tmp_path, 3, 4, "pipeline.step_rewards=true")
    assert json.loads((run / "run.json").read_text())["protocol"]["step_rewards"] is True
    assert keyshot(["report", str(run), "--no-progress"]) == 0
    pages = pages_by_task(run / "report")
    verdicts = read_verdicts(run / "verdicts.jsonl")
    shown = 0
    for v in verdicts:
        here = first_met_here(v)
        assert sum(map(len, here.values())) == sum(s is not None for s in v.key_point_steps)
        cards = re.split(r'<div class="shot(?: kept)?">', pages[v.task_id].read_text())[1:]
        assert len(cards) == len(v.screenshots)
        for s, card, progress in zip(v.screenshots, cards, v.step_progress, strict=True):
            assert f"progress {100 * progress:.0f}%" in card
            met = here.get(s.index)
            assert ("first met here" in card) == bool(met)
            for point in met or []:
                assert html.escape(point)[:30] in card  # escaped: the first task plants a script
                shown += 1
        assert set(split_key_points(v.key_points)) >= {p for ps in here.values() for p in ps}
    assert shown > 0
