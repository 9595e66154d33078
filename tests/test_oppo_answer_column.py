"""OPPO reads y* from TRL's conventions: `answer_column=None` is `answer`, else `solution`; an explicit name as is."""

import warnings

import pytest
from datasets import Dataset

from trl_credit import OPPOConfig
from trl_credit.oppo.answers import resolve_answer_column


def _config(tmp_path, **fields):
    return OPPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                      max_steps=1, per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                      **fields)


def _trl_quick_start_dataset(tiny_dataset):
    """A dataset shaped like TRL's (trl-lib/DeepMath-103K): a `prompt` and a `solution` column, nothing else."""
    return Dataset.from_dict({"prompt": tiny_dataset["prompt"][:4], "solution": tiny_dataset["answer"][:4]})


def test_trl_quick_start_with_the_import_swapped_trains(tiny_model_path, tiny_dataset, tmp_path):
    # TRL's GRPO quick start (docs: "Quick start"), with `from trl import GRPOTrainer` swapped for OPPOTrainer and
    # the tiny model, a 4-row offline dataset and a one-step config in place of the Hub model and dataset.
    from trl.rewards import accuracy_reward

    from trl_credit import OPPOTrainer

    dataset = _trl_quick_start_dataset(tiny_dataset)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=accuracy_reward, args=_config(tmp_path),
                              train_dataset=dataset)
    said = [str(w.message) for w in caught if "reads the ground-truth answer" in str(w.message)]
    assert len(said) == 1 and "column `solution`" in said[0]  # said once, naming the column it used
    assert trainer.args.answer_column == "solution"
    trainer.train()
    assert trainer.state.global_step == 1
    logged = trainer.state.log_history[0]
    assert "oppo/value_mean" in logged and "rewards/accuracy_reward/mean" in logged


def test_answer_comes_first_and_an_explicit_name_is_kept(tmp_path):
    both = Dataset.from_dict({"prompt": ["q"], "answer": ["1"], "solution": ["2"]})
    args = _config(tmp_path)
    assert args.answer_column is None
    assert resolve_answer_column(args, both) == "answer" and args.answer_column == "answer"
    explicit = _config(tmp_path, answer_column="final")
    assert resolve_answer_column(explicit, both) == "final"  # not resolved: check_answers refuses it as before
    with pytest.raises(ValueError, match=r"column `answer`, else `solution`.*has columns \['prompt', 'gold'\]"):
        resolve_answer_column(_config(tmp_path), Dataset.from_dict({"prompt": ["q"], "gold": ["1"]}))
    with pytest.raises(ValueError, match="answer_column"):
        _config(tmp_path, answer_column="")


def test_an_explicit_answer_column_still_refuses_a_solution_only_dataset(tiny_model_path, tiny_dataset, tmp_path):
    from trl_credit import OPPOTrainer
    from trl_credit.tasks.rewards import accuracy_reward

    with pytest.raises(ValueError, match=r"column `answer` \(OPPOConfig.answer_column\).*\['prompt', 'solution'\]"):
        OPPOTrainer(model=tiny_model_path, reward_funcs=accuracy_reward, args=_config(tmp_path, answer_column="answer"),
                    train_dataset=_trl_quick_start_dataset(tiny_dataset))
