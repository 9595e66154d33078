"""trl-credit-eval on the chain task: the held-out prompts are the ones the trainers train on, token for token."""

import json

import pytest
from trl import GRPOConfig, GRPOTrainer

from trl_credit import SRPOConfig, SRPOTrainer
from trl_credit.evaluation.evaluate import load_problems, main
from trl_credit.evaluation.sampling import render_prompt
from trl_credit.srpo.prompts import wrap_prompt
from trl_credit.tasks.chain import CHAIN_INSTRUCTION, make_chain_dataset
from trl_credit.tasks.rewards import accuracy_reward


def test_chain_problems_are_the_test_split_the_scripts_train_beside():
    prompts, answers = load_problems("chain", num_problems=3, seed=4)
    test = make_chain_dataset(num_train=8, num_test=200, seed=4)["test"]  # a training run's split: --chain_seed 4
    assert prompts == test["prompt"][:3] and answers == test["answer"][:3]
    assert prompts[0][-1]["content"] == CHAIN_INSTRUCTION.format(question=test["question"][0])
    wrapped, _ = load_problems("chain", num_problems=1, seed=4, rollout_template="lines")
    assert wrapped[0][-1]["content"].startswith("Solve the problem one reasoning step at a time.")
    assert wrapped[0][-1]["content"].endswith("Q: " + prompts[0][-1]["content"])
    with pytest.raises(ValueError, match="rollout_template must be one of"):
        load_problems("chain", num_problems=1, rollout_template="no placeholder")


def _trainer_prompt_ids(trainer, prompts):
    # The ids TRL's generation starts from (GRPOTrainer._generate_single_turn tokenizes with this method).
    return [list(ids) for ids in trainer._tokenize_prompts(prompts)[0]]


def _eval_prompt_ids(tokenizer, prompts):
    # What trl_credit.evaluation.sampling.sample_completions feeds `generate` for chat prompts, before left padding.
    return [tokenizer(render_prompt(p, tokenizer), add_special_tokens=False)["input_ids"] for p in prompts]


def test_eval_prompt_ids_are_the_training_prompt_ids_of_grpo_and_srpo(tiny_model_path, tmp_path):
    train = make_chain_dataset(num_train=4, num_test=2, seed=0)["train"]
    common = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                  max_steps=1, report_to="none", use_cpu=True, bf16=False)
    grpo = GRPOTrainer(model=tiny_model_path, reward_funcs=[accuracy_reward], args=GRPOConfig(**common),
                       train_dataset=train)
    prompts, _ = load_problems("chain", num_problems=2)
    assert _eval_prompt_ids(grpo.processing_class, prompts) == _trainer_prompt_ids(grpo, prompts)
    for template in ("none", "lines"):
        srpo = SRPOTrainer(model=tiny_model_path, reward_funcs=[accuracy_reward], train_dataset=train,
                           args=SRPOConfig(**common, rollout_template=template, thought_delimiter="\n"))
        trained_on = [wrap_prompt(p, srpo._rollout_template) for p in make_chain_dataset(0, 2, seed=0)["test"]["prompt"]]
        evaluated, _ = load_problems("chain", num_problems=2, rollout_template=template)
        assert _eval_prompt_ids(srpo.processing_class, evaluated) == _trainer_prompt_ids(srpo, trained_on)


def test_cli_evaluates_the_chain_task_with_the_boxed_answer(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "eval"
    assert main(["--dataset_name", "chain", "--model", tiny_model_path, "--num_problems", "2", "-n", "2",
                 "--max_new_tokens", "4", "--data_seed", "3", "--output_dir", str(out), "--no_progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["dataset"] == "chain" and report["settings"]["reward"] == "accuracy"
    assert report["settings"]["builtin_kwargs"] == {"seed": 3}
    test = make_chain_dataset(num_train=0, num_test=2, seed=3)["test"]
    assert [p["prompt"] for p in report["problems"]] == [m[-1]["content"] for m in test["prompt"]]
    assert [p["answer"] for p in report["problems"]] == test["answer"]
    assert "pass@k" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--digits: only for --dataset arithmetic"):
        main(["--dataset", "chain", "--digits", "2", "--output_dir", str(out)])
