"""The typed training config (``configs/train/*.yaml`` → :class:`TrainConfig`).

Filled by :func:`keyshot.infer.common.config.load_config` from a YAML file and ``key.sub=value`` overrides; unknown
keys are errors. The global batch is the one number that defines the recipe: gradient accumulation
is derived from it as ``global_batch_size / (per_device_batch_size × world_size)`` and must divide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from keyshot.infer.common.config import ConfigError
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.protocol.images import DEFAULT_MAX_ASPECT

#: peft target for the language model only: the vision blocks also have gate/up/down_proj.
LLM_LORA_TARGET = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


class ModelSetupError(KeyshotError, RuntimeError):
    """The model cannot be set up as the config asks (a switch this machine cannot run, a LoRA target that
    matches nothing)."""


@dataclass
class LoraSettings:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    #: 0 by default: dropout > 0 makes peft copy every adapted activation through a dropout mask, and a
    #: LoRA step ran 1.6x slower on an H200 at the 7B shape with 0.05 (bench/RESULTS-gpu.md).
    dropout: float = 0.0
    target_modules: str = LLM_LORA_TARGET
    #: Under autocast (mixed_precision bf16/fp16) the adapters' products take the activations in the compute
    #: dtype; the adapters themselves stay float32. False: peft's own cast of every adapted activation to
    #: float32 first (keyshot.train.scorer_model.keep_input_dtype_under_autocast).
    keep_input_dtype: bool = True
    #: The fused adapter forward (keyshot.train.lora_fused): each adapted layer adds ``(x @ A) @ B × scaling``
    #: into its base output in one product, layers that share their input (q/k/v, gate/up) take one
    #: ``x @ [A_q|A_k|A_v]``, and the backward accumulates into the input gradient in place. Needs dropout 0.
    fused: bool = False

    def __post_init__(self) -> None:
        if self.fused and self.dropout:
            raise ConfigError(
                f"model.lora.fused needs model.lora.dropout 0 (the fused forward has no dropout), got {self.dropout}"
            )
        if self.r < 1:
            raise ConfigError(f"model.lora.r must be >= 1, got {self.r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout must be within [0, 1), got {self.dropout}")


@dataclass
class ModelSettings:
    name_or_path: str = "Qwen/Qwen2.5-VL-7B-Instruct"
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    #: "auto": flash_attention_2 when flash-attn is installed and a GPU is present, else sdpa.
    attn_implementation: Literal["auto", "flash_attention_2", "sdpa", "eager"] = "auto"
    gradient_checkpointing: bool = True
    #: The vision tower is frozen unless this is set; it then trains at ``lr × vision_lr_scale``.
    train_vision_tower: bool = False
    vision_lr_scale: float = 0.1
    lora: LoraSettings = field(default_factory=LoraSettings)
    # Speed switches (keyshot.train.speedups, docs/training.md "Speed switches"); each is off by default and
    # equal to transformers' output within the dtype's rounding when on.
    #: Liger-Kernel's Triton RMSNorm, SwiGLU and rotary kernels (needs liger-kernel, triton and a CUDA GPU).
    liger_kernel: bool = False
    #: torch.compile each decoder layer and each vision block (regional compilation); "off" or a backend name.
    compile: Literal["off", "inductor", "aot_eager", "eager"] = "off"
    #: The vision tower's window attention: "batched" SDPA calls over same-length windows, or "varlen": one
    #: torch.nn.attention.varlen call per layer (torch's own flash kernel; CUDA, bfloat16/float16 only).
    vision_attention: Literal["batched", "varlen"] = "batched"
    #: Drop the padding mask of right-padded batches (causal attention never looks right, so the labelled
    #: positions are unchanged) so SDPA runs its maskless causal kernels.
    padding_free: bool = False
    #: With gradient_checkpointing, checkpoint every N-th decoder layer only (1: all of them).
    checkpoint_every: int = 1
    #: With gradient_checkpointing, a micro-batch of at most this many token slots (rows × its longest row)
    #: runs without checkpointing; a larger one is checkpointed (every checkpoint_every-th layer). None: every
    #: micro-batch is checkpointed. The run says at its start which micro-batches that is (keyshot.train.memory_plan).
    unchecked_token_cap: int | None = None

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1:
            raise ConfigError(
                f"model.checkpoint_every must be >= 1 (1: every layer), got {self.checkpoint_every}"
            )
        if self.unchecked_token_cap is not None:
            if self.unchecked_token_cap < 1:
                raise ConfigError(
                    f"model.unchecked_token_cap must be >= 1 (or null), got {self.unchecked_token_cap}"
                )
            if not self.gradient_checkpointing:
                raise ConfigError(
                    "model.unchecked_token_cap needs model.gradient_checkpointing=true (the micro-batches above "
                    "the cap are checkpointed); without checkpointing every micro-batch runs uncapped"
                )


@dataclass
class DataSettings:
    #: A ``datasets.DatasetDict`` saved with ``save_to_disk`` (``keyshot synth``): columns ``messages``, ``image``.
    path: str = ""
    train_split: str = "train"
    eval_split: str | None = "validation"
    max_length: int = 4096
    #: Pixel bounds of the scorer's images; None keeps the base processor's own bounds.
    min_pixels: int | None = None
    max_pixels: int | None = None
    #: Tall-page rule of the image policy (see keyshot.infer.protocol.images.ImagePolicy.max_aspect).
    max_aspect: float | None = DEFAULT_MAX_ASPECT
    #: "length_grouped": examples of similar length share a batch (seeded); "random": plain shuffled batches.
    batching: Literal["length_grouped", "random"] = "length_grouped"
    #: A length-grouped window holds this many global micro-batches before sorting.
    group_window: int = 64
    pad_to_multiple_of: int | None = None
    num_workers: int = 0
    max_train_samples: int | None = None
    #: The dataset keeps identical rows once with their ``count``; True trains each row ``count`` times an
    #: epoch (the labels' own distribution), False each distinct row once.
    repeat_by_count: bool = True
    #: Only for datasets without a ``prompt_version`` column: the prompt set the rows were built with.
    prompt_variant: str | None = None

    def __post_init__(self) -> None:
        if self.max_length < 64:
            raise ConfigError(f"data.max_length must be >= 64, got {self.max_length}")
        if self.group_window < 1:
            raise ConfigError(f"data.group_window must be >= 1, got {self.group_window}")
        if self.num_workers < 0:
            raise ConfigError(f"data.num_workers must be >= 0, got {self.num_workers}")


@dataclass
class OptimSettings:
    lr: float = 5e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"optim.lr must be > 0, got {self.lr}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"optim.warmup_ratio must be within [0, 1), got {self.warmup_ratio}")


def check_every(name: str, every: int, zero: str) -> None:
    """An ``every_steps`` setting: N > 0, or 0 (``zero`` says what 0 means); see :func:`is_due`."""
    if every < 0:
        raise ConfigError(f"{name} must be >= 0 (0: {zero}), got {every}")


def is_due(step: int, every: int) -> bool:
    """Whether an ``every_steps`` interval falls on ``step`` (never when ``every`` is 0)."""
    return every > 0 and step % every == 0


@dataclass
class EvalSettings:
    #: Evaluate every N optimizer steps (0: only at the end).
    every_steps: int = 0
    batch_size: int = 4
    max_samples: int | None = 512
    #: Rows of the eval split answered by greedy generation (score exact match, MAE, precision/recall).
    generate_samples: int = 64
    max_new_tokens: int = 256
    #: A screenshot is "key" when its score is >= this (WebJudge's delta).
    key_threshold: int = 3

    def __post_init__(self) -> None:
        check_every("eval.every_steps", self.every_steps, "only at the end")


@dataclass
class CheckpointSettings:
    #: A resumable checkpoint every N optimizer steps (0: none before the final one; a preemption
    #: signal still saves one).
    every_steps: int = 200
    keep_last: int = 2
    resume: bool = True

    def __post_init__(self) -> None:
        check_every("checkpoint.every_steps", self.every_steps, "only the final one")
        if self.keep_last < 1:
            raise ConfigError(f"checkpoint.keep_last must be >= 1, got {self.keep_last}")


@dataclass
class LogSettings:
    #: Log every N optimizer steps and at the last (0: the last only).
    every_steps: int = 10
    #: accelerate tracker: tensorboard, wandb (when installed) or none; metrics.jsonl is always written.
    tracker: Literal["tensorboard", "wandb", "none"] = "tensorboard"
    #: Dense peak of one device for the MFU estimate (H100 SXM bf16: 989 TFLOP/s).
    peak_tflops_per_device: float = 989.0

    def __post_init__(self) -> None:
        check_every("log.every_steps", self.every_steps, "the last step only")


@dataclass
class TrainConfig:
    #: the shipped configs' folder a name two folders share is read from (``--config tiny_cpu``)
    SHIPPED_FOLDER: ClassVar[str] = "train"
    run_dir: str = "runs/scorer"
    seed: int = 0
    epochs: float = 5.0
    #: Stop after this many optimizer steps (overrides epochs; the schedule spans max_steps).
    max_steps: int | None = None
    global_batch_size: int = 256
    per_device_batch_size: int = 1
    #: Expected number of processes; when set, the launch must match and the batch must divide at load time.
    world_size: int | None = None
    mixed_precision: Literal["no", "bf16", "fp16"] = "bf16"
    model: ModelSettings = field(default_factory=ModelSettings)
    data: DataSettings = field(default_factory=DataSettings)
    optim: OptimSettings = field(default_factory=OptimSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    log: LogSettings = field(default_factory=LogSettings)

    def __post_init__(self) -> None:
        if self.per_device_batch_size < 1:
            raise ConfigError(f"per_device_batch_size must be >= 1, got {self.per_device_batch_size}")
        if self.epochs <= 0 and self.max_steps is None:
            raise ConfigError(f"epochs must be > 0 (or set max_steps), got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.world_size is not None:
            self.gradient_accumulation_steps(self.world_size)

    def gradient_accumulation_steps(self, world_size: int) -> int:
        """``global_batch_size / (per_device_batch_size × world_size)``; raises ConfigError unless it divides."""
        if self.world_size is not None and world_size != self.world_size:
            raise ConfigError(
                f"this config expects world_size={self.world_size} processes but the launch has {world_size}; "
                f"launch {self.world_size} processes or override world_size=null"
            )
        per_step = self.per_device_batch_size * world_size
        if self.global_batch_size < per_step or self.global_batch_size % per_step:
            raise ConfigError(
                f"global_batch_size={self.global_batch_size} is not a multiple of per_device_batch_size "
                f"({self.per_device_batch_size}) × world_size ({world_size}) = {per_step}; "
                f"choose a global batch that is, or change per_device_batch_size"
            )
        return self.global_batch_size // per_step
