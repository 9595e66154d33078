"""Localization examples for the chain warm start (trl_credit/testbed/warm_start_localization.py). Expected chains and rates
are worked by hand; the injected error's step is judged by the chain checker, the prompt by a real SRPOTrainer."""

import os
import random
import re

import pytest

from trl_credit import models
from trl_credit.core.context import BatchContext
from trl_credit.srpo.prompts import localization_prompt, question_of
from trl_credit.tasks.chain import check_steps, make_chain_dataset, make_chain_problems, parse_question, solution_text
from trl_credit.testbed.warm_start import WarmStartConfig, sft_dataset
from trl_credit.testbed.warm_start_localization import (
    ERROR_KINDS,
    inject_error,
    localization_examples,
    localization_messages,
    localization_report,
)


def test_hand_worked_injections():
    problem = parse_question("17 + 9, then subtract 6, then multiply by 2, then add 3")  # answer 43, 4 step lines
    rng = random.Random(0)
    # skipping the last step line: its answer line boxes the value before it (line 4 is then the answer line)
    assert inject_error(problem, "term", 4, "skip", rng) == "17 + 9 = 26\n26 - 6 = 20\n20 * 2 = 40\n\\boxed{40}"
    # skipping "subtract 6": the doubling reads 26
    assert inject_error(problem, "term", 2, "skip", rng) == "17 + 9 = 26\n26 * 2 = 52\n52 + 3 = 55\n\\boxed{55}"
    slip = inject_error(problem, "term", 1, "arithmetic", rng).splitlines()
    wrong = int(slip[0].split(" = ")[1])
    assert wrong != 26 and slip[1] == f"{wrong} - 6 = {wrong - 6}"  # the slip propagates
    distributive = parse_question("3 * 8 - 3 * 5, then multiply by 2")  # term by term: 24, 15, 9, 18
    assert inject_error(distributive, "term", 3, "operand", rng) in (
        "3 * 8 = 24\n3 * 5 = 15\n24 - 24 = 0\n0 * 2 = 0\n\\boxed{0}",
        "3 * 8 = 24\n3 * 5 = 15\n15 - 15 = 0\n0 * 2 = 0\n\\boxed{0}",
    )
    # skipping a product of the term structure leaves a true first line of the other order: not at step 1
    assert inject_error(distributive, "term", 1, "skip", rng) is None
    with pytest.raises(ValueError, match="kind"):
        inject_error(problem, "term", 1, "typo", rng)
    with pytest.raises(ValueError, match="step"):
        inject_error(problem, "term", 6, "arithmetic", rng)


def test_every_injection_is_wrong_first_at_the_intended_step():
    rng = random.Random(1)
    placed, slots, filled = {kind: 0 for kind in ERROR_KINDS}, 0, 0
    for problem in make_chain_problems(80, seed=5):
        for structure in ("term", "factored") if problem.distributive else ("term",):
            lines = solution_text(problem, structure).count("\n") + 1
            for step in range(1, lines + 1):
                found = False
                for kind in ERROR_KINDS:
                    chain = inject_error(problem, structure, step, kind, rng)
                    if chain is None:
                        continue
                    found = True
                    placed[kind] += 1
                    assert check_steps(problem.question, chain).step == step, (problem.question, kind, chain)
                    assert chain.splitlines()[-1] != f"\\boxed{{{problem.answer}}}"
                    assert not re.search(r"(^|[ {])-\d", chain, re.M)  # no negative value
                slots, filled = slots + 1, filled + found
    assert filled / slots > 0.9 and min(placed.values()) > 50, (filled, slots, placed)  # nearly every line can err


def test_examples_are_srpo_requests_deterministic_and_spread():
    rows = make_chain_dataset(num_train=300, num_test=10, seed=0)["train"]
    examples = localization_examples(rows, 120, seed=0)
    assert examples == localization_examples(rows, 120, seed=0)
    assert [e["chain"] for e in localization_examples(rows, 120, seed=1)] != [e["chain"] for e in examples]
    prompts = dict(zip(rows["question"], rows["prompt"]))
    for e in examples:
        assert check_steps(e["question"], e["chain"]).step == e["step"]
        lines = e["chain"].split("\n")
        assert e["num_steps"] == len(lines)
        sent = localization_prompt(question_of(prompts[e["question"]]), lines)
        assert e["prompt"] == [{"role": "user", "content": sent}]
        assert e["completion"] == [{"role": "assistant", "content": f"\\boxed{{{e['step']}}}"}]
    assert {e["kind"] for e in examples} == set(ERROR_KINDS)
    assert {e["step"] for e in examples} >= {1, 2, 3, 4, 5}
    assert any(e["step"] == e["num_steps"] for e in examples)  # the answer line too
    with pytest.raises(ValueError, match="num_examples"):
        localization_examples(rows[:5], 10)


def test_sft_mix_keeps_the_solutions_and_appends_examples():
    plain = sft_dataset(16, data_seed=0)
    mixed = sft_dataset(16, data_seed=0, localization_examples=8)
    assert mixed.to_list()[:16] == plain.to_list()  # default build unchanged
    assert len(mixed) == 24 and all(r["prompt"][0]["content"].startswith("You are tasked with localizing")
                                    for r in mixed.to_list()[16:])
    train = make_chain_dataset(num_train=16 + 32, seed=0)["train"]["question"]
    assert all(f"Compute {q}. Write" not in r["prompt"][0]["content"] for q in train[:16] for r in mixed.to_list()[16:])
    with pytest.raises(ValueError, match="localization_examples"):
        WarmStartConfig(localization_examples=-1)


def test_localization_report_by_hand():
    report = localization_report([2, None, 1, 3], [2, 2, 2, 1], [4, 4, 2, 5])
    assert report["exact"]["count"] == 1 and report["clean"]["count"] == 2 and report["parse"]["count"] == 3
    assert report["exact"]["ci95"] == [0.0456, 0.6994]  # Wilson interval of 1/4
    assert report["uniform_baseline"]["exact"] == pytest.approx((1 / 4 + 1 / 4 + 1 / 2 + 1 / 5) / 4)
    assert report["uniform_baseline"]["clean"] == pytest.approx((2 / 4 + 2 / 4 + 2 / 2 + 1 / 5) / 4)


def test_chain_loc_model_resolves_in_the_cache_and_names_its_build_command(monkeypatch, tmp_path):
    monkeypatch.setenv("TRL_CREDIT_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="--localization_examples"):
        models.resolve_model_name(models.CHAIN_LOC_MODEL)
    folder = tmp_path / "SmolLM2-135M-Instruct-chain-loc"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert models.resolve_model_path(models.CHAIN_LOC_MODEL) == str(folder)
    assert models.chain_model_path(must_exist=False) != str(folder)


def test_prompt_is_token_for_token_what_srpo_trainer_sends(tiny_model_path, tmp_path, monkeypatch):
    """A real SRPOTrainer whose rollouts are all one injected chain: its localization call's prompt ids equal the
    SFT example's chat-templated prompt."""
    from trl_credit import SRPOConfig, SRPOTrainer
    from trl_credit.tasks.rewards import accuracy_reward

    rows = make_chain_dataset(num_train=1, num_test=1, seed=0)["train"]
    problem = parse_question(rows[0]["question"])
    chain = inject_error(problem, "term", 2, "arithmetic", random.Random(0))
    greedy_rows = []

    def fake_generate(ctx, prefix_ids, **kwargs):
        tokenizer = ctx.processing_class
        if kwargs.get("greedy"):
            greedy_rows.extend(list(r) for r in prefix_ids)
            return [tokenizer.encode("\\boxed{2}", add_special_tokens=False) for _ in prefix_ids], None
        return [tokenizer.encode(chain, add_special_tokens=False) + [tokenizer.eos_token_id] for _ in prefix_ids], None

    # every generation SRPO makes (seeds, suffixes, the decoded localization) goes through the batch's context
    monkeypatch.setattr(BatchContext, "generate", fake_generate)
    dataset = make_chain_dataset(num_train=1, num_test=1, seed=0)["train"].select([0, 0])
    args = SRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, reset_groups=1,
                      suffixes_per_reset=2, seed_candidates_per_round=2, max_completion_length=64, max_steps=1,
                      thought_delimiter="\n", rollout_template="none", reset="self", localization="generate",
                      report_to="none", use_cpu=True,
                      save_strategy="no", seed=0)
    trainer = SRPOTrainer(model=tiny_model_path, reward_funcs=accuracy_reward, args=args, train_dataset=dataset)
    trainer.train()
    messages = localization_messages(rows[0]["prompt"], chain)
    expected = trainer.processing_class.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                            return_dict=True)["input_ids"]
    assert greedy_rows and all(row == list(expected) for row in greedy_rows)


@pytest.mark.slow
def test_tiny_localizing_warm_start_builds_and_loads_by_name(monkeypatch, tmp_path):
    from trl_credit.testbed.warm_start import build_chain_model

    os.symlink(models.default_model_path(), tmp_path / "SmolLM2-135M-Instruct")  # the converted base, reused
    monkeypatch.setenv("TRL_CREDIT_CACHE", str(tmp_path))
    built = build_chain_model(WarmStartConfig(num_examples=4, localization_examples=4, epochs=1, batch_size=8))
    assert built["path"] == str(tmp_path / "SmolLM2-135M-Instruct-chain-loc")
    assert built["config"]["localization_examples"] == 4
    model, tokenizer = models.load_model(models.CHAIN_LOC_MODEL)
    assert model.config.model_type == "llama" and tokenizer.chat_template
