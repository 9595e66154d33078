"""CueGRPOTrainer end to end on the tiny model (CPU): every partition source trains, and the advantages that reach
TRL's loss are exactly TRL's advantages x the hand-computed rarity weights."""

import warnings

import pytest
import torch

import trl_credit.cue_grpo.parts as cue_trainer_module
from trl_credit import CueGRPOConfig, CueGRPOTrainer
from trl_credit.cue_grpo import extract_cues
from trl_credit.tasks.rewards import completion_text


def length_parity_reward(completions, **kwargs):
    # variance on random text (conversational or plain-text completions)
    return [float(len(completion_text(c)) % 2) for c in completions]


def _config(tmp_path, **kwargs):
    defaults = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-2,
        report_to="none",
        logging_steps=1,
        use_cpu=True,
        save_strategy="no",
    )
    defaults.update(kwargs)
    return CueGRPOConfig(**defaults)


def _train_two_steps(trainer):
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters() if n in before)
    logs = [log for log in trainer.state.log_history if "cue/frac_groups_redistributed" in log]
    assert len(logs) == 2
    return logs


def test_cue_partition_trains_two_steps_with_kl(tiny_model_path, tiny_dataset, tmp_path):
    trainer = CueGRPOTrainer(
        model=tiny_model_path, reward_funcs=length_parity_reward, args=_config(tmp_path, beta=0.04),
        train_dataset=tiny_dataset,
    )
    logs = _train_two_steps(trainer)
    assert all("cue/clusters_per_group" in log or log["cue/frac_groups_redistributed"] == 0 for log in logs)
    assert len(trainer.cue_overhead_seconds) == 2


def test_random_partition_trains_two_steps_on_plain_text_prompts(tiny_model_path, tiny_dataset, tmp_path):
    plain = tiny_dataset.map(lambda row: {"prompt": row["prompt"][-1]["content"]})
    assert isinstance(plain[0]["prompt"], str)
    trainer = CueGRPOTrainer(
        model=tiny_model_path, reward_funcs=length_parity_reward, args=_config(tmp_path, cue_partition="random"),
        train_dataset=plain,
    )
    _train_two_steps(trainer)


def test_callable_partition_trains_two_steps_and_sees_positive_texts(tiny_model_path, tiny_dataset, tmp_path):
    calls = []

    def by_length(completions, prompt):
        calls.append((list(completions), prompt))
        return [len(text) % 3 for text in completions]

    trainer = CueGRPOTrainer(
        model=tiny_model_path, reward_funcs=length_parity_reward, args=_config(tmp_path, cue_partition="callable"),
        train_dataset=tiny_dataset, partition_fn=by_length,
    )
    _train_two_steps(trainer)
    assert calls  # seeded run: some group had two or more positives
    for completions, prompt in calls:
        assert len(completions) > 1  # groups with |P| <= 1 are not sent
        assert all(len(text) % 2 == 1 for text in completions)  # positives = odd length under this reward
        assert prompt[-1]["role"] == "user"  # the dataset's conversational prompt


def test_judge_partition_with_tiny_judge_falls_back_to_one_group(tiny_model_path, tiny_dataset, tmp_path):
    # The random tiny model cannot write JSON: every judged group is one cluster -> uniform weights.
    args = _config(tmp_path, cue_partition="judge", cue_judge_model=tiny_model_path, cue_judge_max_new_tokens=12)
    trainer = CueGRPOTrainer(
        model=tiny_model_path, reward_funcs=length_parity_reward, args=args, train_dataset=tiny_dataset
    )
    assert trainer.judge_model is not None and trainer.judge_model is not trainer.model
    logs = _train_two_steps(trainer)
    judged = [log for log in logs if "cue/judge_parse_failure_rate" in log]
    assert judged and all(log["cue/judge_parse_failure_rate"] == 1.0 for log in judged)
    assert all(log["cue/weight_spread"] == 0.0 for log in judged)


def test_policy_as_judge_with_lora(tiny_model_path, tiny_dataset, tmp_path):
    from peft import LoraConfig

    args = _config(tmp_path, cue_partition="judge", cue_judge_model="policy", cue_judge_max_new_tokens=12)
    trainer = CueGRPOTrainer(
        model=tiny_model_path, reward_funcs=length_parity_reward, args=args, train_dataset=tiny_dataset,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    assert trainer.judge_model is None  # the policy judges through TRL's generation path
    _train_two_steps(trainer)


# ---------------------------------------------------------------------------------------------------------------
# Exactness: controlled completions (patched generation) and a controlled reward.

A = "We substitute x = 2 into the equation.\n\nWe compute the value of the sum now.\n\nTherefore the answer is \\boxed{4}."
B = "The root is \\sqrt{16} which is exact.\n\nTaking \\log_2 of both sides gives 2.\n\nTherefore the answer is \\boxed{4}."
C = "We factor the polynomial completely.\n\nCase 1: the first term vanishes here.\n\nTherefore the answer is \\boxed{4}."
D = "I am not sure about this one at all.\n\nThe answer is \\boxed{5}."
E = "We compute it in one go.\n\nTherefore the answer is \\boxed{4}."
GROUP_0 = [A, A, A, A, B, B, C, D]  # 7 correct (4:2:1 by cues), 1 incorrect
GROUP_1 = [E] * 8  # all correct: zero reward variance


def boxed_four_reward(completions, **kwargs):
    return [1.0 if "\\boxed{4}" in c[0]["content"] else 0.0 for c in completions]


def test_advantages_reaching_the_loss_are_trl_advantages_times_hand_weights(
    tiny_model_path, tiny_tokenizer, tiny_dataset, tmp_path, monkeypatch
):
    assert extract_cues(A) == ["substitute", "compute", "conclude"]
    assert extract_cues(B) == ["radicals", "log_exp", "conclude"]
    assert extract_cues(C) == ["solve_quadratic", "case_split", "conclude"]
    # Hand computation (docs/cue_grpo.md#algorithm) for group 0, P = {A x4, B x2, C}:
    # conclude is in 7 of 7 > 0.75*7 = 5.25 -> suppressed; every other cue is in <= 4 -> kept.
    # cleaned vectors: A = substitute+compute, B = radicals+log_exp, C = solve_quadratic+case_split: pairwise
    # orthogonal -> clusters of sizes 4, 2, 1 (the paper's 4:2:1). Skeleton lengths all 2, median 2:
    # low = max(2, 0.6) = 2, high = max(6, 6) = 6 -> the singleton (L = 2) is not an artifact.
    # alpha 0.8: s = 4^-0.8, 2^-0.8, 1; mean over P = (4 s4 + 2 s2 + 1)/7 = 0.495458
    # normalized 0.665802, 1.159229, 2.018334 (no clipping); floor delta = 1.05 - 0.665802 = 0.384198
    s4, s2 = 4**-0.8, 2**-0.8
    mean = (4 * s4 + 2 * s2 + 1) / 7
    delta = 1.05 - s4 / mean
    weight = {A: s4 / mean + delta, B: s2 / mean + delta, C: 1 / mean + delta, D: 1.0, E: 1.0}
    assert weight[C] == pytest.approx(2.402532, abs=1e-6)

    args = _config(tmp_path, per_device_train_batch_size=16, num_generations=8, max_completion_length=64, max_steps=1)
    trainer = CueGRPOTrainer(
        model=tiny_model_path, reward_funcs=boxed_four_reward, args=args, train_dataset=tiny_dataset
    )

    def controlled_generation(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        texts = (GROUP_0 + GROUP_1)[: len(prompt_ids)]
        ids = [tiny_tokenizer(t, add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id] for t in texts]
        return ids, None

    monkeypatch.setattr(trainer, "_generate_single_turn", controlled_generation)

    trl_advantages = {}

    def record_trl(step):  # TRL's advantages of each row, before the rarity weights
        texts = tiny_tokenizer.batch_decode(step.output["completion_ids"], skip_special_tokens=True)
        for text, advantage in zip(texts, step.trl_advantages.tolist(), strict=True):
            trl_advantages.setdefault(text, set()).add(round(advantage, 9))

    trainer.add_credit_callback(record_trl)

    # Kept as a wrap: the test checks that every row reaches TRL's loss once, after its shuffle and split into
    # micro-batches, which on_credit (one call per generation batch, before the split) does not see.
    seen = []
    compute_loss = trainer._compute_loss

    def record_loss_inputs(model, inputs):
        texts = tiny_tokenizer.batch_decode(inputs["completion_ids"], skip_special_tokens=True)
        seen.extend(zip(texts, inputs["advantages"].tolist(), strict=True))
        return compute_loss(model, inputs)

    monkeypatch.setattr(trainer, "_compute_loss", record_loss_inputs)
    trainer.train()

    assert set(trl_advantages) == {A, B, C, D, E} and all(len(v) == 1 for v in trl_advantages.values())
    trl = {text: values.pop() for text, values in trl_advantages.items()}
    assert trl[A] == trl[B] == trl[C] > 0 > trl[D] and trl[E] == 0.0  # binary rewards: one A+ per group
    assert sorted(text for text, _ in seen) == sorted(GROUP_0 + GROUP_1)  # every row reached the loss once
    for text, advantage in seen:
        assert advantage == pytest.approx(trl[text] * weight[text], rel=1e-6), text
    log = next(log for log in trainer.state.log_history if "cue/frac_groups_redistributed" in log)
    assert log["cue/frac_groups_redistributed"] == 0.5  # the zero-variance group is left alone
    assert log["cue/clusters_per_group"] == 3.0 and log["cue/frac_groups_nonuniform"] == 0.5
    assert log["cue/weight_spread"] == pytest.approx(weight[C] - weight[A], abs=1e-6)
    # pre-floor masses (n, n*w): (4, 4*0.665802), (2, 2*1.159229), (1, 2.018334) -> least-squares slope in log-log
    import math

    xs = [math.log(4), math.log(2), 0.0]
    ys = [math.log(4 * s4 / mean), math.log(2 * s2 / mean), math.log(1 / mean)]
    mx, my = sum(xs) / 3, sum(ys) / 3
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    assert slope == pytest.approx(0.2, abs=1e-9)  # no clipping/reset: exactly 1 - alpha (paper Eq. 4)
    assert log["cue/mass_slope"] == pytest.approx(slope, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Construction-time errors


def test_argument_errors(tiny_model_path, tiny_dataset, tmp_path):
    def build(args, **kwargs):
        return CueGRPOTrainer(
            model=tiny_model_path, reward_funcs=length_parity_reward, args=args, train_dataset=tiny_dataset, **kwargs
        )

    with pytest.raises(ValueError, match="needs CueGRPOTrainer\\(partition_fn=fn\\)"):
        build(_config(tmp_path, cue_partition="callable"))
    with pytest.raises(ValueError, match="partition_fn was given but cue_partition='cue'"):
        build(_config(tmp_path), partition_fn=lambda completions, prompt: [0] * len(completions))
    with pytest.raises(ValueError, match="cue_partition='judge' needs a judge"):
        build(_config(tmp_path, cue_partition="judge"))
    with pytest.raises(ValueError, match="judge_model/judge_tokenizer were given"):
        build(_config(tmp_path), judge_model=object())
    from trl import GRPOConfig

    with pytest.raises(TypeError, match="CueGRPOConfig"):
        build(GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none"))


# ---------------------------------------------------------------------------------------------------------------
# Success from the verifier, truncated completions, partition_fn errors (controlled completions)


def boxed_four_accuracy(completions, **kwargs):
    return [1.0 if "\\boxed{4}" in completion_text(c) else 0.0 for c in completions]


def therefore_format(completions, **kwargs):
    return [1.0 if completion_text(c).startswith("Therefore") else 0.0 for c in completions]


def _controlled(trainer, tokenizer, monkeypatch, texts, eos):
    """Every generation call returns ``texts`` (one per row, repeated), ending with EOS where ``eos`` says."""

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        rows = [texts[i % len(texts)] for i in range(len(prompt_ids))]
        ends = [eos[i % len(eos)] for i in range(len(prompt_ids))]
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if e else []) for t, e in
               zip(rows, ends)]
        return ids, None

    monkeypatch.setattr(trainer, "_generate_single_turn", generate)


def _record_before_and_after(trainer, monkeypatch):
    """(TRL's advantages, the redistributed ones) of every generation batch, in row order."""
    records = []
    part = trainer.rarity_weights
    original = part.apply

    def record(trainer, batch, inputs, output, local_advantages):
        after = original(trainer, batch, inputs, output, local_advantages)
        records.append((local_advantages.clone(), after.clone()))
        return after

    monkeypatch.setattr(part, "apply", record)
    return records


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_well_formatted_wrong_answer_is_not_in_the_positive_set(
    tiny_model_path, tiny_tokenizer, tiny_dataset, tmp_path, monkeypatch, aggregation
):
    # reward_funcs=[accuracy, format]: totals R 2, W1 1 (wrong, formatted), W2 0, W3 0 -> mean 0.75, so TRL gives
    # A > 0 to R and W1 (also under normalize_then_sum: z-sums 2.37, 0.37, -1.37, -1.37 up to the batch std).
    # P = {correct and A > 0} = {R}: uniform_boost multiplies R's advantage by tau = 1.05 and leaves W1's as GRPO's.
    # Before, P = {A > 0} = {R, W1} and W1 was boosted too.
    texts = ["Therefore \\boxed{4}.", "Therefore \\boxed{5}.", "So \\boxed{6}.", "So \\boxed{7}."]
    args = _config(tmp_path, cue_weighting="uniform_boost", max_steps=1, multi_objective_aggregation=aggregation)
    trainer = CueGRPOTrainer(model=tiny_model_path, reward_funcs=[boxed_four_accuracy, therefore_format], args=args,
                             train_dataset=tiny_dataset)
    _controlled(trainer, tiny_tokenizer, monkeypatch, texts, [True])
    records = _record_before_and_after(trainer, monkeypatch)
    trainer.train()
    (before, after), = records
    assert before[0] > 0 and before[1] > 0 and before[2] < 0 and before[3] < 0
    assert after[0].item() == pytest.approx(1.05 * before[0].item(), rel=1e-6)
    assert after[1:].tolist() == before[1:].tolist()
    log = next(log for log in trainer.state.log_history if "cue/frac_positive_advantage_excluded" in log)
    assert log["cue/frac_positive_advantage_excluded"] == 0.5


def test_no_correct_positive_warns_and_logs_the_rate(tiny_model_path, tiny_tokenizer, tiny_dataset, tmp_path,
                                                     monkeypatch):
    # success_reward points at the format reward with a threshold it never reaches: A > 0 rows exist but none is
    # correct, so nothing is reweighted (the step is GRPO) -- said once, and logged as rate 1.0.
    texts = ["Therefore \\boxed{4}.", "Therefore \\boxed{5}.", "So \\boxed{6}.", "So \\boxed{7}."]
    args = _config(tmp_path, cue_weighting="uniform_boost", max_steps=1, success_reward="therefore_format",
                   success_threshold=2.0)
    trainer = CueGRPOTrainer(model=tiny_model_path, reward_funcs=[boxed_four_accuracy, therefore_format], args=args,
                             train_dataset=tiny_dataset)
    _controlled(trainer, tiny_tokenizer, monkeypatch, texts, [True])
    records = _record_before_and_after(trainer, monkeypatch)
    with pytest.warns(UserWarning, match="'therefore_format'.*success_threshold"):
        trainer.train()
    (before, after), = records
    assert after.tolist() == before.tolist()
    log = next(log for log in trainer.state.log_history if "cue/frac_positive_advantage_excluded" in log)
    assert log["cue/frac_positive_advantage_excluded"] == 1.0


@pytest.mark.parametrize("partition", ["cue", "callable", "one_correct"])
def test_one_cluster_groups_warn_once_and_log_the_rate(tiny_model_path, tiny_tokenizer, tiny_dataset, tmp_path,
                                                       monkeypatch, partition):
    # Two correct short answers per group of 4: no step reaches 20 characters, so both cue skeletons are empty and
    # fall in the one "no retained cue" cluster. Their weights are then uniform (1 + the floor shift τ − 1): the
    # step is GRPO with the positive advantages x 1.05 -- said once, and logged every step as rate 1.0. A partition
    # that splits them gives rate 0; a group with a single correct answer has nothing to partition (no rate).
    texts = ["\\boxed{4}.", "So \\boxed{4}.", "\\boxed{5}.", "So \\boxed{6}."]
    if partition == "one_correct":
        texts[1] = "So \\boxed{7}."
    kwargs = {}
    if partition == "callable":
        kwargs["partition_fn"] = lambda completions, prompt: list(range(len(completions)))
    args = _config(tmp_path, cue_partition="callable" if partition == "callable" else "cue")
    trainer = CueGRPOTrainer(model=tiny_model_path, reward_funcs=boxed_four_accuracy, args=args,
                             train_dataset=tiny_dataset, **kwargs)
    _controlled(trainer, tiny_tokenizer, monkeypatch, texts, [True])
    records = _record_before_and_after(trainer, monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    single = [str(w.message) for w in caught if "cue/single_cluster_rate" in str(w.message)]
    rates = [log["cue/single_cluster_rate"] for log in trainer.state.log_history if "cue/single_cluster_rate" in log]
    if partition == "cue":
        assert rates == [1.0, 1.0]
        assert len(single) == 1 and "cue_partition" in single[0] and "one cluster" in single[0]
        for before, after in records:
            assert after[:2].tolist() == pytest.approx((1.05 * before[:2]).tolist()) and before[0] > 0
            assert after[2:].tolist() == before[2:].tolist()
    else:
        assert rates == ([0.0, 0.0] if partition == "callable" else [])
        assert not single


def test_truncated_correct_completion_is_not_in_the_positive_set(
    tiny_model_path, tiny_tokenizer, tiny_dataset, tmp_path, monkeypatch
):
    # mask_truncated_completions: row 1 ("Then ...", no EOS) is correct with A > 0 but its loss is masked.
    # Labels by first word: First/Then -> "a", So -> "b". With row 1 counted, P = {0, 1, 2} has clusters a: 2, b: 1
    # and row 0 would get less than row 2. Without it, P = {0, 2}: two singletons, |C|^-0.8 = 1 each, unit mean,
    # no clipping, floor delta = 1.05 - 1 -> both weights exactly 1.05.
    texts = ["First \\boxed{4}.", "Then \\boxed{4}.", "So \\boxed{4}.", "So \\boxed{5}."]
    seen = []

    def by_first_word(completions, prompt):
        seen.append(list(completions))
        return ["a" if text.split()[0] in ("First", "Then") else "b" for text in completions]

    args = _config(tmp_path, cue_partition="callable", max_steps=1, mask_truncated_completions=True)
    trainer = CueGRPOTrainer(model=tiny_model_path, reward_funcs=boxed_four_accuracy, args=args,
                             train_dataset=tiny_dataset, partition_fn=by_first_word)
    _controlled(trainer, tiny_tokenizer, monkeypatch, texts, [True, False, True, True])
    records = _record_before_and_after(trainer, monkeypatch)
    trainer.train()
    (before, after), = records
    assert before[:3].gt(0).all() and before[3] < 0
    assert seen == [["First \\boxed{4}.", "So \\boxed{4}."]]
    assert after[0].item() == pytest.approx(1.05 * before[0].item(), rel=1e-6)
    assert after[2].item() == pytest.approx(1.05 * before[2].item(), rel=1e-6)
    assert after[1].item() == before[1].item() and after[3].item() == before[3].item()


def test_partition_fn_returning_none_is_a_clear_error(tiny_model_path, tiny_tokenizer, tiny_dataset, tmp_path,
                                                      monkeypatch):
    def forgot_return(completions, prompt):
        [len(c) for c in completions]

    trainer = CueGRPOTrainer(model=tiny_model_path, reward_funcs=boxed_four_accuracy,
                             args=_config(tmp_path, cue_partition="callable", max_steps=1),
                             train_dataset=tiny_dataset, partition_fn=forgot_return)
    _controlled(trainer, tiny_tokenizer, monkeypatch, ["\\boxed{4}", "x \\boxed{4}", "\\boxed{5}", "\\boxed{6}"], [True])
    with pytest.raises(ValueError, match=r"partition_fn=.*forgot_return\) must return .* it returned None"):
        trainer.train()


def test_two_rewards_with_lora_positive_set_follows_the_first_reward(tiny_model_path, tiny_dataset, tmp_path):
    # The user scenario on sampled text: [accuracy-like, format-like] with the format reward true for every row,
    # LoRA, two steps. Every completion the partition sees is correct under the first reward (odd length).
    from peft import LoraConfig

    calls = []

    def by_length(completions, prompt):
        calls.append(list(completions))
        return [len(text) % 3 for text in completions]

    def always_formatted(completions, **kwargs):
        return [1.0] * len(completions)

    trainer = CueGRPOTrainer(
        model=tiny_model_path, reward_funcs=[length_parity_reward, always_formatted],
        args=_config(tmp_path, cue_partition="callable", loss_type="dapo"), train_dataset=tiny_dataset,
        partition_fn=by_length,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    logs = _train_two_steps(trainer)
    assert calls and all(len(text) % 2 == 1 for texts in calls for text in texts)
    assert all(log["cue/frac_positive_advantage_excluded"] == 0.0 for log in logs)  # correct <=> A > 0 here


# ---------------------------------------------------------------------------------------------------------------
# Drop-in: the configurations of TRL's own GRPO tests

from tests.trainers.dropin_configs import DROPIN_CONFIGS, DROPIN_EVAL_CONFIGS  # noqa: E402


def _half(completions, **kwargs):
    return [float(i % 2) for i in range(len(completions))]


@pytest.mark.parametrize("overrides", DROPIN_CONFIGS)
def test_dropin_trains_with_trl_grpo_test_configurations(tiny_model_path, tiny_dataset, tmp_path, overrides):
    import math

    settings = dict(max_steps=1, max_completion_length=4)
    settings.update(overrides)
    trainer = CueGRPOTrainer(model=tiny_model_path, reward_funcs=[length_parity_reward, _half],
                             args=_config(tmp_path, **settings), train_dataset=tiny_dataset)
    trainer.train()
    assert trainer.state.global_step == 1
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])


@pytest.mark.parametrize("overrides", DROPIN_EVAL_CONFIGS)
def test_dropin_evaluates_with_trl_grpo_test_configurations(tiny_model_path, tiny_dataset, tmp_path, overrides):
    settings = dict(max_steps=2, per_device_eval_batch_size=4, max_completion_length=4, eval_strategy="steps",
                    eval_steps=2)
    settings.update(overrides)
    trainer = CueGRPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward,
                             args=_config(tmp_path, **settings), train_dataset=tiny_dataset,
                             eval_dataset=tiny_dataset.select(range(4)))
    trainer.train()
    assert any("eval_loss" in log for log in trainer.state.log_history)


def test_random_partition_resumes_from_a_checkpoint_as_the_straight_run(tiny_model_path, tiny_dataset, tmp_path,
                                                                        monkeypatch):
    # The random partition is seeded by the generation round; the round count travels with the checkpoint, so a run
    # resumed at step 2 draws the straight run's partitions and ends with its weights. Random text has no cues (one
    # cluster, nothing to draw): here every positive is its own cue cluster, so m = |P| labels are drawn.
    monkeypatch.setattr(cue_trainer_module, "partition_skeletons",
                        lambda skeletons, rho, epsilon: (list(range(len(skeletons))), [10] * len(skeletons)))

    def run(folder, resume=None, **kwargs):
        args = _config(tmp_path / folder, cue_partition="random", max_steps=4, num_generations=8,
                       per_device_train_batch_size=8, max_completion_length=16, seed=0, **kwargs)
        trainer = CueGRPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=args,
                                 train_dataset=tiny_dataset)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    straight = run("a", save_strategy="steps", save_steps=2)
    logs = [log for log in straight.state.log_history if "cue/frac_groups_redistributed" in log]
    assert all(log.get("cue/clusters_per_group", 0) > 1 for log in logs[2:])
    resumed = run("b", resume=str(tmp_path / "a" / "checkpoint-2"))
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b), f"{name} differs by {(a - b).abs().max().item():.3g} after resuming"
