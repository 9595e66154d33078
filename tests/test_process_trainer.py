"""credit="process" in training (docs/process.md): the advantages reaching TRL's loss equal the DeepSeekMath §4.1.3
formula computed here with plain loops from the recorded completions (the steps from SRPO's thought splitting, the
step rewards from the test's step-reward function, the groups from the row layout), never from the credit's record.
On GRPO's groups, SRPO's resets (sub-groups, the shared prefix out of the statistics) and with Cue-GRPO's weights."""

from __future__ import annotations

import math
import statistics
from collections import Counter

import pytest
import torch

from trl_credit import CreditConfig
from trl_credit.core.trainer import CreditTrainer
from trl_credit.cue_grpo.parts import RarityWeights
from trl_credit.cue_grpo.weights import compute_rarity_weights
from trl_credit.process.parts import ProcessCredit
from trl_credit.process.step_rewards import STEP_REWARDS, register_step_reward
from trl_credit.core.steps import split_thoughts, thought_texts
from trl_credit.tasks.rewards import completion_text
from tests.tiny import recorded

EPS = 1e-4  # TRL's std + 1e-4
DELIMITER = " "  # the tiny random model writes few newlines; spaces give several steps per completion


def accuracy_reward(completions, **kwargs):
    # The verifier (first reward function): correct when the text length is odd. A length that is a multiple of 7
    # gets None here and from the format reward: an unscorable row.
    return [None if len(completion_text(c)) % 7 == 0 else float(len(completion_text(c)) % 2) for c in completions]


def format_reward(completions, **kwargs):
    return [None if len(completion_text(c)) % 7 == 0 else 1.0 for c in completions]


def step_scores(prompt, completion, steps, **row):
    # A deterministic "step checker" on the step text: 1 for an even length, 0 for odd, no reward for a multiple of 5.
    assert isinstance(completion, str) and "answer" in row and "prompt" not in row
    return [None if len(step) % 5 == 0 else float(len(step) % 2 == 0) for step in steps]


def length_class(completions, prompt):
    return [len(text) % 4 for text in completions]


def tiny_args(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path), credit="process", process_thought_delimiter=DELIMITER,
                  per_device_train_batch_size=8, num_generations=4, max_completion_length=12, max_steps=1,
                  learning_rate=1e-2, report_to="none", use_cpu=True, save_strategy="no", logging_steps=1, seed=0)
    values.update(overrides)
    return CreditConfig(**values)


def reference(tokenizer, batch, groups, outcome=False):
    """The paper's formula, plain loops. ``groups``: lists of rows sharing statistics (other rows get 0). Returns the
    (B, T) advantages, each row's sequence value (its first trained token's advantage) and per-row step info."""
    num_rows, num_tokens = batch["completion_ids"].shape
    rows = []
    for r in range(num_rows):
        ids = batch["completion_ids"][r][batch["completion_mask"][r].bool()].tolist()
        text = tokenizer.decode(ids, skip_special_tokens=True)
        tool = batch["tool_mask"][r][: len(ids)].tolist() if "tool_mask" in batch else [1] * len(ids)
        prefix = tool.index(1) if 1 in tool else len(ids)  # SRPO's masked shared prefix
        ends = split_thoughts(ids, tokenizer, DELIMITER)
        steps = thought_texts(ids, ends, tokenizer, DELIMITER)
        rewards = step_scores(batch["inputs"][r]["prompt"], text, steps, answer=batch["inputs"][r]["answer"])
        scorable = len(text) % 7 != 0
        if outcome and scorable:  # accuracy + format, weights 1: one more step at the last token
            ends, rewards = [*ends, len(ids)], [*rewards, float(len(text) % 2) + 1.0]
        rows.append(dict(ids=ids, text=text, prefix=prefix, ends=ends, rewards=rewards, scorable=scorable))
    expected = [[0.0] * num_tokens for _ in range(num_rows)]
    sequence = [0.0] * num_rows
    for group in groups:
        members = [r for r in group if rows[r]["scorable"]]
        pooled = [x for r in members for end, x in zip(rows[r]["ends"], rows[r]["rewards"])
                  if x is not None and end > rows[r]["prefix"]]
        std = statistics.stdev(pooled) if len(pooled) >= 2 else 0.0
        if std == 0:
            continue  # no spread: 0 everywhere
        mean = statistics.mean(pooled)
        for r in members:
            row = rows[r]
            for t in range(len(row["ids"])):
                expected[r][t] = sum((x - mean) / (std + EPS) for end, x in zip(row["ends"], row["rewards"])
                                     if x is not None and end > row["prefix"] and end - 1 >= t)
            sequence[r] = expected[r][row["prefix"]] if row["prefix"] < len(row["ids"]) else 0.0
    return expected, sequence, rows


def groups_of(num_rows, size):
    return [list(range(start, start + size)) for start in range(0, num_rows, size)]


def check_loss_inputs(batch, losses, expected):
    """TRL's loss receives the batch's advantages (its micro-batches shuffled): the same row per completion."""
    want = Counter((tuple(ids.tolist()), tuple(round(a, 4) for a in adv))
                   for ids, adv in zip(batch["completion_ids"], torch.tensor(expected).tolist()))
    got = Counter((tuple(ids.tolist()), tuple(round(a, 4) for a in adv.tolist()))
                  for micro in losses for ids, adv in zip(micro["completion_ids"], micro["advantages"]))
    assert got == want


# ------------------------------------------------------------------------------------------- GRPO's groups
@pytest.mark.parametrize("source", ["passed", "registered"])
def test_one_step_gives_the_papers_token_advantages(source, tiny_model_path, tiny_dataset, tmp_path):
    if source == "registered":  # one registration makes a step-reward function nameable in the config
        register_step_reward("test_step_scores", step_scores)
        parts, args = {}, tiny_args(tmp_path, process_step_reward="test_step_scores")
    else:
        parts, args = {"credit": ProcessCredit(step_reward=step_scores)}, tiny_args(tmp_path)
    try:
        trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args,
                                train_dataset=tiny_dataset, **parts)
        batches, losses = recorded(trainer)
        trainer.train()
    finally:
        STEP_REWARDS.pop("test_step_scores", None)
    assert isinstance(trainer.credit, ProcessCredit) and trainer._name == "groups x process"
    batch = batches[0]
    expected, sequence, rows = reference(trainer.processing_class, batch, groups_of(8, 4))
    assert batch["advantages"].dim() == 2
    torch.testing.assert_close(batch["advantages"], torch.tensor(expected, dtype=batch["advantages"].dtype),
                               rtol=0, atol=1e-5)
    assert any(abs(a) > 0.1 for row in expected for a in row), "no signal: the check would be vacuous"
    assert max(len(row["ends"]) for row in rows) > 2  # several steps per completion
    check_loss_inputs(batch, losses, expected)
    torch.testing.assert_close(batch["sequence_anchors"], torch.tensor(sequence), rtol=0, atol=1e-5)

    # Metrics over the credited (scorable) rows, from the reference's steps.
    credited = [row for row in rows if row["scorable"]]
    steps = sum(len(row["ends"]) for row in credited)
    log = next(entry for entry in trainer.state.log_history if "process/steps_per_completion" in entry)
    assert log["process/steps_per_completion"] == pytest.approx(steps / len(credited))
    assert log["process/unscored_step_rate"] == pytest.approx(
        sum(x is None for row in credited for x in row["rewards"]) / steps)
    assert log["process/no_delimiter_rate"] == pytest.approx(sum(len(r["ends"]) == 1 for r in credited) / len(credited))
    zeros = [row["rewards"].index(0.0) + 1 for row in credited if 0.0 in row["rewards"]]
    assert log["process/zero_step_rate"] == pytest.approx(len(zeros) / len(credited))
    assert log.get("process/first_zero_step_mean", 0.0) == pytest.approx(sum(zeros) / len(zeros) if zeros else 0.0)
    assert log["process/nonfinite_reward_rate"] == 0.0


def test_the_outcome_as_a_final_step(tiny_model_path, tiny_dataset, tmp_path):
    args = tiny_args(tmp_path, process_outcome="final_step")
    trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=tiny_dataset,
                            credit=ProcessCredit(step_reward=step_scores))
    batches, losses = recorded(trainer)
    trainer.train()
    batch = batches[0]
    expected, _, _ = reference(trainer.processing_class, batch, groups_of(8, 4), outcome=True)
    torch.testing.assert_close(batch["advantages"], torch.tensor(expected, dtype=batch["advantages"].dtype),
                               rtol=0, atol=1e-5)
    check_loss_inputs(batch, losses, expected)


def test_a_step_reward_function_is_required(tiny_model_path, tiny_dataset, tmp_path):
    # (a user's rollout_func is accepted: tests/test_multiturn_credit.py)
    with pytest.raises(ValueError, match="credit='process' needs a step-reward function"):
        CreditTrainer(tiny_model_path, [accuracy_reward], args=tiny_args(tmp_path), train_dataset=tiny_dataset)


# ------------------------------------------------------------------------------------------- SRPO's resets
NUM_BASE, NUM_SUFFIXES, ROWS_PER_PROMPT = 4, 4, 8


def resets_args(tmp_path, **overrides):
    return tiny_args(tmp_path, rollout="resets", per_device_train_batch_size=16, num_generations=ROWS_PER_PROMPT,
                     reset="random", reset_groups=1, suffixes_per_reset=NUM_SUFFIXES, seed_candidates_per_round=2,
                     max_seed_rounds=3, thought_delimiter=DELIMITER, rollout_template="Q: {question}", **overrides)


def resets_groups(batch):
    """SRPO's sub-groups from the row layout: per prompt the base rows, then the reset rows unless they are fallback
    rows (no loss token at all)."""
    in_loss = ((batch["completion_mask"] * batch["tool_mask"]).sum(dim=1) > 0).tolist()
    groups = []
    for start in range(0, len(in_loss), ROWS_PER_PROMPT):
        reset = list(range(start + NUM_BASE, start + ROWS_PER_PROMPT))
        groups += [list(range(start, start + NUM_BASE))] + ([reset] if any(in_loss[r] for r in reset) else [])
    return groups


@pytest.mark.parametrize("with_cue", [False, True])
def test_resets_sub_groups_with_the_prefix_out_of_the_statistics(with_cue, tiny_model_path, tiny_dataset, tmp_path):
    """Seed 2 (as tests/test_compose_srpo_cue.py): prompt 1's reset group is fallback rows, prompt 2's a reset group
    whose suffix rows share a masked prefix."""
    extra = {"modifiers": ["cue"], "cue_partition": "callable"} if with_cue else {}
    modifiers = [RarityWeights(partition_fn=length_class)] if with_cue else None
    args = resets_args(tmp_path, seed=2, **extra)
    trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=tiny_dataset,
                            credit=ProcessCredit(step_reward=step_scores), modifiers=modifiers)
    batches, losses = recorded(trainer)
    trainer.train()
    batch = batches[0]
    groups = resets_groups(batch)
    assert [rows[0] for rows in groups] == [0, 8, 12]
    expected, sequence, rows = reference(trainer.processing_class, batch, groups)
    assert any(row["prefix"] > 0 for row in rows[12:16]), "no shared prefix: the check would be vacuous"
    if with_cue:
        plain, expected = expected, cue_weighted(expected, sequence, rows, groups, args)
        assert expected != plain, "no rarity weight applied: the check would be vacuous"
    torch.testing.assert_close(batch["advantages"], torch.tensor(expected, dtype=batch["advantages"].dtype),
                               rtol=0, atol=1e-5)
    assert batch["advantages"][4:8].abs().sum() == 0  # fallback rows
    check_loss_inputs(batch, losses, expected)


def cue_weighted(expected, sequence, rows, groups, args):
    """Cue-GRPO on per-token credit (docs/composition.md): P = correct rows with a positive sequence value, in the
    loss, in groups whose outcome rewards vary; each P row's positive tokens times its rarity weight."""
    weighted = [list(row) for row in expected]
    for group in groups:
        totals = {float(len(rows[r]["text"]) % 2) + 1.0 for r in group if rows[r]["scorable"]}
        if len(totals) < 2:
            continue
        members = [r for r in group if rows[r]["scorable"] and len(rows[r]["text"]) % 2 == 1 and sequence[r] > 1e-9
                   and rows[r]["prefix"] < len(rows[r]["ids"])]
        if not members:
            continue
        labels = length_class([rows[r]["text"] for r in members], None) if len(members) > 1 else [0]
        ids = {}
        clusters = [ids.setdefault(label, len(ids)) for label in labels]
        weights = compute_rarity_weights(clusters, None, args.cue_resolved_alpha, args.cue_gamma_min,
                                         args.cue_gamma_max, args.cue_tau, args.cue_weighting).weights
        for r, w in zip(members, weights):
            weighted[r] = [a * w if a > 0 else a for a in weighted[r]]
    return weighted


def test_groups_with_cue(tiny_model_path, tiny_dataset, tmp_path):
    """Seed 2: group 1 holds two correct rows, one with a positive process total (in P) and one with a negative one
    (out of P: Cue-GRPO reads the sequence direction from the process credit, not from the outcome)."""
    args = tiny_args(tmp_path, modifiers=["cue"], cue_partition="callable", seed=2)
    trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=tiny_dataset,
                            credit=ProcessCredit(step_reward=step_scores),
                            modifiers=[RarityWeights(partition_fn=length_class)])
    batches, losses = recorded(trainer)
    trainer.train()
    batch = batches[0]
    plain, sequence, rows = reference(trainer.processing_class, batch, groups_of(8, 4))
    expected = cue_weighted(plain, sequence, rows, groups_of(8, 4), args)
    torch.testing.assert_close(batch["advantages"], torch.tensor(expected, dtype=batch["advantages"].dtype),
                               rtol=0, atol=1e-5)
    assert expected != plain, "no rarity weight applied: the check would be vacuous"
    correct = [r for r in range(4) if len(rows[r]["text"]) % 2 == 1]
    assert len(correct) == 2 and sorted(sequence[r] > 0 for r in correct) == [False, True]
    check_loss_inputs(batch, losses, expected)


# ------------------------------------------------------------------------------------------- LoRA, loss types, chain
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_lora_two_steps_per_token_advantages_train_the_adapter(loss_type, tiny_model_path, tiny_dataset, tmp_path):
    from peft import LoraConfig

    args = tiny_args(tmp_path, loss_type=loss_type, max_steps=2, seed=2)
    trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=tiny_dataset,
                            credit=ProcessCredit(step_reward=step_scores),
                            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                   task_type="CAUSAL_LM"))
    adapter = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if "lora_B" in name}
    batches, losses = recorded(trainer)
    trainer.train()
    assert trainer.state.global_step == 2 and len(batches) == 2
    for batch in batches:  # each step's advantages are the paper's formula on that step's completions
        expected, _, _ = reference(trainer.processing_class, batch, groups_of(8, 4))
        torch.testing.assert_close(batch["advantages"], torch.tensor(expected, dtype=batch["advantages"].dtype),
                                   rtol=0, atol=1e-5)
    assert any(batch["advantages"].abs().sum() > 0 for batch in batches)
    moved = [name for name, p in trainer.model.named_parameters()
             if name in adapter and not torch.equal(p, adapter[name])]
    assert moved, "the LoRA adapter did not move"
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_the_chain_built_in_in_training(tiny_model_path, tmp_path):
    """The chain task's step checker by name, on the chain dataset: the random tiny model writes no valid step, so
    every completion's first step is wrong (0 from it on), and the credit says so in its metrics."""
    from trl_credit.tasks.chain import chain_format_reward, make_chain_dataset
    from trl_credit.tasks.rewards import accuracy_reward as accuracy

    dataset = make_chain_dataset(num_train=8, num_test=2, seed=0)["train"]
    args = tiny_args(tmp_path, process_step_reward="chain", process_thought_delimiter="\n")
    trainer = CreditTrainer(tiny_model_path, [accuracy, chain_format_reward], args=args, train_dataset=dataset)
    batches, _ = recorded(trainer)
    trainer.train()
    log = next(entry for entry in trainer.state.log_history if "process/steps_per_completion" in entry)
    assert log["process/zero_step_rate"] == 1.0 and log["process/first_zero_step_mean"] == 1.0
    assert log["process/unscored_step_rate"] == 0.0
    assert batches[0]["advantages"].abs().sum() == 0  # all step rewards 0 in every group: no spread, as GRPO


# ------------------------------------------------------------------------------------------- two processes
def _process_run(model_path, out_dir, nproc):
    import json
    import os

    from tests.mp import run_torchrun

    os.makedirs(out_dir)
    run_torchrun("tests/mp_scripts/process_two_processes.py", model_path, out_dir, nproc=nproc, timeout=600)
    reports = [json.load(open(os.path.join(out_dir, f"result_{rank}.json"))) for rank in range(nproc)]
    assert all(report["world"] == nproc and report["steps"] == 2 for report in reports)
    assert all(report["logs"] == reports[0]["logs"] for report in reports)  # metrics over the global batch
    rows = {(step, row): (text, advantages) for report in reports for step, row, text, advantages in report["records"]}
    return rows, reports[0]["logs"]


@pytest.mark.multiprocess
def test_two_processes_equal_one_process(tiny_model_path, tmp_path):
    """One group of 8 rows spanning both processes (4 rows each) or all on one: the same rows get the same per-token
    advantages (the group's step rewards gathered from both), and the process/ and cue/ metrics are the same."""
    rows_two, logs_two = _process_run(tiny_model_path, str(tmp_path / "two"), 2)
    rows_one, logs_one = _process_run(tiny_model_path, str(tmp_path / "one"), 1)
    assert len(rows_one) == 16 and rows_two.keys() == rows_one.keys()  # 2 steps x 8 rows
    for key, (text, advantages) in rows_one.items():
        assert rows_two[key][0] == text
        assert rows_two[key][1] == pytest.approx(advantages, rel=1e-6, abs=1e-7), key
    assert any(abs(a) > 0.1 for _, advantages in rows_one.values() for a in advantages)
    assert len(logs_one) == 2 and logs_one[0]["process/steps_per_completion"] > 1
    for log_one, log_two in zip(logs_one, logs_two, strict=True):
        assert log_two == pytest.approx(log_one)
    # By hand, step 0 (generation call 1: row r writes text (r + 1) mod 5 of the script): rows 0-7 are B C D E A B C D
    # with step rewards B [1, 0, 0], C [None, 1, 1], D [0, 0], E and A [1, 1, 1]. R: 12 ones and 8 zeros, mean 0.6,
    # unbiased variance (12 * 0.4² + 8 * 0.6²) / 19 = 4.8 / 19; r~ = 0.4 / s for a 1, -0.6 / s for a 0.
    s = math.sqrt(4.8 / 19) + EPS
    # Row 0 (B, wrong, outside Cue-GRPO's P): step 1's tokens 0.4 - 0.6 - 0.6 = -0.8 / s, step 2's -1.2 / s, step 3's
    # (and the EOS) -0.6 / s. Row 2 (D): -1.2 / s, then -0.6 / s.
    assert runs(rows_one[(0, 0)][1]) == pytest.approx([-0.8 / s, -1.2 / s, -0.6 / s])
    assert runs(rows_one[(0, 2)][1]) == pytest.approx([-1.2 / s, -0.6 / s])


def runs(values):
    """The values of consecutive runs of equal values (the tokens of one step share their advantage)."""
    collapsed = []
    for value in values:
        if not collapsed or abs(collapsed[-1] - value) > 1e-6:
            collapsed.append(value)
    return collapsed


def test_resets_with_another_step_delimiter_is_warned(tiny_model_path, tiny_dataset, tmp_path):
    args = resets_args(tmp_path, process_step_reward="chain")  # thought_delimiter " ", process delimiter "\n"
    args.process_thought_delimiter = "\n"
    with pytest.warns(UserWarning, match="a reset point may fall inside a step"):
        CreditTrainer(tiny_model_path, [accuracy_reward], args=args, train_dataset=tiny_dataset)


def test_evaluation_and_off_policy_masking(tiny_model_path, tmp_path):
    """Evaluation batches get process credit too (metrics under eval_process/), and TRL's per-sequence
    off_policy_mask_threshold decides from each row's sequence advantage with the (B, T) advantages."""
    from trl_credit.tasks.data import make_arithmetic_dataset

    data = make_arithmetic_dataset(num_train=8, num_test=4, seed=0)
    args = tiny_args(tmp_path, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8,
                     off_policy_mask_threshold=0.5)
    trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=data["train"],
                            eval_dataset=data["test"], credit=ProcessCredit(step_reward=step_scores))
    trainer.train()
    evaluation = next(log for log in trainer.state.log_history if "eval_loss" in log)
    assert evaluation["eval_process/steps_per_completion"] >= 1 and math.isfinite(evaluation["eval_loss"])


# ------------------------------------------------------------------------------------------- truncated rows
def _scripted(trainer, tokenizer, monkeypatch, texts, eos):
    """Every generation call returns ``texts`` (one per row, repeated), ending with EOS where ``eos`` says."""

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        ids = [tokenizer(texts[i % len(texts)], add_special_tokens=False)["input_ids"]
               + ([tokenizer.eos_token_id] if eos[i % len(eos)] else []) for i in range(len(prompt_ids))]
        return ids, None

    monkeypatch.setattr(trainer, "_generate_single_turn", generate)


def good_or_bad(prompt, completion, steps, **row):
    return [1.0 if step == "good" else 0.0 for step in steps]


def ends_good(completions, **kwargs):  # a verifier that scores every row (none unscorable)
    return [float(completion_text(c).endswith("good")) for c in completions]


def always_formatted(completions, **kwargs):
    return [1.0] * len(completions)


@pytest.mark.parametrize("masked", [False, True])
def test_truncated_rows_keep_their_steps_in_the_group_statistics(tiny_model_path, tiny_tokenizer, tiny_dataset,
                                                                 tmp_path, monkeypatch, recwarn, masked):
    """mask_truncated_completions masks a truncated row's loss, as TRL's GRPO does, and changes nothing else: its
    steps stay in R (TRL's GRPO keeps a truncated row's reward in its group's mean and std; DATPO x Cue a truncated
    leaf's reward in its tree's values), so the finished rows' advantages are the same with and without the flag.
    Before the fix, the masked row had no step (its completion_mask is all 0): R lost its two 0s, and the row was
    reported as "scored no step"."""
    # One group of 4 (steps "good" 1, "bad" 0, one step per line): A good/good, B good/bad, C bad/bad (truncated: no
    # EOS), D good/bad. R = {1, 1, 1, 0, 0, 0, 1, 0}: mean 0.5, unbiased variance 8 * 0.25 / 7 = 2 / 7, s = √(2/7)
    # + 1e-4 = 0.534622; r~ = ±0.5 / s = ±0.935239. Token advantages (sum over this and later steps): A's step 1
    # 2 * 0.935239 = 1.870478, step 2 0.935239; B's and D's step 1 0, step 2 -0.935239; C's step 1 -1.870478, step 2
    # -0.935239 (its loss is masked under the flag). Without C's steps (the bug) R = {1, 1, 1, 0, 1, 0}, mean 2/3,
    # std √(4/15) = 0.516398: A's step 1 would get 2 * (1/3) / 0.516498 = 1.290713.
    s = math.sqrt(2 / 7) + EPS
    up = 0.5 / s
    assert (2 * up, up) == pytest.approx((1.870478, 0.935239), abs=1e-6)
    texts = ["good\ngood", "good\nbad", "bad\nbad", "good\nbad"]
    args = tiny_args(tmp_path, process_thought_delimiter="\n", per_device_train_batch_size=4,
                     mask_truncated_completions=masked, max_completion_length=32)
    trainer = CreditTrainer(tiny_model_path, [ends_good, always_formatted], args=args, train_dataset=tiny_dataset,
                            credit=ProcessCredit(step_reward=good_or_bad))
    _scripted(trainer, tiny_tokenizer, monkeypatch, texts, [True, True, False, True])
    batches, losses = recorded(trainer)
    trainer.train()
    batch = batches[0]
    masks = batch["completion_mask"].sum(dim=1).tolist()
    assert (masks[2] == 0) == masked and all(m > 0 for m in masks[:2] + masks[3:])
    expected = {0: [2 * up, up], 1: [0.0, -up], 2: [-2 * up, -up], 3: [0.0, -up]}
    for row, values in expected.items():
        ids = batch["completion_ids"][row].tolist()
        length = len(tiny_tokenizer(texts[row], add_special_tokens=False)["input_ids"]) + (row != 2)
        advantages = batch["advantages"][row, :length].tolist()
        assert runs(advantages) == pytest.approx(values, abs=1e-5), (row, advantages)
        assert all(a == 0 for a in batch["advantages"][row, length:].tolist())
        assert ids[:length][-1] == (tiny_tokenizer.eos_token_id if row != 2 else ids[length - 1])
    log = next(entry for entry in trainer.state.log_history if "process/steps_per_completion" in entry)
    assert log["process/steps_per_completion"] == 2 and log["process/unscored_row_rate"] == 0
    assert not [w for w in recwarn if "scored no step" in str(w.message)]
