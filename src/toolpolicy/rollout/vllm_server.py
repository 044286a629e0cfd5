"""The endpoint generation backend: the vLLM backend's contract, against a vLLM server.

Rollouts can then run on another machine (or another GPU box) than the trainer. The
server is a stock `vllm serve` started the way `server_command` says (or
`toolpolicy rollout-server CHECKPOINT`): token ids in (`/v1/completions` takes a list
of id lists as `prompt`), the sampled ids out (`return_token_ids`) with each one's
log-probability after temperature (the server's `--logprobs-mode processed_logprobs`),
only the given stop ids ending a turn (`ignore_eos`). So the trainer's exact-token
contract holds as with `backend: vllm`, and the mismatch against the trainer's own
log-probabilities is measured the same way.

Weights: `sync(model)` sends the trainer's state dict as safetensors bytes (base64 in
the JSON body of the dev route `/collective_rpc`, to `WeightSync.load_weights_b64`),
then `/reset_prefix_cache`, so no later turn reuses a prefix computed under the old
weights. The backend syncs once when it is built, so the server samples from the
trainer's weights whatever checkpoint it was started from (of the same architecture).

The dev routes are not behind vLLM's `--api-key` and `/collective_rpc` calls any
method of the worker: the server must only be reachable by the trainer (loopback, an
SSH tunnel, a private network). `rollout-server` binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from toolpolicy.model.adapters import merged_weights
from toolpolicy.rollout.backends import Capabilities, Generation, GenRequest, unseeded
from toolpolicy.rollout.chat_endpoint import EndpointError, send
from toolpolicy.rollout.vllm_engine import VLLMSettings, unique_tensors

SERVED_NAME = "policy"


class RolloutServerError(RuntimeError):
    """The rollout server could not be reached or gave something other than the expected answer."""


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    settings: VLLMSettings = VLLMSettings()


def server_command(checkpoint: str | Path, options: ServerOptions) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that serve `checkpoint` for the endpoint backend."""
    s = options.settings
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(checkpoint),
        "--served-model-name", SERVED_NAME,
        "--host", options.host,
        "--port", str(options.port),
        "--skip-tokenizer-init",  # ids in, ids out
        "--dtype", s.dtype,
        "--seed", str(s.seed),
        "--kv-cache-memory-bytes", str(int(s.kv_cache_gib * 2**30)),
        "--block-size", str(s.block_size),
        "--enable-prefix-caching",
        "--enforce-eager",
        "--logprobs-mode", "processed_logprobs",
        "--enable-prompt-tokens-details",  # cached prompt tokens, for the prefill count
        "--worker-extension-cls", "toolpolicy.rollout.vllm_engine.WeightSync",
        "--disable-log-stats",
        "--uvicorn-log-level", "warning",
    ]
    env = {
        "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc and /reset_prefix_cache
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        "OMP_NUM_THREADS": str(s.threads),
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
    }
    return argv, env


class ServerProcess:
    """`toolpolicy rollout-server CHECKPOINT` in a child process on this machine, for a script
    or test that needs a server of its own. It starts at construction and boots while the
    caller does other work; `wait` returns its URL once it listens; `stop` ends it and its
    engine. Output goes to `log` (or the caller's terminal)."""

    def __init__(self, checkpoint: str | Path, port: int, options: list[str] | None = None, log: Path | None = None):
        argv = [sys.executable, "-m", "toolpolicy", "rollout-server", str(checkpoint), "--port", str(port), *(options or [])]
        self.port, self.log = port, log
        sink = log.open("w") if log else None
        try:
            self.process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT if sink else None, start_new_session=True)
        finally:
            if sink:
                sink.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self, timeout: float = 300.0) -> str:
        """The server's URL once it accepts connections; RolloutServerError if it exits first
        (with the end of its log) or does not listen within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log.read_text()[-3000:] if self.log else ""
                raise RolloutServerError(f"the rollout server exited with {self.process.returncode}\n{tail}".rstrip())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self.url
            except OSError:
                time.sleep(0.5)
        raise RolloutServerError(f"the rollout server did not listen on port {self.port} within {timeout:.0f} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=60)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EndpointBackend:
    """Sampling from a rollout server; see the module docstring.

    Requests with the same token budget go in one POST (the server batches them); the
    POSTs of a turn run concurrently. `counts`: prefill (prompt tokens the server's
    prefix cache did not hold) and decode (each sampled token but the last)."""

    capabilities = Capabilities(request_seeds=False, exact_logprobs=False, in_process=False)

    def __init__(
        self,
        url: str,
        stop_ids: list[int],
        temperature: float = 1.0,
        api_key: str | None = None,
        timeout: float = 600.0,
        retries: int = 2,
    ) -> None:
        self.url = url.rstrip("/")
        self.stop_ids = list(stop_ids)
        self.temperature = temperature
        self.retries = retries
        self.counts: Counter[str] = Counter()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rollout-server")
        models = self._post_or_get("GET", "/v1/models")
        names = [m.get("id") for m in models.get("data", [])] if isinstance(models, dict) else []
        if SERVED_NAME not in names:
            raise RolloutServerError(
                f"{self.url} serves {names or 'no model'}, not {SERVED_NAME!r}: start it with `toolpolicy rollout-server CHECKPOINT`"
            )

    def _post_or_get(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON answer of a route (None for an empty one); RolloutServerError otherwise."""
        try:
            response = send(self._http, method, path, body, self.retries, 0.5)
        except EndpointError as error:
            raise RolloutServerError(str(error)) from None
        if response.status_code == 404 and path in ("/collective_rpc", "/reset_prefix_cache"):
            raise RolloutServerError(
                f"{self.url}{path} is missing: the server needs VLLM_SERVER_DEV_MODE=1 (as `toolpolicy rollout-server` sets)"
            )
        if response.status_code != 200:
            raise RolloutServerError(f"{self.url}{path}: HTTP {response.status_code}: {response.text[:300]}")
        return response.json() if response.content else None

    def forget(self) -> None:
        """Nothing to drop: the server's prefix cache keeps what later episodes can reuse."""

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        out = [Generation([], [], False) for _ in unseeded(requests, "server")]
        by_budget: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            if request.max_new_tokens > 0:
                by_budget.setdefault(request.max_new_tokens, []).append(i)
        answers = self._pool.map(lambda item: self._complete(requests, *item), by_budget.items())
        for indices, choices in zip(by_budget.values(), answers):
            for i, generation in zip(indices, choices):
                out[i] = generation
        return out

    def _complete(self, requests: list[GenRequest], budget: int, indices: list[int]) -> list[Generation]:
        body = {
            "model": SERVED_NAME,
            "prompt": [requests[i].ids for i in indices],
            "max_tokens": budget,
            "temperature": self.temperature,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "stop_token_ids": self.stop_ids,
            "ignore_eos": True,
            "skip_special_tokens": False,
        }
        data = self._post_or_get("POST", "/v1/completions", body)
        try:
            choices = sorted(data["choices"], key=lambda c: c["index"])
            generations = [_generation(choice) for choice in choices]
            usage = data.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            prompt_tokens = usage.get("prompt_tokens", sum(len(requests[i].ids) for i in indices))
        except (KeyError, TypeError, ValueError) as error:
            raise RolloutServerError(f"{self.url}/v1/completions: unexpected answer ({error!r}): {str(data)[:300]}") from None
        if len(generations) != len(indices):
            raise RolloutServerError(f"{self.url}/v1/completions: {len(generations)} choices for {len(indices)} prompts")
        self.counts["prefill"] += prompt_tokens - cached
        self.counts["decode"] += sum(max(len(g.ids) - 1, 0) for g in generations)
        return generations

    def sync(self, model: torch.nn.Module) -> None:
        """Make the server sample from `model`'s current weights (call after each optimizer
        step): every weight, a peft model's adapter folded in."""
        from safetensors.torch import save

        payload = base64.b64encode(save(unique_tensors(merged_weights(model)))).decode("ascii")
        self._post_or_get("POST", "/collective_rpc", {"method": "load_weights_b64", "args": [payload]})
        self._post_or_get("POST", "/reset_prefix_cache")

    def close(self) -> None:
        """Close the connection; the server keeps running (it is not the trainer's to stop)."""
        self._pool.shutdown(wait=False)
        self._http.close()


def _generation(choice: dict[str, Any]) -> Generation:
    ids = [int(t) for t in choice["token_ids"]]
    logprobs = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
    if len(logprobs) != len(ids):
        raise ValueError(f"{len(ids)} token ids but {len(logprobs)} log-probabilities")
    return Generation(ids, logprobs, choice.get("finish_reason") == "stop")
