"""The warm start on the chain task (trl_credit/testbed/warm_start.py). Building the model is slow (minutes): marked slow."""

import json
import os

import pytest

from trl_credit.tasks.chain import first_wrong_step, parse_question
from trl_credit.testbed.warm_start import WarmStartConfig, build_chain_model, evaluate_chain_model, sft_dataset

RESULTS = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results", "warm_start_chain.json")


def test_sft_examples_are_correct_solutions_of_both_structures():
    rows = sft_dataset(40, data_seed=0)
    structures = set()
    for prompt, completion in zip(rows["prompt"], rows["completion"]):
        question = prompt[0]["content"].removeprefix("Compute ").split(". Write one step")[0]
        assert first_wrong_step(question, completion) is None
        problem = parse_question(question)
        if problem.distributive:
            _, op, b, c = problem.core
            factored = completion[0]["content"].startswith(f"{b} {op} {c} = ")
            structures.add("factored" if factored else "term")
    assert structures == {"term", "factored"}
    assert sft_dataset(40, data_seed=0).to_list() == rows.to_list()  # seeded


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="num_examples"):
        WarmStartConfig(num_examples=0)


@pytest.mark.slow
def test_warm_start_is_deterministic_and_lands_in_the_rl_band(tmp_path):
    built = build_chain_model(WarmStartConfig(), str(tmp_path / "chain"))
    with open(RESULTS) as handle:
        recorded = json.load(handle)
    import torch

    if torch.get_num_threads() == 1:  # the recorded build ran with OMP_NUM_THREADS=1; other thread counts may
        # sum in another order and differ in the last bits
        assert built["weights_sha256"] == recorded["build"]["weights_sha256"]
    report = evaluate_chain_model(built["path"], num_problems=32, num_samples=2)
    assert 0.2 <= report["pass@1"] <= 0.7, report["pass@1"]  # the recorded 64 x 4 number is in 0.3-0.6
    assert report["mean_steps_per_answer"] >= 4
    assert sum(count for step, count in report["first_wrong_step"].items() if int(step) > 1) > 0  # mid-chain errors


def _digest(model) -> str:
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.slow
def test_reduced_warm_start_builds_into_the_cache_loads_by_name_and_is_deterministic(tmp_path, monkeypatch):
    """A warm start of one optimizer step (8 examples, 1 epoch) built into a fresh TRL_CREDIT_CACHE: loadable as
    `smollm2-135m-chain`, changed from the base model, the same weights for the same seed, others for another."""
    from trl_credit.models import CHAIN_MODEL, default_model_path, load_model

    base_dir = default_model_path()  # the converted base model of the real cache, before the cache moves
    monkeypatch.setenv("TRL_CREDIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "SmolLM2-135M-Instruct").symlink_to(base_dir)  # no GGUF conversion in the test
    with pytest.raises(FileNotFoundError, match="python -m trl_credit.testbed.warm_start"):
        load_model(CHAIN_MODEL)
    small = WarmStartConfig(num_examples=8, epochs=1.0, batch_size=8)

    built = build_chain_model(small)
    assert built["path"] == str(tmp_path / "cache" / "SmolLM2-135M-Instruct-chain")
    model, tokenizer = load_model(CHAIN_MODEL)
    loaded = _digest(model)
    base, _ = load_model(base_dir)
    assert loaded != _digest(base)  # the step changed the weights
    assert tokenizer.chat_template and model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids(
        "<|im_end|>")

    again = build_chain_model(small, str(tmp_path / "again"))
    other = build_chain_model(WarmStartConfig(num_examples=8, epochs=1.0, batch_size=8, seed=1), str(tmp_path / "other"))
    assert again["weights_sha256"] == built["weights_sha256"] != other["weights_sha256"]
    assert _digest(load_model(again["path"])[0]) == loaded
    assert _digest(load_model(other["path"])[0]) != loaded
