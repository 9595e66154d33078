"""Credit rules on multi-turn completions (docs/multiturn.md): a user's ``rollout_func`` returns 2-turn completions
with an environment result in the middle (``env_mask`` 0 on it, TRL's ``tool_mask``), and every rule that needs no
generation of its own credits only the model's tokens, checked against the rules written out in plain loops here
(nothing from the code under test): outcome (GRPO), OPPO (no evidence and no credit on environment tokens), process
credit (model turns as steps), Cue-GRPO's texts (the model's only). Rollouts that generate themselves refuse it by
name."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from trl_credit import CreditConfig, CreditTrainer, OPPOConfig, OPPOTrainer
from trl_credit.core.steps import model_turn_spans, span_texts, step_spans
from trl_credit.tasks.rewards import completion_text
from tests.tiny import recorded

# One completion: model turn 1, an environment result (env_mask 0), model turn 2 ending with EOS. Row j of a group
# answers ANSWERS[j % 4] in its second turn; the first turn is the same for all.
TURN_1 = "Step 1: compute 12 * 3 = 36."
ENVIRONMENT = " The result is 36."
ANSWERS = ["36", "7", "36", "4"]


def _turn_2(j):
    return f" So \\boxed{{{ANSWERS[j % 4]}}}."


def scripted_rollout(prompts, trainer):
    """A user's rollout_func: TRL's contract (prompt_ids, completion_ids, logprobs, env_mask), one row per prompt."""
    tokenizer = trainer.processing_class
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    for j, prompt in enumerate(prompts):
        prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        prompt_ids = prompt_ids["input_ids"] if hasattr(prompt_ids, "keys") else prompt_ids
        first = tokenizer.encode(TURN_1, add_special_tokens=False)
        env = tokenizer.encode(ENVIRONMENT, add_special_tokens=False)
        second = tokenizer.encode(_turn_2(j), add_special_tokens=False) + [tokenizer.eos_token_id]
        out["prompt_ids"].append(list(prompt_ids))
        out["completion_ids"].append(first + env + second)
        out["logprobs"].append([0.0] * (len(first) + len(env) + len(second)))
        out["env_mask"].append([1] * len(first) + [0] * len(env) + [1] * len(second))
    return out


def accuracy(completions, answer, **kwargs):
    """The verifier: 1 when the boxed answer is 36 (the environment's text holds no box)."""
    return [float("\\boxed{36}" in completion_text(c)) for c in completions]


def formatted(completions, **kwargs):
    return [1.0 if "So" in completion_text(c) else 0.0 for c in completions]


def settings(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=64,
                  max_steps=1, learning_rate=1e-2, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                  logging_steps=1, seed=0)
    values.update(overrides)
    return values


def _rows(batch):
    """Each row's completion ids and model mask (1 on the model's tokens), up to its EOS."""
    rows = []
    for r in range(batch["completion_ids"].size(0)):
        n = int(batch["completion_mask"][r].sum())
        rows.append((batch["completion_ids"][r, :n].tolist(), batch["tool_mask"][r, :n].tolist()))
    return rows


# ------------------------------------------------------------------------------------------- the steps
def test_model_turns_and_steps_leave_the_environment_out(tiny_tokenizer):
    assert model_turn_spans([1, 1, 0, 0, 1, 1]) == [(0, 2), (4, 6)]
    assert model_turn_spans([0, 1, 0]) == [(1, 2)]
    assert model_turn_spans([1, 1]) == [(0, 2)] and model_turn_spans([0, 0]) == []
    first = tiny_tokenizer.encode("a b", add_special_tokens=False)
    env = tiny_tokenizer.encode(" c d", add_special_tokens=False)
    second = tiny_tokenizer.encode(" e f", add_special_tokens=False)
    ids, mask = first + env + second, [1] * len(first) + [0] * len(env) + [1] * len(second)
    a, b = len(first), len(first) + len(env)
    turns = [(0, a), (b, len(ids))]
    assert step_spans(ids, tiny_tokenizer, " ", mask, "auto") == turns  # multi-turn: model turns
    assert step_spans(ids, tiny_tokenizer, " ", mask, "turns") == turns
    assert span_texts(ids, turns, tiny_tokenizer, " ") == ["a b", "e f"]  # (the delimiter " " reads as a space)
    thoughts = step_spans(ids, tiny_tokenizer, " ", mask, "thoughts")  # thoughts inside each turn, none across
    assert all(end <= a or start >= b for start, end in thoughts) and len(thoughts) >= 3
    assert [t for t in span_texts(ids, thoughts, tiny_tokenizer, "@") if t] == ["a", "b", "e", "f"]
    # single-turn: thoughts under "auto", one step under "turns"
    assert step_spans(first, tiny_tokenizer, " ", None, "turns") == [(0, a)]
    with pytest.raises(ValueError, match="unit must be one of"):
        step_spans(ids, tiny_tokenizer, " ", mask, "lines")


# ------------------------------------------------------------------------------------------- outcome (GRPO)
def test_outcome_credit_keeps_environment_tokens_out_of_the_loss(tiny_model_path, tiny_dataset, tmp_path):
    trainer = CreditTrainer(tiny_model_path, [accuracy, formatted], args=CreditConfig(**settings(tmp_path)),
                            train_dataset=tiny_dataset, rollout_func=scripted_rollout)
    batches, losses = recorded(trainer)
    trainer.train()
    batch = batches[0]
    # GRPO by hand: rewards accuracy + format = 2, 1, 2, 1 in every group: mean 1.5, std (unbiased) 0.5774
    std = statistics.stdev([2.0, 1.0, 2.0, 1.0])
    expected = [(2.0 - 1.5) / (std + 1e-4), (1.0 - 1.5) / (std + 1e-4)] * 4
    assert batch["advantages"].tolist() == pytest.approx(expected, abs=1e-5)
    for ids, mask in _rows(batch):
        assert 0 in mask and mask.count(0) == len(trainer.processing_class.encode(ENVIRONMENT,
                                                                                  add_special_tokens=False))


# ------------------------------------------------------------------------------------------- OPPO
def _logps(model, context, completion):
    ids = torch.tensor([list(context) + list(completion)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    logps = torch.log_softmax(logits[len(context) - 1: len(context) - 1 + len(completion)], dim=-1)
    return [logps[t, completion[t]].item() for t in range(len(completion))]


def oppo_reference(model, tokenizer, inputs, batch, G, C=3.0, alpha=1.0, eps=1e-6):
    """docs/multiturn.md#oppo in plain loops: l_{t+1} = l_t + m_t clip(o_t - s_t), A_t = m_t sign(A^seq)|V_{t+1} - V_t|,
    normalized over the model tokens of the group."""
    rows = _rows(batch)
    raw = []
    for i, (ids, mask) in enumerate(rows):
        messages = [dict(m) for m in inputs[i]["prompt"]]
        messages[-1]["content"] += f"\n\nThe correct final answer is {inputs[i]['answer']}."
        oracle = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        oracle = oracle["input_ids"] if hasattr(oracle, "keys") else oracle
        plain = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        o, s = _logps(model, oracle, ids), _logps(model, plain, ids)
        correct = [ANSWERS[j % 4] == "36" for j in range((i // G) * G, (i // G + 1) * G)]
        k = sum(correct)
        sign = 1.0 if ANSWERS[i % 4] == "36" else -1.0  # total 2 or 1 against the mean 1.5
        ell = math.log((k + alpha) / (G - k + alpha))
        row = []
        for t in range(len(ids)):
            log_lambda = max(-C, min(C, o[t] - s[t])) if mask[t] else 0.0
            a = 1 / (1 + math.exp(-(ell + log_lambda))) - 1 / (1 + math.exp(-ell))
            row.append(sign * abs(a) if mask[t] else 0.0)
            ell += log_lambda
        raw.append(row)
    expected = []
    for i, (ids, mask) in enumerate(rows):
        group = range((i // G) * G, (i // G + 1) * G)
        tokens = [raw[j][t] for j in group for t in range(len(rows[j][0])) if rows[j][1][t]]
        mean, std = statistics.fmean(tokens), statistics.pstdev(tokens)
        expected.append([(x - mean) / (std + eps) if m else 0.0 for x, m in zip(raw[i], mask)])
    return expected


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_oppo_reads_the_environment_but_credits_only_the_model(loss_type, tiny_model_path, tiny_dataset, tmp_path):
    trainer = OPPOTrainer(tiny_model_path, [accuracy, formatted], args=OPPOConfig(**settings(tmp_path,
                                                                                              loss_type=loss_type)),
                          train_dataset=tiny_dataset, rollout_func=scripted_rollout)
    batches, losses = recorded(trainer)
    model = trainer.accelerator.unwrap_model(trainer.model)
    references = []
    trainer.add_credit_callback(lambda step: references.append(
        oppo_reference(model, trainer.processing_class, step.inputs, step.output, 4)))
    trainer.train()
    batch, expected = batches[0], references[0]
    for r, (ids, mask) in enumerate(_rows(batch)):
        got = batch["advantages"][r, : len(ids)].tolist()
        assert got == pytest.approx(expected[r], abs=1e-3)
        assert all(g == 0.0 for g, m in zip(got, mask) if not m)  # the environment's tokens: no credit
    assert sum(abs(x) > 1e-3 for row in expected for x in row) > 10  # not vacuous
    logs = trainer.state.log_history[0]
    assert logs["oppo/extra_pass_rows"] in (1.0, 2.0)


# ------------------------------------------------------------------------------------------- process credit
def turn_rewards(prompt, completion, steps, **row):
    """One reward per model turn: 1 for a turn holding 36, else 0."""
    return [float("36" in step) for step in steps]


def test_process_credit_takes_model_turns_as_steps(tiny_model_path, tiny_dataset, tmp_path):
    from trl_credit.process import ProcessCredit

    args = CreditConfig(**settings(tmp_path, credit="process", loss_type="grpo"))
    trainer = CreditTrainer(tiny_model_path, [accuracy, formatted], args=args, train_dataset=tiny_dataset,
                            rollout_func=scripted_rollout, credit=ProcessCredit(step_reward=turn_rewards))
    batches, losses = recorded(trainer)
    trainer.train()
    batch = batches[0]
    # By hand (DeepSeekMath 4.1.3 over turns): every row's turn 1 scores 1; turn 2 scores 1 for rows 0, 2 of a group
    # (answer 36), 0 for rows 1, 3. The group's 8 step rewards 1,1,1,0,1,1,1,0: mean 0.75, squared deviations
    # 6 * 0.0625 + 2 * 0.5625 = 1.5, std (unbiased) sqrt(1.5/7) = 0.46291. r~ = 0.25/s = 0.53995 for a 1,
    # -0.75/s = -1.61984 for a 0 (s = std + 1e-4). Turn 1's tokens: r~_1 + r~_2; the environment's: 0; turn 2's: r~_2.
    s = math.sqrt(1.5 / 7) + 1e-4
    assert (0.25 / s, -0.75 / s) == pytest.approx((0.53995, -1.61984), abs=1e-5)
    high, low = 0.25 / s, -0.75 / s
    for r, (ids, mask) in enumerate(_rows(batch)):
        second = high if ANSWERS[r % 4] == "36" else low
        turn_1, env_end = mask.index(0), len(mask) - mask[::-1].index(0)
        want = [high + second] * turn_1 + [0.0] * (env_end - turn_1) + [second] * (len(ids) - env_end)
        assert batch["advantages"][r, : len(ids)].tolist() == pytest.approx(want, abs=1e-4), r
    logs = trainer.state.log_history[0]
    assert logs["process/steps_per_completion"] == 2.0


def test_environment_step_reward_needs_an_environment_with_turn_rewards():
    from trl_credit.process.step_rewards import environment_turn_rewards

    class Env:
        turn_rewards = [1.0, None, 0.0]

    class Method:
        def turn_rewards(self):  # a public method would be one of the model's tools: refused
            return [1.0]

    assert environment_turn_rewards("p", "c", ["a", "b", "c"], env=Env()) == [1.0, None, 0.0]
    with pytest.warns(UserWarning, match=r"holds 3 rewards for a rollout of 2 model turns"):
        assert environment_turn_rewards("p", "c", ["a", "b"], env=Env()) == [None, None]  # never misaligned
    with pytest.raises(ValueError, match="needs an environment_factory"):
        environment_turn_rewards("p", "c", ["a"])
    for env in (object(), Method()):
        with pytest.raises(ValueError, match="has no turn_rewards list"):
            environment_turn_rewards("p", "c", ["a"], env=env)


# ------------------------------------------------------------------------------------------- Cue-GRPO's texts
def test_the_record_holds_the_models_text_only(tiny_model_path, tmp_path):
    from datasets import Dataset

    texts = []
    dataset = Dataset.from_dict({"prompt": ["What is 12 * 3?"] * 8, "answer": ["36"] * 8})  # plain-text prompts
    trainer = CreditTrainer(tiny_model_path, [accuracy, formatted], args=CreditConfig(**settings(tmp_path)),
                            train_dataset=dataset, rollout_func=plain_rollout,
                            on_credit=lambda step: texts.extend(step.record.completions))
    trainer.train()
    assert texts and all(ENVIRONMENT.strip() not in t for t in texts)
    assert texts[0] == TURN_1 + "\n" + _turn_2(0)


def plain_rollout(prompts, trainer):
    tokenizer = trainer.processing_class
    out = scripted_rollout([[{"role": "user", "content": p}] for p in prompts], trainer)
    out["prompt_ids"] = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    return out


# ------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("overrides", [dict(rollout="resets", num_generations=8), dict(rollout="trees", credit="blocks")])
def test_rollouts_that_generate_themselves_refuse_a_rollout_func_by_name(overrides, tiny_model_path, tiny_dataset,
                                                                         tmp_path):
    with pytest.raises(ValueError, match=r"does not support a custom `rollout_func`: .* A rollout_func is accepted by "
                                         r"credit='outcome' \(GRPO\), credit='oppo'"):
        CreditTrainer(tiny_model_path, [accuracy, formatted], args=CreditConfig(**settings(tmp_path, **overrides)),
                      train_dataset=tiny_dataset, rollout_func=scripted_rollout)


def test_auto_steps_are_turns_for_every_row_of_a_tool_loop(tmp_path):
    from types import SimpleNamespace

    from trl_credit.core.context import BatchContext
    from trl_credit.process.parts import step_unit

    args = CreditConfig(**settings(tmp_path, credit="process"))
    plain = BatchContext(args=args)
    tools = BatchContext(args=args, sampling=SimpleNamespace(tool_loop=True))
    assert step_unit(plain, [1, 1, 1]) == "thoughts" and step_unit(plain, [1, 0, 1]) == "turns"
    assert step_unit(tools, [1, 1, 1]) == "turns"  # a row that called no tool: one turn, one step
    assert step_unit(BatchContext(args=CreditConfig(**settings(tmp_path, credit="process",
                                                               process_steps="thoughts"))), [1, 0, 1]) == "thoughts"
    with pytest.raises(ValueError, match="process_steps must be one of 'auto'"):
        CreditConfig(**settings(tmp_path, credit="process", process_steps="lines"))


# ------------------------------------------------------------------------------------------- two processes
def _multiturn_run(model_path, out_dir, nproc, credit):
    import json
    import os

    from tests.mp import run_torchrun

    os.makedirs(out_dir)
    run_torchrun("tests/mp_scripts/multiturn_two_processes.py", model_path, out_dir, credit, nproc=nproc, timeout=600)
    reports = [json.load(open(os.path.join(out_dir, f"result_{rank}.json"))) for rank in range(nproc)]
    assert all(report["world"] == nproc and report["steps"] == 2 for report in reports)
    assert all(report["logs"] == reports[0]["logs"] for report in reports)  # metrics over the global batch
    rows = {(step, row): (mask, advantages) for report in reports for step, row, mask, advantages in report["records"]}
    return rows, reports[0]["logs"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("credit", ["oppo", "process"])
def test_a_group_split_across_two_processes_gets_one_process_credit(credit, tiny_model_path, tmp_path):
    """One group of 4 multi-turn rows on 2 processes (2 rows each) or on one: the same per-token advantages (OPPO's
    token moments and the process credit's step rewards gathered from both), 0 on every environment token, and the
    same metrics."""
    rows_two, logs_two = _multiturn_run(tiny_model_path, str(tmp_path / "two"), 2, credit)
    rows_one, logs_one = _multiturn_run(tiny_model_path, str(tmp_path / "one"), 1, credit)
    assert len(rows_one) == 8 and rows_two.keys() == rows_one.keys()  # 2 steps x 4 rows
    for key, (mask, advantages) in rows_one.items():
        assert rows_two[key][0] == mask and 0 in mask
        assert rows_two[key][1] == pytest.approx(advantages, rel=1e-5, abs=1e-5), key
        assert all(a == 0.0 for a, m in zip(advantages, mask) if not m)
    assert any(abs(a) > 0.1 for _, advantages in rows_one.values() for a in advantages)
    assert len(logs_one) == 2
    for log_one, log_two in zip(logs_one, logs_two, strict=True):
        assert log_two == pytest.approx(log_one, rel=1e-5)
