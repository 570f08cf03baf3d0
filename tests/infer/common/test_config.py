from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from keyshot.infer.common.config import ConfigError, dump_config, load_config


@dataclass
class Optim:
    lr: float = 1e-5
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class Run:
    name: str = "run"
    epochs: int = 1
    bf16: bool = False
    mode: Literal["full", "lora"] = "full"
    eval_every: int | None = None
    optim: Optim = field(default_factory=Optim)


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: paper\nepochs: 5\noptim:\n  lr: 5.0e-6\n")
    cfg = load_config(Run, path, ["optim.lr=1e-4", "bf16=true", "mode=lora", "eval_every=null"])
    assert cfg == Run(name="paper", epochs=5, bf16=True, mode="lora", optim=Optim(lr=1e-4))
    dumped = dump_config(cfg, tmp_path / "out" / "resolved.yaml")
    assert load_config(Run, dumped) == cfg


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "message"),
    [
        ("epoch: 5\n", [], "unknown key"),
        ("optim:\n  lr_typo: 1\n", [], "unknown key"),
        ("epochs: five\n", [], "expected int"),
        ("epochs: 2.5\n", [], "expected an integer"),
        ("mode: qlora\n", [], "not one of"),
        ("", ["epochs"], "key.sub=value"),
        ("- a\n- b\n", [], "top level must be a mapping"),
        ("a: [\n", [], "not valid YAML"),
    ],
)
def test_bad_configs_name_the_file_and_the_problem(tmp_path, yaml_text, overrides, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message) as err:
        load_config(Run, path, overrides)
    if not overrides:  # an override error names the override instead
        assert "bad.yaml" in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(Run, tmp_path / "nope.yaml")


def test_a_command_without_its_config_says_so_in_one_line(capsys):
    from keyshot.infer.cli import main as keyshot

    assert keyshot(["judge", "infer/samples"]) == 2
    err = capsys.readouterr().err
    assert "missing required key(s) judge: give --config FILE" in err and err.count("\n") == 1
