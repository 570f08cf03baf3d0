"""Decompression bombs: screenshots refused from their header, before anything is decoded.

The real ``keyshot reward serve`` (a uvicorn process, fake judge and scorer) is sent eight 13000×13000
1-bit PNGs of about 20 KiB each: the request is answered 413 naming the screenshot, and the service's
peak RSS (the kernel's VmHWM) stays where it was; a tall full-page screenshot still scores. The one
function that decodes a screenshot holds a process-wide pixel budget while it decodes.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

from keyshot.infer.protocol.decode import (
    DECODE_BUDGET,
    MAX_DECODED_PIXELS,
    ImageTooLarge,
    PixelBudget,
    read_header,
)
from keyshot.infer.protocol.images import (
    DEFAULT_POLICY,
    REFERENCE_POLICY,
    ImageError,
    decoded_pixels,
    plan_image,
    prepare_image,
)
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from keyshot.infer.testing.images import encoded, png
from keyshot.infer.testing.launch import start_reward_serve
from tests.support.reward import write_config

BOMB_SIDE = 13_000


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A 13000×13000 1-bit PNG: about 20 KiB on the wire, 169 M pixels (507 MB as RGB) decoded."""
    data = encoded(Image.new("1", (BOMB_SIDE, BOMB_SIDE), 1))
    assert len(data) < 64 * 1024
    return data


def peak_rss_bytes(pid: int) -> int:
    """The kernel's high-water mark of a process's resident memory (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


# ---------------------------------------------------------------------------------------------- the guard
def test_a_bomb_is_refused_from_its_header_naming_it_and_what_a_screenshot_can_be(bomb, tmp_path):
    path = tmp_path / "bomb.png"
    path.write_bytes(bomb)
    header = read_header(path)
    assert header.size == (BOMB_SIDE, BOMB_SIDE)
    assert decoded_pixels(header, DEFAULT_POLICY) == BOMB_SIDE**2 > MAX_DECODED_PIXELS
    before = peak_rss_bytes(os.getpid())
    with pytest.raises(ImageError) as caught:
        prepare_image(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: image of 13000×13000 pixels")
    assert "a screenshot at most" in message and "\n" not in message
    with pytest.raises(ImageError, match=r"^<\d+ bytes>: image of 13000×13000 pixels"):
        prepare_image(bomb)
    assert peak_rss_bytes(os.getpid()) - before < 64 * 2**20  # nothing was decoded


def test_a_tall_full_page_is_decoded_only_down_to_the_policys_crop(tmp_path):
    """1280×30000: 38 M pixels as a page, 6.5 M decoded under the 4:1 crop (the reference policy, which
    sends the page whole, decodes it whole and is still within the limit)."""
    tall = tmp_path / "tall.png"
    tall.write_bytes(png(1280, 30_000))
    header = read_header(tall)
    crop_rows = plan_image(1280, 30_000).crop_height
    assert crop_rows <= 4 * 1280 and decoded_pixels(header, DEFAULT_POLICY) == 1280 * crop_rows
    assert decoded_pixels(header, REFERENCE_POLICY) == 1280 * 30_000 <= MAX_DECODED_PIXELS
    prepared = prepare_image(tall)
    assert prepared.cropped and (prepared.source_width, prepared.source_height) == (1280, 30_000)
    assert prepared.height / prepared.width == pytest.approx(4.0, rel=0.02)


def test_a_jpeg_that_decodes_whole_counts_its_whole_size():
    """A JPEG cannot stop at the crop: a 1280×60000 one decodes its whole height (at half scale under
    keyshot's policy, which shrinks it more than 2×; whole, 77 M pixels, under the reference policy,
    which is refused), while a PNG of that size decodes the crop's rows only."""
    jpeg = encoded(Image.new("L", (1280, 60_000), 200), "JPEG")
    header = read_header(jpeg)
    assert decoded_pixels(header, DEFAULT_POLICY) == 640 * 30_000
    assert decoded_pixels(header, REFERENCE_POLICY) == 1280 * 60_000 > MAX_DECODED_PIXELS
    with pytest.raises(ImageError, match=r"image of 1280×60000 pixels .*\(a JPEG image decodes whole\)"):
        prepare_image(jpeg, REFERENCE_POLICY)
    rows = plan_image(1280, 60_000).crop_height
    assert decoded_pixels(read_header(png(1280, 60_000)), DEFAULT_POLICY) == 1280 * rows


def test_pil_keeps_its_own_limit_as_a_second_line(monkeypatch):
    """With keyshot's limit lifted, PIL's decompression-bomb check still refuses what PIL opens or
    decodes whole (a WebP checks at opening, a 16-bit PNG when PIL decodes it)."""
    from keyshot.infer.protocol import decode

    webp = encoded(Image.new("RGB", (100, 100), "white"), "WEBP")
    deep = encoded(Image.new("I;16", (100, 100), 300))
    monkeypatch.setattr(decode, "MAX_DECODED_PIXELS", 1 << 40)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 10,000 pixels is over twice PIL's limit
    for data in (webp, deep):
        with pytest.raises(
            ImageTooLarge, match="over PIL's decompression-bomb limit: .*exceeds limit of 2000 pixels"
        ):
            prepare_image(data)


def test_the_pixel_budget_holds_decodes_beyond_it_until_one_is_released():
    budget = PixelBudget(100)
    order: list[str] = []
    first = budget.hold(80)
    first.__enter__()
    started = threading.Event()

    def second() -> None:
        started.set()
        with budget.hold(50):  # 80 + 50 > 100: waits for the first
            order.append("second")

    worker = threading.Thread(target=second)
    worker.start()
    assert started.wait(5)
    assert budget.wait_for_waiters(1, timeout=5)  # the second decode is blocked on the budget
    assert order == [] and budget.in_use == 80
    order.append("first released")
    first.__exit__(None, None, None)
    worker.join(5)
    assert order == ["first released", "second"] and budget.in_use == 0
    with budget.hold(10_000):  # more than the whole budget: waits for it to be free, then runs alone
        assert budget.in_use == 100


def test_a_child_forked_while_the_budget_is_held_decodes_at_once():
    """A process forks (a DataLoader worker, a multiprocessing pool) while one of its threads holds the
    whole decode budget and another waits for it: those threads are not in the child, so the child's
    budget starts empty and its first screenshot is prepared at once. It used to wait forever for pixels
    no thread of the child would ever release (this test's child was ended by its alarm)."""
    held, release = threading.Event(), threading.Event()

    def hold_everything() -> None:
        with DECODE_BUDGET.hold(DECODE_BUDGET.capacity):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_everything)
    waiter = threading.Thread(target=lambda: prepare_image(png(32, 32)))
    holder.start()
    assert held.wait(10)
    waiter.start()
    assert DECODE_BUDGET.wait_for_waiters(1, timeout=10)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            code = 1
            try:
                signal.alarm(20)  # the old child never got its pixels: the alarm ends it
                code = 0 if prepare_image(png(640, 480)).source_width == 640 else 1
                code = code or (DECODE_BUDGET.in_use != 0)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join(10)
        waiter.join(10)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child waited on its parent's decode budget"
    assert DECODE_BUDGET.in_use == 0  # the parent's own holders released theirs


# ------------------------------------------------------------------------------------- the real service


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    root = tmp_path_factory.mktemp("bombs")
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        config = write_config(root / "reward.yaml", judge, scorer, timeout_s=20, on_failure="zero")
        with start_reward_serve(config, root) as service:
            yield service.url, service.proc


def _rollout(screenshots: list[bytes], rid: str) -> dict:
    return {
        "id": rid,
        "task": "Find the price of the cheapest laptop",
        "screenshots": [base64.b64encode(s).decode() for s in screenshots],
        "actions": ["click('12')"] * len(screenshots),
    }


@pytest.mark.slow
def test_the_service_refuses_eight_bombs_with_413_and_its_memory_stays_flat(service, bomb):
    base, proc = service
    warm = png(1280, 720)
    assert _post(f"{base}/v1/reward", {"rollouts": [_rollout([warm], "warm")]})[0] == 200
    before = peak_rss_bytes(proc.pid)
    status, body = _post(f"{base}/v1/reward", {"rollouts": [_rollout([warm] + [bomb] * 8, "bombs")]})
    grown = peak_rss_bytes(proc.pid) - before
    print(f"8 bombs: status {status}, peak RSS +{grown / 2**20:.0f} MiB")
    assert status == 413, body
    assert body["error"].startswith("rollout 0#screenshot1: image of 13000×13000 pixels")
    assert "\n" not in body["error"]
    assert grown < 200 * 2**20, f"peak RSS grew {grown / 2**20:.0f} MiB"


@pytest.mark.slow
def test_the_service_scores_a_tall_full_page_screenshot(service):
    base, _ = service
    status, body = _post(
        f"{base}/v1/reward", {"rollouts": [_rollout([png(1280, 720), png(1280, 30_000)], "tall")]}
    )
    assert status == 200, body
    (result,) = body["results"]
    assert result["id"] == "tall" and result["error"] is None and result["reward"] in (0.0, 1.0)


def test_a_request_whose_screenshots_decode_too_much_in_all_is_refused(tmp_path, servers):
    """The per-request bound: screenshots each fine, too many pixels together (413, one line)."""
    pytest.importorskip("fastapi")
    from keyshot.reward.model import RewardModel
    from keyshot.reward.service import BadRequest, RewardService, ServiceLimits

    judge, scorer = servers
    rm = RewardModel.from_config(write_config(tmp_path / "reward.yaml", judge, scorer, on_failure="zero"))
    try:
        shot = png(1280, 720)  # 1288×728 after the policy, 921,600 pixels decoded
        service = RewardService(rm, ServiceLimits(allow_root=str(tmp_path), max_decoded_pixels=2_000_000))
        assert len(service.rollouts([_rollout([shot, shot], "two")], "rollouts")) == 1
        with pytest.raises(BadRequest) as caught:
            service.rollouts([_rollout([shot, shot], "a"), _rollout([shot], "b")], "rollouts")
        assert caught.value.status == 413
        assert caught.value.message.startswith("the request's screenshots decode 2,764,800 pixels, over")
    finally:
        rm.close()


def test_the_judge_lists_a_bomb_as_an_unreadable_screenshot_with_the_reason(bomb, tmp_path):
    """keyshot judge: the bomb is one unreadable screenshot (the existing plumbing), named with its size;
    the other screenshot is scored and nothing was decoded for the bomb."""
    import asyncio

    from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
    from keyshot.infer.judge.pipeline import WebJudge
    from keyshot.infer.judge.scorers import OpenAIScorer
    from keyshot.infer.loaders.trajectory import Screenshot, Trajectory
    from keyshot.infer.protocol.prompts import load_prompt_set

    page = tmp_path / "page.png"
    page.write_bytes(png(1280, 720, (30, 30, 30)))
    trajectory = Trajectory(
        task_id="bomb",
        task="Find the price of the cheapest laptop",
        actions=["click('12')", "click('13')"],
        screenshots=[Screenshot(page, 0), Screenshot(tmp_path / "trajectory.jsonl", 1, data=bomb)],
    )

    async def judge(server: FakeOpenAI):
        def client(model: str) -> JudgeClient:
            return JudgeClient(EndpointConfig(base_url=server.base_url, model=model, api_key_env=None))

        webjudge = WebJudge(client("fake-judge"), OpenAIScorer(client("fake-scorer"), load_prompt_set()))
        try:
            return await webjudge.judge(trajectory)
        finally:
            await webjudge.aclose()

    before = peak_rss_bytes(os.getpid())
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        verdict = asyncio.run(judge(server))
    assert peak_rss_bytes(os.getpid()) - before < 100 * 2**20
    good, refused = verdict.screenshots
    assert good.error is None and good.score is not None
    assert refused.score is None and "unreadable" in refused.error
    assert (
        f"{tmp_path / 'trajectory.jsonl'}#screenshot1: image of 13000×13000 pixels is too large"
        in refused.error
    )


def test_the_reports_copies_refuse_a_bomb_from_its_header_and_keep_the_other_screenshots(
    bomb, tmp_path, caplog
):
    """keyshot report's thumbnails decode through the same guard: the bomb gets no copies, a warning
    naming it, and no memory; a transparent page is shown on white, as the judge sees it."""
    from keyshot.infer.report.thumbs import VIEW_WIDTH, ThumbnailCache

    shots = tmp_path / "shots"
    shots.mkdir()
    (shots / "bomb.png").write_bytes(bomb)
    (shots / "page.png").write_bytes(png(2560, 1440, (30, 30, 30)))
    (shots / "clear.png").write_bytes(encoded(Image.new("RGBA", (640, 400), (0, 0, 0, 0))))
    cache = ThumbnailCache(tmp_path / "report")
    before = peak_rss_bytes(os.getpid())
    with caplog.at_level("WARNING"):
        assert cache.images(shots / "bomb.png") is None
    assert peak_rss_bytes(os.getpid()) - before < 64 * 2**20  # nothing was decoded
    assert "bomb.png" in caplog.text and "13000×13000 pixels is too large" in caplog.text
    page = cache.images(shots / "page.png")
    assert page is not None and cache.converted == 1
    with Image.open(tmp_path / "report" / page.view) as view:
        assert view.size == (VIEW_WIDTH, 720) and max(view.convert("L").getextrema()) < 60
    blank = cache.images(shots / "clear.png")
    with Image.open(tmp_path / "report" / blank.thumb) as thumb:
        assert min(thumb.convert("L").getextrema()) > 240  # white, not black


def test_a_page_shown_to_a_policy_refuses_a_bomb_and_shows_a_screenshot(bomb, tmp_path):
    """Page.image (what a replayed or live page gives a VLM policy) decodes through the same guard."""
    from keyshot.env.page import Page

    with pytest.raises(ImageError, match=r"image of 13000×13000 pixels is too large"):
        Page(text="", screenshot=bomb, step=3, done=False).image(64)
    path = tmp_path / "page.png"
    path.write_bytes(png(1280, 720))
    image = Page(text="", screenshot=path, step=0, done=False).image(64)
    assert image.mode == "RGB" and image.size == (64, 36)
