"""Every warning, refusal and metric note names the class the user built and, in a composed trainer, the part that
speaks: `SRPOTrainer: ...` for the preset, `CreditTrainer (resets rollout): ...` for `CreditTrainer(rollout="resets")`
(and likewise OPPO's credit, DATPO's trees, Cue-GRPO's modifier). Tiny model, construction or one step each."""

import warnings

import pytest

from trl_credit import (
    CreditConfig,
    CreditTrainer,
    CueGRPOConfig,
    CueGRPOTrainer,
    DATPOConfig,
    DATPOTrainer,
    OPPOConfig,
    OPPOTrainer,
    SRPOConfig,
    SRPOTrainer,
)
from trl_credit.cue_grpo.parts import RarityWeights
from trl_credit.tasks.rewards import final_number_reward


def always_wrong_reward(completions, **kwargs):
    return [0.0 for _ in completions]  # every rollout is incorrect: every prompt has a seed


def common(tmp_path, **extra):
    return dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", logging_steps=1,
                per_device_train_batch_size=8, num_generations=8, max_completion_length=8, max_steps=1, **extra)


def test_srpo_single_thought_warning_names_the_preset_or_the_composed_trainers_rollout(
    tiny_model_path, tiny_dataset, tmp_path
):
    # The tiny model never writes "@@@": every seed is one thought, which is warned once.
    srpo = dict(rollout_template="Q: {question}", thought_delimiter="@@@", reset="random", max_seed_rounds=2)
    built = [
        ("SRPOTrainer: ", SRPOTrainer(model=tiny_model_path, reward_funcs=always_wrong_reward, train_dataset=tiny_dataset,
                                      args=SRPOConfig(**common(tmp_path / "srpo", **srpo)))),
        ("CreditTrainer (resets rollout): ",
         CreditTrainer(model=tiny_model_path, reward_funcs=always_wrong_reward, train_dataset=tiny_dataset,
                       args=CreditConfig(rollout="resets", **common(tmp_path / "credit", **srpo)))),
    ]
    for prefix, trainer in built:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.train()
        single = [str(w.message) for w in caught if "single thought" in str(w.message)]
        assert len(single) == 1 and single[0].startswith(prefix), single


def test_oppo_answer_refusal_names_the_preset_or_the_composed_trainers_credit(tiny_model_path, tiny_dataset, tmp_path):
    no_answers = tiny_dataset.remove_columns("answer")
    with pytest.raises(ValueError, match=r"^OPPOTrainer: OPPO conditions its oracle .*\(OPPOConfig\.answer_column\)"):
        OPPOTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=no_answers,
                    args=OPPOConfig(**common(tmp_path / "oppo")))
    with pytest.raises(ValueError, match=r"^CreditTrainer \(oppo credit\): OPPO conditions its oracle .*"
                                         r"\(CreditConfig\.answer_column\)"):
        CreditTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=no_answers,
                      args=CreditConfig(credit="oppo", **common(tmp_path / "credit")))


def test_datpo_refusal_names_the_preset_or_the_composed_trainers_rollout(tiny_model_path, tiny_dataset, tmp_path):
    settings = common(tmp_path, entropy_coef=0.01)
    settings.update(num_generations=4)
    with pytest.raises(ValueError, match=r"^DATPOTrainer does not support the entropy bonus"):
        DATPOTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=tiny_dataset,
                     args=DATPOConfig(**settings))
    with pytest.raises(ValueError, match=r"^CreditTrainer \(trees rollout\) does not support the entropy bonus"):
        CreditTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=tiny_dataset,
                      args=CreditConfig(rollout="trees", credit="blocks", **settings))


def test_cue_refusal_names_the_preset_or_the_composed_trainers_modifier(tiny_model_path, tiny_dataset, tmp_path):
    judge = object()  # any judge given while cue_partition is not "judge" is refused before it is used
    with pytest.raises(ValueError, match=r"^CueGRPOTrainer: judge_model/judge_tokenizer were given"):
        CueGRPOTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=tiny_dataset,
                       args=CueGRPOConfig(**common(tmp_path / "cue")), judge_model=judge)
    with pytest.raises(ValueError, match=r"^CreditTrainer \(cue modifier\): judge_model/judge_tokenizer were given.*"
                                         r"CreditConfig\(cue_partition='judge'\)"):
        CreditTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=tiny_dataset,
                      args=CreditConfig(modifiers=["cue"], **common(tmp_path / "credit")),
                      modifiers=[RarityWeights(judge_model=judge)])


def test_a_config_refusal_names_the_config_and_its_part():
    # Whole prompt groups per process: checked by the config, which names itself (and the part it configures).
    settings = dict(output_dir="unused", use_cpu=True, report_to="none", num_generations=8, step_checker="nope")
    with pytest.raises(ValueError, match=r"callable to SRPOTrainer\(step_checker=\.\.\.\)"):
        SRPOConfig(**settings)
    with pytest.raises(ValueError, match=r"callable to CreditTrainer\(rollout=Resets\(step_checker=\.\.\.\)\)"):
        CreditConfig(rollout="resets", **settings)


def test_process_refusals_and_warnings_name_the_trainer_and_its_credit(tiny_model_path, tiny_dataset, tmp_path):
    settings = common(tmp_path, credit="process")
    with pytest.raises(ValueError, match=r"^CreditTrainer \(process credit\): credit='process' needs a step-reward "):
        CreditTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=tiny_dataset,
                      args=CreditConfig(**settings))
    settings.update(process_step_reward="chain")
    with pytest.raises(ValueError, match=r"^CreditTrainer \(resets rollout\) does not support a custom `rollout_func`"):
        CreditTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=tiny_dataset,
                      args=CreditConfig(**{**settings, "rollout": "resets", "num_generations": 8}),
                      rollout_func=lambda prompts, trainer: {})

    class MyTrainer(CreditTrainer):  # a user's subclass of the composed trainer speaks as itself
        pass

    # the tiny model writes no "@@@": every completion is one step, which is warned once
    trainer = MyTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=tiny_dataset,
                        args=CreditConfig(**{**settings, "process_thought_delimiter": "@@@"}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    one_step = [str(w.message) for w in caught if "no step delimiter" in str(w.message)]
    assert len(one_step) == 1 and one_step[0].startswith("MyTrainer (process credit): "), one_step
