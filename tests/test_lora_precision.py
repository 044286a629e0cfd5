"""LoRA, precision, devices and memory: adapters train and checkpoint alone, the KL
reference is the base with the adapter off, a merged export loads in transformers, and
the sampler and the trainer agree on log-probabilities in each precision."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from toolpolicy.cli import main
from toolpolicy.build import load_config
from toolpolicy.config import ConfigError
from toolpolicy.envs.calc import CalcEnv
from toolpolicy.model import ChatChoice, PolicyModel
from toolpolicy.config import HfSection
from toolpolicy.model.adapters import LoraSettings, attach_lora, is_adapter, store_frozen_in
from toolpolicy.model.placement import DTYPES, Placement, linear_weights_in
from toolpolicy.rollout import HFBackend, EpisodeLimits, RolloutEngine
from toolpolicy.rollout.backends import FoldedHFBackend
from toolpolicy.rollout.catalog import capabilities_of
from toolpolicy.trainer.batch import collate, forward_logprobs

from conftest import SMOKE

CALC_SFT = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"
LORA = ["--set", "model.lora_rank=8", "--set", "model.lora_alpha=16"]


def _metrics(run_dir: Path, phase: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == phase]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SFT with a LoRA adapter on the shipped calc model, then RL with a KL term."""
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    common = ["--set", f"run.dir={run_dir}", *LORA]
    assert main(["sft", str(SMOKE), *common, "--set", f"model.source={CALC_SFT}", "--set", "sft.steps=4", "--set", "run.checkpoint_every=2"]) == 0
    rl = ["--set", f"rl.init_from={run_dir / 'sft' / 'final'}", "--set", "rl.steps=2", "--set", "algorithm.beta=0.05", "--set", "rl.max_idle_steps=0"]
    assert main(["train", str(SMOKE), *common, *rl]) == 0
    return run_dir


def test_lora_checkpoints_hold_the_adapter_alone(lora_run: Path) -> None:
    for folder in (lora_run / "sft" / "final", lora_run / "rl" / "final", lora_run / "sft" / "checkpoints" / "step_000002"):
        assert is_adapter(folder) and (folder / "adapter_model.safetensors").is_file(), folder
        assert not (folder / "model.safetensors").exists(), folder
    # RL from an SFT adapter trains a fresh adapter on the merged SFT model, its reference
    base = json.loads((lora_run / "rl" / "final" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert Path(base) == (lora_run / "rl" / "base").resolve() and (Path(base) / "model.safetensors").is_file()


def test_lora_trains_few_parameters_and_logs_memory(lora_run: Path) -> None:
    full = sum(p.numel() for p in PolicyModel.load(CALC_SFT).model.parameters())
    for phase in ("sft", "rl"):
        rows = _metrics(lora_run, phase)
        assert all(0 < r["trainable_params"] < full / 10 for r in rows), rows[0]["trainable_params"]
        assert all(r["memory/peak_mb"] > 0 and r["memory/optimizer_mb"] > 0 for r in rows)
    from safetensors.torch import load_file

    adapter = load_file(lora_run / "sft" / "final" / "adapter_model.safetensors")
    moved = [name for name, tensor in adapter.items() if "lora_B" in name and float(tensor.abs().max()) > 0]
    assert moved, "SFT never moved the adapter (lora_B starts at zero)"


def test_rl_from_an_adapter_saves_its_base_in_the_compute_dtype(lora_run: Path, tmp_path: Path) -> None:
    """In bfloat16 the merged base RL trains on is written in bfloat16 (half the disk): each
    weight the float32 merge rounded once, the very values the frozen base holds in training."""
    from safetensors.torch import load_file

    from toolpolicy.model.adapters import merged

    run_dir = tmp_path / "bf16"
    rl = ["--set", f"rl.init_from={lora_run / 'sft' / 'final'}", "--set", "rl.steps=1", "--set", "rl.max_idle_steps=0"]
    assert main(["train", str(SMOKE), "--set", f"run.dir={run_dir}", *LORA, "--set", "model.dtype=bfloat16", *rl]) == 0
    saved = load_file(run_dir / "rl" / "base" / "model.safetensors")
    expected = merged(PolicyModel.load(lora_run / "sft" / "final").model).state_dict()
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    assert saved.keys() <= expected.keys()
    assert all(torch.equal(saved[name], expected[name].to(torch.bfloat16)) for name in saved)
    f32 = load_file(lora_run / "rl" / "base" / "model.safetensors")  # the float32 run's base stays float32
    assert {t.dtype for t in f32.values()} == {torch.float32}


def test_kl_reference_is_the_base_with_the_adapter_off(lora_run: Path) -> None:
    """At RL's first step the fresh adapter is zero: policy == reference, KL 0; the
    update then moves the adapter and the KL grows."""
    rows = _metrics(lora_run, "rl")
    assert abs(rows[0]["kl"]) < 1e-6 and rows[0]["ratio_max"] < 1 + 1e-4
    assert rows[1]["kl"] > 1e-9  # after one update the adapter on and off differ
    policy = PolicyModel.load(lora_run / "rl" / "final")
    ids = torch.tensor([policy.encode("Compute 12*7 with the calculator.")])
    with torch.no_grad():
        tuned = policy.model(input_ids=ids).logits
        with policy.model.disable_adapter():
            reference = policy.model(input_ids=ids).logits
    base = AutoModelForCausalLM.from_pretrained(lora_run / "rl" / "base")
    with torch.no_grad():
        assert torch.allclose(reference, base(input_ids=ids).logits, atol=1e-5)
    assert (tuned - reference).abs().max() > 1e-4  # RL moved the adapter


def test_export_merge_writes_a_model_transformers_loads(lora_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged"
    assert main(["export", str(lora_run), "--merge", "--out", str(out)]) == 0
    policy = PolicyModel.load(lora_run / "rl" / "final")
    merged = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([policy.encode("Compute 12*7 with the calculator.")])
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, policy.model(input_ids=ids).logits, atol=1e-4)
    assert PolicyModel.load(out).stop_ids == policy.stop_ids  # tokenizer and template came along


@pytest.mark.parametrize("frozen", [torch.float32, torch.bfloat16])
def test_merged_weights_are_what_merging_gives_and_leave_the_model_alone(lora_run: Path, frozen: torch.dtype) -> None:
    """What a sampler that takes whole weights receives for a LoRA policy (vLLM, the rollout
    server): merge_and_unload's weights under the base's names, rounded once to the frozen
    base's dtype, the model itself unchanged and still a peft model."""
    import copy

    from toolpolicy.model.adapters import merged, merged_weights, store_frozen_in

    policy = PolicyModel.load(lora_run / "rl" / "final")
    store_frozen_in(policy.model, frozen)
    before = {name: p.detach().clone() for name, p in policy.model.named_parameters()}
    weights = merged_weights(policy.model)
    expected = merged(copy.deepcopy(policy.model)).state_dict()
    assert weights.keys() == expected.keys() and not any("lora" in name for name in weights)
    assert all(weights[name].dtype == frozen for name in expected if "proj" in name)
    assert all(torch.equal(weights[name], tensor) for name, tensor in expected.items())
    base = {n.replace(".base_layer.", "."): t for n, t in policy.model.get_base_model().state_dict().items() if "lora_" not in n}
    moved = {n for n, t in weights.items() if not torch.equal(t, base[n])}
    assert moved and all(n.endswith("proj.weight") for n in moved), moved  # the adapted layers (every projection by default)
    assert all(torch.equal(p, before[name]) for name, p in policy.model.named_parameters())


def test_an_adapter_exported_in_bfloat16_is_half_the_size_and_loads_as_float32(lora_run: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "adapter"
    assert main(["export", str(lora_run), "--dtype", "bfloat16", "--out", str(out)]) == 0
    full = load_file(lora_run / "rl" / "final" / "adapter_model.safetensors")
    half = load_file(out / "adapter_model.safetensors")
    assert {t.dtype for t in full.values()} == {torch.float32} and {t.dtype for t in half.values()} == {torch.bfloat16}
    assert all(torch.equal(half[name], tensor.to(torch.bfloat16)) for name, tensor in full.items())
    card = (out / "README.md").read_text()  # the model card, not peft's empty template
    assert card.startswith("# adapter\n") and "A LoRA adapter (rank 8, alpha 16," in card and "in bfloat16" in card
    assert f"`{(lora_run / 'rl' / 'base').resolve()}`" in card and "## The run's config" in card
    sizes = [(folder / "adapter_model.safetensors").stat().st_size for folder in (lora_run / "rl" / "final", out)]
    assert sizes[1] < 0.55 * sizes[0]
    loaded = PolicyModel.load(out)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}  # the run's precision, not the file's
    ids = torch.tensor([loaded.encode("Compute 12*7 with the calculator.")])
    original = PolicyModel.load(lora_run / "rl" / "final")
    with torch.no_grad():
        assert torch.allclose(loaded.model(input_ids=ids).logits, original.model(input_ids=ids).logits, atol=0.05)


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-4), ("bfloat16", 0.05)])
def test_sampler_and_trainer_agree_in_each_precision(dtype: str, tolerance: float) -> None:
    """The KV-cache sampler and the trainer's full forward, both under the same autocast,
    give the sampled tokens log-probabilities within the stated tolerance: 1e-4 nats in
    float32, 0.05 in bfloat16 (measured here: 1.2e-6 and 6.5e-3 at most; bench/
    lora_precision.py measures the gap on a 25M model)."""
    policy = PolicyModel.load(CALC_SFT, ChatChoice(), Placement(device="cpu", dtype=dtype))
    env = CalcEnv()
    backend = HFBackend(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(0), temperature=1.0)
    engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, EpisodeLimits())
    trajectories = engine.run(env.tasks("eval", 8, seed=2))
    batch = collate(trajectories, policy.pad_id)
    with torch.no_grad():
        recomputed, _ = forward_logprobs(policy.model, batch)
    mask = batch.loss_mask.bool()
    gap = (recomputed[mask] - batch.old_logprobs[mask]).abs()
    assert int(mask.sum()) > 50 and float(gap.max()) < tolerance, float(gap.max())


def test_gradient_checkpointing_gives_the_same_step(tmp_path: Path) -> None:
    losses = {}
    for flag in (False, True):
        run_dir = tmp_path / f"gc-{flag}"
        args = ["--set", f"run.dir={run_dir}", "--set", f"model.source={CALC_SFT}", "--set", "sft.steps=2", "--set", f"model.gradient_checkpointing={str(flag).lower()}"]
        assert main(["sft", str(SMOKE), *args]) == 0
        losses[flag] = [r["loss"] for r in _metrics(run_dir, "sft")]
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)


def test_devices_that_are_not_there_are_config_errors(tmp_path: Path, capsys) -> None:
    with pytest.raises(ConfigError, match="device"):
        load_config(SMOKE, ["model.device=tpu"])
    if not torch.cuda.is_available():
        assert main(["eval", str(SMOKE), "--set", f"run.dir={tmp_path}", "--set", f"eval.checkpoint={CALC_SFT}", "--set", "model.device=cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu vme sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni

processor\t: 1
model name\t: AMD EPYC 9R14
flags\t\t: fpu vme sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni
"""


@pytest.mark.parametrize(
    ("device", "flags", "cuda_bf16", "expected"),
    [
        ("cpu", {"avx2", "avx512f", "avx512_bf16"}, False, "bfloat16"),  # AMD Zen 4, Intel Cooper Lake
        ("cpu", {"avx2", "amx_tile", "amx_bf16"}, False, "bfloat16"),  # Intel Sapphire Rapids
        ("cpu", {"avx2", "avx512f"}, False, "float32"),  # AVX-512 alone emulates bfloat16 products
        ("cpu", set(), False, "float32"),  # not x86 / flags unknown
        ("cuda", set(), True, "bfloat16"),  # Ampere and later
        ("cuda", {"avx512_bf16"}, False, "float32"),  # a V100: the CPU's flags do not matter
        ("mps", {"avx512_bf16"}, False, "float32"),
    ],
)
def test_dtype_auto_is_bfloat16_only_where_the_hardware_computes_in_it(device, flags, cuda_bf16, expected) -> None:
    from toolpolicy.model.placement import auto_dtype

    assert auto_dtype(device, flags, cuda_bf16) == expected


def test_cpu_model_and_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    from toolpolicy.model.placement import cpu_model_and_flags, resolve_dtype

    name, flags = cpu_model_and_flags(CPUINFO)
    assert name == "AMD EPYC 9R14" and {"avx512f", "avx512_bf16"} <= flags and "amx_bf16" not in flags
    assert cpu_model_and_flags("") == ("", frozenset())
    assert resolve_dtype("float16", torch.device("cpu")) == "float16"  # a dtype the config names is kept
    assert resolve_dtype("auto", torch.device("cpu")) in ("bfloat16", "float32")
    assert load_config(SMOKE, ["model.dtype=auto"]).model.dtype == "auto"


def test_the_decoder_and_head_called_alone_run_in_the_compute_dtype() -> None:
    """The trainer calls the decoder stack and the output head itself (logits a chunk at a
    time): in bfloat16 both compute in bfloat16 as the whole model's forward does."""
    policy = PolicyModel.load(CALC_SFT, ChatChoice(), Placement(device="cpu", dtype="bfloat16"))
    model = policy.model
    seen = []
    hook = model.base_model.layers[0].mlp.down_proj.register_forward_hook(lambda _, args, out: seen.append(out.dtype))
    ids = torch.tensor([[1, 2, 3]])
    hidden = model.base_model(input_ids=ids).last_hidden_state
    hook.remove()
    assert seen == [torch.bfloat16] and model.get_output_embeddings()(hidden).dtype == torch.bfloat16
    assert model(input_ids=ids).logits.dtype == torch.bfloat16


def test_linear_weights_stored_in_bfloat16_give_the_very_logits_of_autocast() -> None:
    """An evaluation stores the linear weights in the compute dtype once (`linear_weights_in`)
    instead of letting autocast cast them at every token: the logits are bit for bit those of
    autocast; the tied output head gets a bfloat16 weight of its own and the embedding lookup
    keeps reading the float32 one."""
    placement = Placement(device="cpu", dtype="bfloat16")
    cast, stored = PolicyModel.load(CALC_SFT, ChatChoice(), placement), PolicyModel.load(CALC_SFT, ChatChoice(), placement)
    count = linear_weights_in(stored.model, torch.bfloat16)
    proj = stored.model.base_model.layers[0].self_attn.q_proj
    assert proj.weight.dtype == torch.bfloat16 and count >= proj.weight.numel()
    head, embeddings = stored.model.get_output_embeddings(), stored.model.get_input_embeddings()
    assert head.weight is not embeddings.weight and head.weight.dtype == torch.bfloat16 and embeddings.weight.dtype == torch.float32
    assert torch.equal(head.weight, embeddings.weight.to(torch.bfloat16)) and count >= head.weight.numel()
    ids = torch.tensor([stored.encode("Compute 12*7 with the calculator. Answer: 84")])
    with torch.no_grad():
        assert torch.equal(stored.model(input_ids=ids).logits, cast.model(input_ids=ids).logits)
    assert linear_weights_in(PolicyModel.load(CALC_SFT).model, torch.float32) == 0  # float32 compute: nothing to store


def test_a_fresh_adapter_starts_from_the_run_seed(tmp_path: Path) -> None:
    """Two runs with the same seed start from the same adapter (whatever the process's own
    random state), and another seed from another; the process's random state is left as it was."""
    from toolpolicy.build import trainable_policy

    section = load_config(None, ["model.lora_rank=4"]).model

    def initial_a(seed: int) -> torch.Tensor:
        model = trainable_policy(section, CALC_SFT, tmp_path, False, seed).model
        return torch.cat([p.detach().flatten() for n, p in model.named_parameters() if "lora_A" in n])

    torch.manual_seed(1)
    first = initial_a(0)
    torch.rand(7)  # the process's stream moved on: the next adapter must not depend on it
    assert torch.equal(initial_a(0), first)
    assert not torch.equal(initial_a(1), first)
    before = torch.random.get_rng_state()
    initial_a(0)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_a_deep_copy_of_a_placed_model_computes_with_its_own_weights() -> None:
    """Autocast is set on the model's forward as an object that copies with the model: a deep
    copy (async RL's sampling copy, FoldedHFBackend's) runs its own weights, not the original's."""
    policy = PolicyModel.load(CALC_SFT, ChatChoice(), Placement(device="cpu", dtype="bfloat16"))
    copied = copy.deepcopy(policy.model)
    ids = torch.tensor([policy.encode("Compute 12*7 with the calculator.")])
    with torch.no_grad():
        before = policy.model(input_ids=ids).logits
        for parameter in copied.parameters():
            parameter.zero_()
        assert torch.equal(policy.model(input_ids=ids).logits, before)
        assert not torch.equal(copied(input_ids=ids).logits, before) and copied(input_ids=ids).logits.dtype == torch.bfloat16


def _lora_policy(dtype: str, seed: int) -> PolicyModel:
    """The shipped calc model with a LoRA adapter whose B matrices are random (a fresh
    adapter's are zero, which would fold to nothing)."""
    policy = PolicyModel.load(CALC_SFT, ChatChoice(), Placement(device="cpu", dtype=dtype))
    policy.model = attach_lora(policy.model, LoraSettings(8, 16, 0.0, ("q_proj", "v_proj", "up_proj", "down_proj")), CALC_SFT)
    store_frozen_in(policy.model, DTYPES[dtype])
    _shift_adapter(policy.model, seed)
    return policy


def _shift_adapter(model: torch.nn.Module, seed: int, scale: float = 0.02) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-4), ("bfloat16", 0.15)])
def test_the_folded_sampler_samples_the_trained_weights_after_each_sync(dtype: str, tolerance: float) -> None:
    """FoldedHFBackend samples from a copy with the adapter folded in: its log-probabilities
    agree with the trainer's forward of the LoRA model within the precision's tolerance,
    before and after the adapter moves and `sync` loads it; without the sync the copy still
    samples the old weights. In bfloat16 the copy's output head rounds the logits to 8 bits
    (a logit in [16, 32) moves in steps of 0.125) and its attention merges two rounded halves
    (rollout/prefix_attention.py): one step of a logit is a gap up to 0.125, measured 0.006 to
    0.12 over seeds, where the moved adapter gives 0.63. It is declared inexact, so
    algorithm.correction auto corrects for it."""
    policy = _lora_policy(dtype, seed=0)
    env = CalcEnv()
    backend = FoldedHFBackend(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(0), temperature=1.0)
    assert backend.model is not policy.model and not backend.capabilities.exact_logprobs
    assert capabilities_of(HfSection(fold=True)) == backend.capabilities and capabilities_of(HfSection()).exact_logprobs

    def gap() -> float:
        engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, EpisodeLimits())
        batch = collate(engine.run(env.tasks("eval", 8, seed=2)), policy.pad_id)
        with torch.no_grad():
            recomputed, _ = forward_logprobs(policy.model, batch)
        mask = batch.loss_mask.bool()
        assert int(mask.sum()) > 50
        return float((recomputed[mask] - batch.old_logprobs[mask]).abs().max())

    assert gap() < tolerance
    _shift_adapter(policy.model, seed=1, scale=0.06)
    assert gap() > 2 * tolerance  # the copy still holds the old adapter
    backend.sync(policy.model)
    assert gap() < tolerance
