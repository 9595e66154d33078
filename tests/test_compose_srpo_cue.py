"""SRPO's resets x Cue-GRPO's rarity weights (issue 22): ``CreditTrainer`` with ``CreditConfig(rollout="resets",
modifiers=["cue"])`` applies the rarity weights within each of SRPO's sub-groups (each prompt's base group, each
reset group; fallback rows are in none). Expected advantages are computed here from the recorded completions with
plain loops (the rewards from the texts, the sub-groups from SRPO's row layout), never from the trainer's record."""

import json
import math
import os
import statistics

import pytest
import torch

from trl_credit import CreditConfig
from trl_credit.core.trainer import CreditTrainer
from trl_credit.cue_grpo.parts import RarityWeights
from trl_credit.cue_grpo.weights import compute_rarity_weights
from trl_credit.srpo.parts import Resets
from trl_credit.tasks.rewards import completion_text
from tests.tiny import recorded

TEMPLATE = "Q: {question}"
NUM_BASE, NUM_SUFFIXES, ROWS_PER_PROMPT = 4, 4, 8


def accuracy_reward(completions, **kwargs):
    # The verifier (success_reward=0): correct when the text length is odd, so about half the rollouts fail.
    return [float(len(completion_text(c)) % 2) for c in completions]


def format_reward(completions, **kwargs):
    # A format reward every rollout satisfies: totals shift by 1, P still follows the verifier.
    return [1.0 for _ in completions]


def length_class(completions, prompt):
    # Deterministic strategy labels: the text length mod 4 (1 or 3 for a correct, odd-length completion).
    return [len(text) % 4 for text in completions]


def settings(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path),
        rollout="resets",
        modifiers=["cue"],
        cue_partition="callable",
        per_device_train_batch_size=16,  # two prompts of num_generations = 8 rows: 4 base + 1 reset group of 4
        num_generations=ROWS_PER_PROMPT,
        reset="random",
        reset_groups=1,
        suffixes_per_reset=NUM_SUFFIXES,
        seed_candidates_per_round=2,
        max_seed_rounds=3,
        max_completion_length=12,
        max_steps=1,
        learning_rate=1e-2,
        thought_delimiter=" ",
        rollout_template=TEMPLATE,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    values.update(overrides)
    return CreditConfig(**values)


def reference_advantages(rewards):
    # TRL: (r - mean) / (unbiased std + 1e-4), 0 when the group's std is 0.
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)
    return [0.0 if std == 0 else (r - mean) / (std + 1e-4) for r in rewards]


def first_appearance_ids(labels):
    ids = {}
    return [ids.setdefault(label, len(ids)) for label in labels]


def expected_batch(tokenizer, batch, args, classes=None):
    """Per row: SRPO's sub-group advantage of the total reward, times the rarity weight of the row's sub-group's
    partition when the row is in that sub-group's P (correct, A > 0, some loss token); fallback rows 0. Also the
    sub-groups, the P of each and the partition_fn's view (texts, prompt) per sub-group with |P| > 1."""
    in_loss = ((batch["completion_mask"] * batch["tool_mask"]).sum(dim=1) > 0).tolist()
    texts = [tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
             for ids, mask in zip(batch["completion_ids"], batch["completion_mask"])]
    accuracy = [float(len(text) % 2) for text in texts]
    num_rows = len(texts)
    expected = [0.0] * num_rows
    sub_groups, positives, calls = [], {}, []
    for start in range(0, num_rows, ROWS_PER_PROMPT):
        base = list(range(start, start + NUM_BASE))
        reset = list(range(start + NUM_BASE, start + ROWS_PER_PROMPT))
        # A reset group without a seed is fallback rows: no loss token at all (TRL's tool_mask 0).
        sub_groups += [base] + ([reset] if any(in_loss[row] for row in reset) else [])
    for index, rows in enumerate(sub_groups):
        advantages = reference_advantages([accuracy[row] + 1.0 for row in rows])
        for row, advantage in zip(rows, advantages):
            expected[row] = advantage
        members = [row for row, a in zip(rows, advantages) if a > 0 and accuracy[row] >= 1.0 and in_loss[row]]
        if not members:
            continue
        positives[index] = members
        classes = classes or (lambda shown: length_class(shown, None))
        labels = classes([texts[row] for row in members]) if len(members) > 1 else [0]
        if len(members) > 1:
            calls.append(([texts[row] for row in members], batch["inputs"][rows[0] % num_rows]["prompt"]))
        weights = compute_rarity_weights(first_appearance_ids(labels), None, args.cue_resolved_alpha,
                                         args.cue_gamma_min, args.cue_gamma_max, args.cue_tau,
                                         args.cue_weighting).weights
        for row, weight in zip(members, weights):
            expected[row] *= weight
    return expected, sub_groups, positives, calls, texts


@pytest.mark.parametrize("rollout", ["passed", "from_names"])
def test_rarity_weights_within_each_srpo_sub_group(rollout, tiny_model_path, tiny_dataset, tmp_path):
    """One step, two prompts (8 rows each: a base group of 4, a reset group of 4). Seed 2 gives prompt 1 no
    incorrect seed (its reset group is fallback rows) and prompt 2 a reset group with three correct suffix rows in two
    classes, so each kind of sub-group and the fallback are exercised."""
    calls = []

    def partition_fn(completions, prompt):
        calls.append((list(completions), prompt))
        return length_class(completions, prompt)

    args = settings(tmp_path, seed=2)
    parts = {"rollout": Resets()} if rollout == "passed" else {}  # else built from args.rollout
    trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=tiny_dataset,
                            modifiers=[RarityWeights(partition_fn=partition_fn)], **parts)
    assert isinstance(trainer.rollout, Resets)
    batches, losses = recorded(trainer)
    trainer.train()
    assert trainer.state.global_step == 1 and len(batches) == 1
    batch = batches[0]
    expected, sub_groups, positives, expected_calls, texts = expected_batch(trainer.processing_class, batch, args)
    assert [rows[0] for rows in sub_groups] == [0, 8, 12]  # rows 4-7: prompt 1's fallback rows
    torch.testing.assert_close(batch["advantages"], torch.tensor(expected, dtype=batch["advantages"].dtype),
                               rtol=0, atol=1e-4)
    # What TRL's loss receives: the same advantages, in TRL's shuffled micro-batch order.
    reaching = torch.cat([micro["advantages"] for micro in losses])
    torch.testing.assert_close(reaching.sort().values, torch.tensor(expected).sort().values, rtol=0, atol=1e-4)
    # partition_fn saw each sub-group's positive full completions (shared prefix + suffix) and the dataset's prompt.
    assert calls == expected_calls and len(calls) == 3

    # Hand-worked, the reset group of prompt 2 (rows 12-15): accuracy 1, 1, 1, 0 -> totals 2, 2, 2, 1, mean 1.75,
    # unbiased std 0.5: A = 0.25 / 0.5001 for the correct rows, -0.75 / 0.5001 for the last. P = rows 12-14, full
    # texts of length 3, 1, 1 mod 4: clusters {12}, {13, 14}. cr weights (alpha 0.8, tau 1.05): s = 1, 2^-0.8, 2^-0.8,
    # mean m = (1 + 2 * 2^-0.8) / 3; s / m + (1.05 - 2^-0.8 / m) -> 1 / m + 1.05 - 2^-0.8 / m, 1.05, 1.05.
    assert [len(texts[row]) % 2 for row in range(12, 16)] == [1, 1, 1, 0]
    assert [len(texts[row]) % 4 for row in range(12, 15)] == [3, 1, 1]
    m = (1 + 2 * 2**-0.8) / 3
    rare = 1 / m + 1.05 - 2**-0.8 / m
    assert rare == pytest.approx(1.64429, abs=1e-5)
    hand = [0.25 / 0.5001 * rare, 0.25 / 0.5001 * 1.05, 0.25 / 0.5001 * 1.05, -0.75 / 0.5001]
    torch.testing.assert_close(batch["advantages"][12:16], torch.tensor(hand), rtol=0, atol=1e-5)
    assert batch["advantages"][4:8].tolist() == [0.0] * 4

    log = next(log for log in trainer.state.log_history if "cue/frac_groups_redistributed" in log)
    # Over SRPO's three sub-groups (the fallback rows are in none): all have a positive, one a non-uniform weight.
    assert log["cue/frac_groups_redistributed"] == pytest.approx(len(positives) / len(sub_groups)) == 1.0
    assert log["cue/frac_groups_nonuniform"] == pytest.approx(1 / 3)


def test_judge_sees_each_sub_group_and_the_question(tiny_model_path, tiny_dataset, tmp_path, monkeypatch):
    """cue_judge_completions="all": the judge is shown every row of the sub-group (SRPO's base group or one reset
    group, full completions; never fallback rows nor the other sub-group of the prompt) and the dataset's question,
    not SRPO's rollout template. The tiny policy cannot answer in the judge's format: each judged sub-group is one
    cluster, so its P gets the uniform cr weight (tau)."""
    import trl_credit.cue_grpo.parts as cue_parts

    shown, real = [], cue_parts.judge_messages

    def recording(problem, completions, *rest):
        shown.append((problem, list(completions)))
        return real(problem, completions, *rest)

    monkeypatch.setattr(cue_parts, "judge_messages", recording)
    args = settings(tmp_path, seed=2, cue_partition="judge", cue_judge_model="policy", cue_judge_max_new_tokens=4)
    trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=tiny_dataset)
    batches, _ = recorded(trainer)
    trainer.train()
    batch = batches[0]
    expected, sub_groups, positives, _, texts = expected_batch(trainer.processing_class, batch, args, lambda t: [0] * len(t))
    judged = [index for index, members in positives.items() if len(members) > 1]
    assert judged
    questions = [batch["inputs"][sub_groups[index][0]]["prompt"][-1]["content"] for index in judged]
    assert all(not question.startswith("Q:") for question in questions)
    assert shown == [(question, [texts[row] for row in sub_groups[index]]) for question, index in zip(questions, judged)]
    torch.testing.assert_close(batch["advantages"], torch.tensor(expected, dtype=batch["advantages"].dtype),
                               rtol=0, atol=1e-4)
    log = next(log for log in trainer.state.log_history if "cue/judge_parse_failure_rate" in log)
    assert log["cue/judge_parse_failure_rate"] == 1.0


@pytest.mark.parametrize(
    "overrides, modifier, message",
    [
        ({"cue_partition": "callable"}, None, r"cue_partition='callable' needs RarityWeights\(partition_fn=fn\)"),
        ({"cue_partition": "cue"}, RarityWeights(partition_fn=length_class),
         r"partition_fn was given but cue_partition='cue'; set CreditConfig\(cue_partition='callable'\)"),
        ({"cue_partition": "judge"}, None, r"cue_partition='judge' needs a judge: CreditConfig\(cue_judge_model="),
    ],
    ids=["callable_without_fn", "fn_without_callable", "judge_without_model"],
)
def test_partition_arguments_are_checked_at_construction(overrides, modifier, message, tiny_model_path, tiny_dataset,
                                                         tmp_path):
    """A composed trainer checks the rarity weights' partition source as CueGRPOTrainer does, at construction, instead
    of ignoring a partition_fn or failing at the first step."""
    parts = {"modifiers": [modifier]} if modifier is not None else {}
    with pytest.raises(ValueError, match=message):
        CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=settings(tmp_path, **overrides),
                      train_dataset=tiny_dataset, **parts)


# ---------------------------------------------------------------- two processes


def _equivalence_run(model_path, out_dir, nproc):
    from tests.mp import run_torchrun

    os.makedirs(out_dir)
    run_torchrun("tests/mp_scripts/srpo_cue_equivalence.py", model_path, out_dir, nproc=nproc, timeout=600)
    runs = {}
    for partition in ("callable", "cue"):
        reports = [json.load(open(os.path.join(out_dir, f"result_{partition}_{rank}.json"))) for rank in range(nproc)]
        assert all(report["world"] == nproc and report["steps"] == 2 for report in reports)
        assert all(report["logs"] == reports[0]["logs"] for report in reports)  # metrics over the global batch
        rows = {(step, row): (text, advantage) for report in reports for step, row, text, advantage in report["records"]}
        runs[partition] = (rows, reports[0]["logs"])
    return runs


@pytest.mark.multiprocess
def test_two_processes_equal_one_process(tiny_model_path, tmp_path):
    """One prompt per process (2 processes) or both on one: the same global rows (deterministic generations, oracle
    resets) get the same advantages, and the cue/ and srpo/ metrics are the same."""
    two = _equivalence_run(tiny_model_path, str(tmp_path / "two"), 2)
    one = _equivalence_run(tiny_model_path, str(tmp_path / "one"), 1)
    for partition in ("callable", "cue"):
        (rows_one, logs_one), (rows_two, logs_two) = one[partition], two[partition]
        assert len(rows_one) == 32 and rows_two.keys() == rows_one.keys()  # 2 steps x 16 rows
        for key, (text, advantage) in rows_one.items():
            assert rows_two[key][0] == text
            assert rows_two[key][1] == pytest.approx(advantage, rel=1e-6, abs=1e-7), (partition, key)
        assert len(logs_one) == 2 and logs_one[0]["srpo/fallback_rate"] < 1.0
        assert logs_one[0]["cue/frac_groups_nonuniform"] > 0
        for log_one, log_two in zip(logs_one, logs_two, strict=True):
            assert log_two == pytest.approx(log_one)
    # Hand check, step 0, prompt 1's base group (rows 0-3: the \sqrt text, substitute, a wrong answer, substitute):
    # accuracy 1, 1, 0, 1 -> A = 0.25 / 0.5001 for the correct rows; clusters {0}, {1, 3} (by_first_cue) -> cr weights
    # 1 / m + 1.05 - 2^-0.8 / m, 1.05, 1.05 with m = (1 + 2 * 2^-0.8) / 3.
    rows = two["callable"][0]
    assert ["substitute" in rows[(0, row)][0] for row in range(4)] == [False, True, False, True]
    assert ["boxed{4}" in rows[(0, row)][0] for row in range(4)] == [True, True, False, True]
    m = (1 + 2 * 2**-0.8) / 3
    hand = [0.25 / 0.5001 * (1 / m + 1.05 - 2**-0.8 / m), 0.25 / 0.5001 * 1.05, -0.75 / 0.5001, 0.25 / 0.5001 * 1.05]
    assert [rows[(0, row)][1] for row in range(4)] == pytest.approx(hand, abs=1e-5)


# ---------------------------------------------------------------- SmolLM2 (slow)


def lines_reward(completions, **kwargs):
    # A format reward: the answer is written on two or more lines (SRPO's "lines" thoughts).
    return [float(completion_text(c).count("\n") >= 1) for c in completions]


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_smollm2_lora_two_steps(loss_type, tmp_path):
    from peft import LoraConfig

    from trl_credit.models import default_model_path
    from trl_credit.tasks.data import make_arithmetic_dataset
    from trl_credit.tasks.rewards import final_number_reward

    torch.set_num_threads(1)  # shared CPUs: oversubscribed threads make generation many times slower
    dataset = make_arithmetic_dataset(num_train=16, num_test=2, digits=1, num_operands=2)["train"]
    args = CreditConfig(
        output_dir=str(tmp_path), rollout="resets", modifiers=["cue"], loss_type=loss_type,
        per_device_train_batch_size=8, num_generations=8, max_completion_length=48, max_steps=2, learning_rate=5e-5,
        thought_delimiter="\n", rollout_template="lines", localization_max_tokens=16, max_seed_rounds=2,
        report_to="none", use_cpu=True, save_strategy="no", logging_steps=1,
    )
    trainer = CreditTrainer(default_model_path(), [final_number_reward, lines_reward], args=args,
                            train_dataset=dataset, peft_config=LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM"))
    batches, _ = recorded(trainer)
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    assert trainer.state.global_step == 2
    logs = [log for log in trainer.state.log_history if "cue/frac_groups_redistributed" in log]
    assert len(logs) == 2
    for log, batch in zip(logs, batches, strict=True):
        assert math.isfinite(log["loss"]) and 0.0 <= log["srpo/fallback_rate"] <= 1.0
        assert 0.0 <= log["cue/frac_groups_redistributed"] <= 1.0
        assert torch.isfinite(batch["advantages"]).all()
        # Fallback rows (no loss token): zero advantage.
        fallback = (batch["completion_mask"] * batch["tool_mask"]).sum(dim=1) == 0
        assert (batch["advantages"][fallback] == 0).all()
    if any(batch["advantages"].abs().sum() > 0 for batch in batches):  # LoRA B starts at zero and moves with a signal
        assert any(not torch.equal(lora_before[n], p.detach()) for n, p in trainer.model.named_parameters()
                   if n in lora_before)
