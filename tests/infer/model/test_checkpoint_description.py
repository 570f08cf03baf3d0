"""A checkpoint is read once (DESIGN.md contract 10): one description of a scorer checkpoint (a folder, or a
Hugging Face hub id such as the released osunlp/WebJudge-7B), handed to serve, judge and the scorers; the
image bounds a judge config gives; the reward section of a judge config."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from keyshot.infer.cli import main as keyshot
from keyshot.infer.common.config import ConfigError, load_config
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.model.checkpoint import (
    META_FILE,
    CheckpointError,
    describe_checkpoint,
)
from keyshot.infer.protocol.images import DEFAULT_POLICY
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.serve.plan import PromptVersionMismatchError, ServeConfig, plan_server
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from tests.support import paths
from tests.support.frameworks import python_or_skip

REPO = paths.REPO
TRAJ = paths.FIXTURES / "trajectories" / "online_mind2web_v1"
TINY_JUDGE = str(REPO / "configs" / "judge" / "tiny_cpu.yaml")
WEBJUDGE_7B = "osunlp/WebJudge-7B"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
QWEN_BOUNDS = {"min_pixels": 3136, "max_pixels": 12845056}


# ---------------------------------------------------------------------------- counting opens
class Opens:
    """Files opened while active, seen through Python's audit hook (every ``open`` and ``os.open``)."""

    hooked = False
    active: list[Opens] = []

    def __init__(self, name: str):
        self.name, self.paths = name, []
        if not Opens.hooked:
            sys.addaudithook(Opens._hook)
            Opens.hooked = True

    @staticmethod
    def _hook(event: str, args: tuple) -> None:
        if event == "open" and Opens.active and isinstance(args[0], str | bytes | os.PathLike):
            path = os.fsdecode(args[0])
            for watch in Opens.active:
                if os.path.basename(path) == watch.name:
                    watch.paths.append(path)

    def __enter__(self) -> Opens:
        Opens.active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        Opens.active.remove(self)


@pytest.fixture
def answered(scorer_checkpoint, tmp_path) -> Path:
    """The tiny scorer checkpoint, as trained on answers of up to 80 tokens."""
    folder = Path(shutil.copytree(scorer_checkpoint, tmp_path / "answered"))
    meta = json.loads((folder / META_FILE).read_text())
    (folder / META_FILE).write_text(
        json.dumps({**meta, "answer_tokens": {"max": 80, "p99": 70, "rows": 100}})
    )
    return folder


def _judge_argv(url: str, out: Path, checkpoint: Path, *extra: str) -> list[str]:
    return [
        "judge",
        str(TRAJ),
        "--config",
        TINY_JUDGE,
        "--no-progress",
        f"judge.base_url={url}",
        f"scorer.endpoint.base_url={url}",
        "judge.backoff_base_s=0.01",
        f"scorer.checkpoint={checkpoint}",
        "scorer.max_tokens=100",  # checked against the trained answer length before any call
        f"out={out}",
        *extra,
    ]


def test_a_judge_run_reads_its_checkpoint_once(answered, tmp_path):
    """A judge run needs the checkpoint's answer length (limit check and scorer), pixel bounds (fingerprint
    and scorer) and hash (fingerprint): keyshot.json is opened once for all of them, in a dry run and in a
    run, and a run's verdicts record the checkpoint's hash and bounds."""
    with FakeOpenAI(make_judge()) as server:
        with Opens(META_FILE) as dry:
            argv = _judge_argv(server.base_url, tmp_path / "dry", answered, "--dry-run")
            assert keyshot(argv) == 0
        assert dry.paths == [str(answered / META_FILE)]
        with Opens(META_FILE) as run:
            assert keyshot(_judge_argv(server.base_url, tmp_path / "run", answered)) == 0
        assert run.paths == [str(answered / META_FILE)]
    protocol = json.loads((tmp_path / "run" / "run.json").read_text())["protocol"]
    described = describe_checkpoint(answered)
    assert protocol["scorer_checkpoint_hash"] == described.hash and described.hash
    assert (protocol["image_policy"]["min_pixels"], protocol["image_policy"]["max_pixels"]) == (
        described.pixel_bounds
    )


def test_the_in_process_scorer_reads_the_checkpoint_once(answered, tmp_path):
    """scorer.backend=transformers: the scorer built in-process takes the run's description."""
    pytest.importorskip("transformers")
    with FakeOpenAI(make_judge()) as server, Opens(META_FILE) as run:
        argv = _judge_argv(server.base_url, tmp_path / "run", answered, "scorer.backend=transformers")
        assert keyshot(argv) in (0, 3)  # 3: the untrained tiny model's answers hold no readable score
    assert run.paths == [str(answered / META_FILE)]
    assert len(read_verdicts(tmp_path / "run" / "verdicts.jsonl")) == 2


@pytest.mark.slow
def test_judge_serve_scorer_reads_the_checkpoint_once(answered, tmp_path):
    """``--serve-scorer``: vLLM's plan takes the run's description; the run scores through the server. The
    config has no ``scorer.endpoint`` of its own (the served one is all it has): keyshot read that missing
    endpoint's concurrency after vLLM had started and stopped with an AttributeError."""
    python = python_or_skip("vllm")
    serve = [f"scorer.serve.vllm_python={python}", f"scorer.serve.tmpdir={tmp_path / 'tmp'}"]
    serve.append("scorer.endpoint=null")  # after _judge_argv's scorer.endpoint.base_url: none left
    with FakeOpenAI(make_judge()) as server, Opens(META_FILE) as run:
        argv = _judge_argv(
            server.base_url, tmp_path / "run", answered, "--serve-scorer", str(answered), *serve
        )
        assert keyshot(argv) in (0, 3)  # 3: the untrained tiny model's answers hold no readable score
    assert run.paths == [str(answered / META_FILE)]
    assert (tmp_path / "run" / "vllm.log").stat().st_size > 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["usage"]["scorer"]["calls"] > 0


def test_a_description_handed_on_is_not_read_again(answered, tmp_path):
    """``--serve-scorer``'s plan and the in-process scorer take the run's description: no second read."""
    described = describe_checkpoint(answered)
    with Opens(META_FILE) as opened:
        plan = plan_server(ServeConfig(model=str(answered), device="cpu", tmpdir=str(tmp_path)), described)
    assert opened.paths == [] and plan.max_tokens == 80
    assert (plan.min_pixels, plan.max_pixels) == described.pixel_bounds


def test_judge_refuses_a_scorer_checkpoint_of_another_prompt_set(scorer_checkpoint, capsys):
    """The description's prompt version is checked on the judging side too (an endpoint keyshot did not
    start serves it): a checkpoint trained on online_mind2web cannot score the general prompts."""
    argv = ["judge", str(TRAJ), "--config", TINY_JUDGE, f"scorer.checkpoint={scorer_checkpoint}"]
    assert keyshot([*argv, "pipeline.prompt_variant=general", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{scorer_checkpoint / META_FILE}: the checkpoint was trained on" in err[0]
    assert load_prompt_set("general").version in err[0]


def test_a_bad_checkpoint_description_names_the_file(answered, tmp_path):
    meta = json.loads((answered / META_FILE).read_text())
    meta["image_policy"]["max_pixels"] = meta["max_pixels"] + 784
    (answered / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"keyshot.json: image_policy pixel bounds .* differ"):
        describe_checkpoint(answered)
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        describe_checkpoint(tmp_path / "nowhere" / "ckpt")
    with pytest.raises(CheckpointError, match=r"webjudge-7b: no such checkpoint folder; .*\(org/name"):
        describe_checkpoint("webjudge-7b")  # a mistyped folder, not looked up on the hub
    pytest.importorskip("huggingface_hub")
    with pytest.raises(CheckpointError, match="neither a checkpoint folder nor a Hugging Face model id"):
        describe_checkpoint("osunlp/Web Judge")


# ---------------------------------------------------------------------------- pixel bounds of a judge config
def test_a_lone_pixel_bound_takes_the_default_for_the_other(caplog):
    """scorer.min_pixels alone (or max_pixels alone) is used with keyshot's default for the other, said in
    one line; the fingerprint records the bounds the scorer's images get."""
    from keyshot.infer.judge.fingerprint import protocol_fingerprint

    with caplog.at_level("INFO", logger="keyshot.infer.judge.config"):
        low = load_config(JudgeRunConfig, TINY_JUDGE, ["scorer.min_pixels=200000"])
    assert "scorer.min_pixels=200000 with keyshot's default max_pixels 1003520" in caplog.text
    policy = protocol_fingerprint(low)["image_policy"]
    assert (policy["min_pixels"], policy["max_pixels"]) == (200000, DEFAULT_POLICY.max_pixels)
    caplog.clear()
    with caplog.at_level("INFO", logger="keyshot.infer.judge.config"):
        high = load_config(JudgeRunConfig, TINY_JUDGE, ["scorer.max_pixels=500000"])
    assert "keyshot's default min_pixels 3136 with scorer.max_pixels=500000" in caplog.text
    policy = protocol_fingerprint(high)["image_policy"]
    assert (policy["min_pixels"], policy["max_pixels"]) == (DEFAULT_POLICY.min_pixels, 500000)


@pytest.mark.parametrize(
    "given",
    [["scorer.min_pixels=2000000"], ["scorer.min_pixels=300000", "scorer.max_pixels=200000"]],
)
def test_contradicting_pixel_bounds_are_refused_naming_both_keys(given, capsys):
    assert keyshot(["judge", str(TRAJ), "--config", TINY_JUDGE, *given, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scorer.min_pixels=" in err[0] and "max_pixels" in err[0]


def test_bounds_beside_a_checkpoint_must_be_its_own(scorer_checkpoint, capsys):
    trained = describe_checkpoint(scorer_checkpoint).pixel_bounds
    argv = ["judge", str(TRAJ), "--config", TINY_JUDGE, f"scorer.checkpoint={scorer_checkpoint}", "--dry-run"]
    assert keyshot([*argv, f"scorer.min_pixels={trained[0] + 784}"]) == 2
    err = capsys.readouterr().err
    assert (
        f"scorer.min_pixels={trained[0] + 784} differs from the min_pixels" in err and str(trained[0]) in err
    )
    with pytest.raises(ConfigError, match="max_pixels"):
        from keyshot.infer.judge.fingerprint import protocol_fingerprint

        protocol_fingerprint(
            load_config(
                JudgeRunConfig,
                TINY_JUDGE,
                [f"scorer.checkpoint={scorer_checkpoint}", "scorer.max_pixels=5000000"],
            )
        )


# ---------------------------------------------------------------------------- released checkpoints
def _processor_only_folder(tiny_model_dir: Path, folder: Path, bounds: dict) -> Path:
    """A downloaded model folder as the hub has WebJudge-7B: config, weights and a preprocessor_config.json
    holding the image processor's settings; no keyshot.json."""
    shutil.copytree(tiny_model_dir, folder)
    (folder / META_FILE).unlink(missing_ok=True)
    processor = json.loads((folder / "processor_config.json").read_text())["image_processor"]
    processor.pop("size")
    (folder / "processor_config.json").unlink()
    (folder / "preprocessor_config.json").write_text(json.dumps({**processor, **bounds}))
    return folder


def test_a_folder_without_keyshot_json_is_served_with_its_processor_bounds(tiny_model_dir, tmp_path, caplog):
    folder = _processor_only_folder(
        tiny_model_dir, tmp_path / "downloaded", {"min_pixels": 6272, "max_pixels": 401408}
    )
    with caplog.at_level("WARNING", logger="keyshot.infer.serve.plan"):
        plan = plan_server(ServeConfig(model=str(folder), device="cpu", tmpdir=str(tmp_path)))
    assert (plan.min_pixels, plan.max_pixels) == (6272, 401408)
    flag = plan.command[plan.command.index("--mm-processor-kwargs") + 1]
    assert json.loads(flag) == {"min_pixels": 6272, "max_pixels": 401408}
    assert f"{folder} has no keyshot.json: the prompt set it was trained on is unknown" in caplog.text
    assert plan.env["HF_HUB_OFFLINE"] == "1"  # a local folder: nothing is fetched


def _hub_cache(root: Path, hub_id: str, bounds: dict) -> Path:
    """A Hugging Face hub cache holding ``hub_id``'s preprocessor_config.json, as `hf download` leaves it."""
    repo = root / f"models--{hub_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (snapshot / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, **bounds})
    )
    return root


def _serve(*args: str, env: dict) -> subprocess.CompletedProcess:
    """``keyshot serve --dry-run`` in its own process: the hub client reads its settings at import."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    return subprocess.run(
        [sys.executable, "-m", "keyshot.infer.cli", "serve", "--dry-run", *args],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=120,
        cwd=REPO,
    )


def test_serve_takes_the_released_webjudge_7b_by_its_hub_id(tmp_path):
    """model=osunlp/WebJudge-7B: the pixel bounds from its processor config (here in the hub cache), the
    prompt set from keyshot's table of released checkpoints, vLLM allowed to download the weights."""
    cache = _hub_cache(tmp_path / "hub", WEBJUDGE_7B, QWEN_BOUNDS)
    config = str(REPO / "configs" / "serve" / "webjudge7b_gpu.yaml")
    done = _serve(
        "--config", config, f"model={WEBJUDGE_7B}", env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    )
    assert done.returncode == 0, done.stderr
    command = done.stdout.split()
    assert command[command.index("--model") + 1] == WEBJUDGE_7B
    assert json.loads(done.stdout.split("--mm-processor-kwargs ")[1].split("'")[1]) == QWEN_BOUNDS
    assert "OSU's released WebJudge-7B" in done.stderr and "online_mind2web" in done.stderr


def test_the_plan_of_a_hub_id_lets_vllm_download_it(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(
        huggingface_hub.constants, "HF_HUB_CACHE", str(_hub_cache(tmp_path, WEBJUDGE_7B, QWEN_BOUNDS))
    )
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    described = describe_checkpoint(WEBJUDGE_7B)
    assert (
        described.hub_id and described.meta is None and described.base_model == "Qwen/Qwen2.5-VL-7B-Instruct"
    )
    assert described.prompt_version == load_prompt_set("online_mind2web").version
    assert described.pixel_bounds == (3136, 12845056) and described.hash
    plan = plan_server(ServeConfig(model=WEBJUDGE_7B, device="cuda", tmpdir=str(tmp_path)), described)
    assert "HF_HUB_OFFLINE" not in plan.env and "TRANSFORMERS_OFFLINE" not in plan.env
    # trained on the online_mind2web prompts: a client sending the general ones is refused
    with pytest.raises(PromptVersionMismatchError, match=f"hub {WEBJUDGE_7B}@{COMMIT[:12]}: .*general@"):
        plan_server(ServeConfig(model=WEBJUDGE_7B, prompt_variant="general", device="cuda"), described)


def test_a_hub_id_not_in_the_table_is_served_with_a_note(tmp_path, monkeypatch, caplog):
    import huggingface_hub

    cache = _hub_cache(tmp_path / "hub", "someone/other-scorer", QWEN_BOUNDS)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    with caplog.at_level("WARNING", logger="keyshot.infer.serve.plan"):
        plan = plan_server(ServeConfig(model="someone/other-scorer", device="cuda", tmpdir=str(tmp_path)))
    assert (plan.min_pixels, plan.max_pixels) == (3136, 12845056)
    assert (
        "someone/other-scorer has no keyshot.json: the prompt set it was trained on is unknown" in caplog.text
    )


def test_a_hub_id_whose_lookup_fails_gets_one_line(tmp_path):
    """The hub cannot be reached (a closed port stands for it): one line, one request, no retries."""
    hits: list[str] = []
    import http.server

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    try:
        env = {"HF_HUB_CACHE": str(tmp_path / "empty"), "HF_ENDPOINT": f"http://127.0.0.1:{hub.server_port}"}
        missing = _serve("model=osunlp/No-Such-Model", env=env)
    finally:
        hub.shutdown()
        hub.server_close()
    assert missing.returncode == 2
    err = missing.stderr.strip().splitlines()
    assert len(err) == 1 and "osunlp/No-Such-Model: the Hugging Face hub answered HTTP 404" in err[0]
    asked = [hit for hit in hits if hit.endswith("preprocessor_config.json")]
    assert "hf download osunlp/No-Such-Model" in err[0] and len(asked) == 1  # asked once, no retries


def test_an_unreachable_hub_or_offline_mode_is_one_line(tmp_path, monkeypatch):
    """The hub's address refusing connections (here a closed port; the hub is unreachable from this
    machine too), or the hub client's offline mode: one line each, with what to do."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    closed = "http://127.0.0.1:9/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", closed)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(
        CheckpointError, match=r"osunlp/WebJudge-7B: cannot reach the Hugging Face hub .*ConnectError"
    ):
        describe_checkpoint(WEBJUDGE_7B)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CheckpointError, match="not in the Hugging Face hub cache and HF_HUB_OFFLINE"):
        describe_checkpoint(WEBJUDGE_7B)


def test_a_judge_run_takes_a_hub_id_as_its_scorer_checkpoint(tmp_path, monkeypatch):
    """scorer.checkpoint=osunlp/WebJudge-7B fixes the judge's image policy from the released processor."""
    import huggingface_hub

    from keyshot.infer.judge.fingerprint import protocol_fingerprint

    monkeypatch.setattr(
        huggingface_hub.constants, "HF_HUB_CACHE", str(_hub_cache(tmp_path, WEBJUDGE_7B, QWEN_BOUNDS))
    )
    cfg = load_config(JudgeRunConfig, TINY_JUDGE, [f"scorer.checkpoint={WEBJUDGE_7B}"])
    protocol = protocol_fingerprint(cfg)
    assert (protocol["image_policy"]["min_pixels"], protocol["image_policy"]["max_pixels"]) == (
        3136,
        12845056,
    )
    assert protocol["scorer_model"] == WEBJUDGE_7B and protocol["scorer_checkpoint_hash"]


# ---------------------------------------------------------------------------- the reward section
def keyshot_reward_configs() -> list[str]:
    """configs/reward/*.yaml that are keyshot configs (a Hydra config for verl's trainer, with its
    ``defaults:`` list, is verl's to read)."""
    shipped = sorted((REPO / "configs" / "reward").glob("*.yaml"))
    return [p.name for p in shipped if "defaults" not in (yaml.safe_load(p.read_text()) or {})]


@pytest.mark.parametrize("config", keyshot_reward_configs())
def test_judge_accepts_every_shipped_reward_config(config, tmp_path, capsys):
    """docs/reward.md: keyshot judge re-reads kept episodes with the reward config; its reward: section is
    accepted and ignored (it changes no verdict)."""
    assert len(keyshot_reward_configs()) >= 4  # local, openrlhf, trl, verl
    path = REPO / "configs" / "reward" / config
    code = keyshot(["judge", str(TRAJ), "--config", str(path), f"out={tmp_path / 'out'}", "--dry-run"])
    captured = capsys.readouterr()
    assert "unknown key" not in captured.err
    assert "dry run: 2 trajectories found" in captured.out
    assert code in (0, 6)  # 6: an endpoint not up or a key not set, said after the plan
    cfg = load_config(JudgeRunConfig, path)
    assert (
        cfg.reward is not None
        and cfg.reward.on_failure == yaml.safe_load(path.read_text())["reward"]["on_failure"]
    )


def test_judge_refuses_an_unknown_key_under_reward_in_one_line(tmp_path, capsys):
    """The reward: section was an untyped mapping: a typo under it (``on_falure: zero``) passed keyshot
    judge silently. It is typed (RewardSettings), so the loader refuses it as it does a typo of any other
    section: one line naming the key, its file and line, and the key it most likely meant (exit 2)."""
    data = yaml.safe_load((REPO / "configs" / "reward" / "local.yaml").read_text())
    data["reward"]["on_falure"] = data["reward"].pop("on_failure")
    path = tmp_path / "reward.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    code = keyshot(["judge", str(TRAJ), "--config", str(path), f"out={tmp_path / 'out'}", "--dry-run"])
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert code == 2 and len(errors) == 1, errors
    assert (
        f"{path}:" in errors[0]
        and "reward: unknown key(s) 'on_falure' (did you mean 'on_failure'?)" in errors[0]
    )
    with pytest.raises(ConfigError, match="reward.value: 'p_sucess' is not one of"):
        load_config(JudgeRunConfig, REPO / "configs" / "reward" / "local.yaml", ["reward.value=p_sucess"])
