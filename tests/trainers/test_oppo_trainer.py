"""OPPOTrainer end to end on the CPU with the tiny model: self and teacher oracle, every TRL loss type, LoRA, KL,
plain-text prompts, refusals, and the advantages reaching the loss against an independent reference (docs/oppo.md)."""

import math
import shutil
from fractions import Fraction

import pytest
import torch
from datasets import Dataset

import trl_credit.core.scoring as scoring
from tests.tiny import build_tiny_model
from trl_credit import OPPOConfig, OPPOTrainer
from trl_credit.oppo.parts import ValueRecursion


def length_parity_reward(completions, **kwargs):
    # Reward with variance on random text (k varies, A^seq ≠ 0): parity of the completion's character count.
    return [float(len(c[0]["content"]) % 2) if isinstance(c, list) else float(len(c) % 2) for c in completions]


def alternating_reward(completions, **kwargs):
    # Rows of a group are consecutive: every group gets k = G/2, so A^seq ≠ 0 and the loss has a gradient.
    return [float(i % 2) for i in range(len(completions))]


def make_args(tmp_path, **overrides):
    defaults = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-2,
        report_to="none",
        logging_steps=1,
        use_cpu=True,
        bf16=False,  # exact float32 comparisons with the reference below
        save_strategy="no",
    )
    defaults.update(overrides)
    return OPPOConfig(**defaults)


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    """A second tiny model with different weights and the same tokenizer."""
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny_teacher")), seed=1)


# ------------------------------------------------------------------------------------------- reference (plain loops)
def _row_logps(model, context_ids, completion):
    ids = torch.tensor([list(context_ids) + list(completion)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    start = len(context_ids) - 1
    logps = torch.log_softmax(logits[start : start + len(completion)], dim=-1)
    return [logps[t, completion[t]].item() for t in range(len(completion))]


def parity_row(text, index):
    return [float(len(text) % 2)]


def reference_advantages(scorer, tokenizer, inputs, output, G, C=3.0, alpha=1.0, eps=1e-6, reward_row=parity_row,
                         aggregation="sum_then_normalize"):
    """docs/oppo.md#algorithm with Python floats, one row and one token at a time; nothing from trl_credit.oppo.

    ``reward_row(text, index) -> [r_1, r_2, ...]`` gives each reward function's raw value (None = not scored), with
    weights 1. Correct = r_1 >= 1 (the first reward is the verifier). A row is unscorable when every r is None: it
    is no trial of the prior (k and G count scorable rows), its advantage is 0 and its tokens stay out of the group's
    statistics. A scorable row whose verifier returned None is not correct: its verifier reward counts as 0 (docs/
    design.md#success-and-unscorable-rows). A^seq's sign, with the rewards as the exact decimals the reward functions
    return (so a tie is a tie): "sum_then_normalize": total minus the mean total of the group's scorable rows;
    "normalize_then_sum": the sum of each reward function's z-score in the group (TRL's formula, its 1e-4 included).
    """
    B = len(inputs)
    contexts, completions, rows = [], [], []
    for i in range(B):
        prompt_ids = output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist()
        completion = output["completion_ids"][i][output["completion_mask"][i].bool()].tolist()
        messages = [dict(m) for m in inputs[i]["prompt"]]
        messages[-1]["content"] += f"\n\nThe correct final answer is {inputs[i]['answer']}."
        oracle_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        oracle_ids = oracle_ids["input_ids"] if hasattr(oracle_ids, "keys") else oracle_ids
        contexts.append((list(oracle_ids), prompt_ids))
        completions.append(completion)
        rows.append(reward_row(tokenizer.decode(completion, skip_special_tokens=True), i))
    scorable = [any(r is not None for r in row) for row in rows]
    correct = [row[0] is not None and row[0] >= 1.0 for row in rows]
    # exact decimals; the verifier's None on a scorable row is 0, the other functions' None are left out
    exact = [[Fraction(repr(0.0 if r is None and f == 0 else r)) if r is not None or f == 0 else None
              for f, r in enumerate(row)] for row in rows]
    raw_rows = []
    for i in range(B):
        if not scorable[i]:
            raw_rows.append(None)
            continue
        group = [j for j in range((i // G) * G, (i // G + 1) * G) if scorable[j]]
        k = sum(1 for j in group if correct[j])
        if aggregation == "sum_then_normalize":
            totals = {j: sum(r for r in exact[j] if r is not None) for j in group}
            direction = totals[i] - sum(totals.values()) / len(group)
        else:
            direction = Fraction(0)
            for f in range(len(exact[i])):
                scored = [exact[j][f] for j in group if exact[j][f] is not None]
                if exact[i][f] is None or len(scored) < 2:
                    continue
                mean_f = sum(scored) / len(scored)
                std_f = math.sqrt(float(sum((r - mean_f) ** 2 for r in scored) / (len(scored) - 1)))
                direction += (exact[i][f] - mean_f) / Fraction(std_f + 1e-4)
        sign = float((direction > 0) - (direction < 0))
        o = _row_logps(scorer, contexts[i][0], completions[i])
        s = _row_logps(scorer, contexts[i][1], completions[i])
        ell = math.log((k + alpha) / (len(group) - k + alpha))
        row = []
        for t in range(len(completions[i])):
            log_lambda = max(-C, min(C, o[t] - s[t]))
            a = 1 / (1 + math.exp(-(ell + log_lambda))) - 1 / (1 + math.exp(-ell))
            row.append(sign * abs(a))
            ell += log_lambda
        raw_rows.append(row)
    normalized = []
    for i in range(B):
        if raw_rows[i] is None:
            normalized.append([0.0] * len(completions[i]))
            continue
        group = range((i // G) * G, (i // G + 1) * G)
        tokens = [x for j in group if raw_rows[j] is not None for x in raw_rows[j]]
        mean = sum(tokens) / len(tokens)
        std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / len(tokens))
        normalized.append([(x - mean) / (std + eps) for x in raw_rows[i]])
    return normalized


class CapturingOPPOTrainer(OPPOTrainer):
    """Records each generation batch (on_credit, with the reference computed before any optimizer step) and each loss
    input (a wrap: what each micro-batch hands TRL's loss, after its shuffle and split, which on_credit does not see)."""

    reference_scorer = None
    compute_reference = True
    reward_row = staticmethod(parity_row)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_credit_callback(self._record_generation)

    def _record_generation(self, step):
        if not self.compute_reference:
            return
        output = step.output
        scorer = self.reference_scorer or self.accelerator.unwrap_model(self.model)
        expected = reference_advantages(
            scorer, self._tokenizer, step.inputs, output, self.num_generations, reward_row=self.reward_row,
            aggregation=self.args.multi_objective_aggregation,
        )
        self.generations = getattr(self, "generations", []) + [(output, expected)]

    def _compute_loss(self, model, inputs):
        self.loss_inputs = getattr(self, "loss_inputs", []) + [{k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)}]
        return super()._compute_loss(model, inputs)


def _assert_matches_reference(trainer):
    assert trainer.generations, "no generation batch captured"
    nonzero = 0
    for output, expected in trainer.generations:
        advantages, mask = output["advantages"], output["completion_mask"]
        assert advantages.dim() == 2 and advantages.shape == output["completion_ids"].shape
        for i, row in enumerate(expected):
            n = int(mask[i].sum())
            # float32 log-probs (~1e-6 apart from the float64 reference) are divided by the group's token std in
            # the normalization, so compare at 1e-3: a misaligned token or a wrong formula is off by O(0.1-1).
            assert advantages[i, :n].tolist() == pytest.approx(row, abs=1e-3)
            assert advantages[i, n:].abs().sum().item() == 0.0
            nonzero += sum(abs(x) > 1e-3 for x in row)
    assert nonzero > 0, "all reference advantages were zero: the check would be vacuous"
    # What reaches TRL's loss: the same rows (shuffled by TRL), with the same (B, T) advantages.
    generated = {}
    for output, _ in trainer.generations:
        for i in range(output["completion_ids"].size(0)):
            key = (tuple(output["prompt_ids"][i].tolist()), tuple(output["completion_ids"][i].tolist()))
            generated.setdefault(key, []).append(output["advantages"][i])
    assert trainer.loss_inputs
    for inputs in trainer.loss_inputs:
        assert inputs["advantages"].dim() == 2
        for i in range(inputs["completion_ids"].size(0)):
            key = (tuple(inputs["prompt_ids"][i].tolist()), tuple(inputs["completion_ids"][i].tolist()))
            assert any(torch.equal(inputs["advantages"][i], a) for a in generated[key])


@pytest.fixture
def scored_rows(monkeypatch):
    """Row counts of every OPPO scoring call (to check self mode makes one call, of B or 2B rows)."""
    calls = []
    original = scoring.score_completions

    def recording(trainer, model, prompt_ids, *args, **kwargs):
        calls.append(prompt_ids.size(0))
        return original(trainer, model, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(scoring, "score_completions", recording)
    return calls


# ------------------------------------------------------------------------------------------- training runs
def test_self_oracle_trains_and_advantages_match_reference(tiny_model_path, tiny_dataset, tmp_path, scored_rows):
    trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=make_args(tmp_path), train_dataset=tiny_dataset)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
    _assert_matches_reference(trainer)
    # Self mode without TRL old log-probs: one scoring call per generation batch, of the 8 oracle rows only (s_t
    # recorded during generation).
    assert scored_rows == [8, 8]
    logs = [log for log in trainer.state.log_history if "oppo/value_mean" in log]
    assert len(logs) == 2
    for log in logs:
        assert 0.0 < log["oppo/value_mean"] < 1.0
        assert 0.0 <= log["oppo/evidence_clip_rate"] <= 1.0
        assert log["oppo/advantage_abs_mean"] > 0.0
        assert 0.0 < log["oppo/prior_value_mean"] < 1.0


def _text(completion):
    return completion[0]["content"] if isinstance(completion, list) else completion


def accuracy_like(completions, **kwargs):
    # The verifier: parity of the text length (varies on random text). Row 3 of every 4 is unscorable (None).
    return [None if i % 4 == 3 else float(len(_text(c)) % 2) for i, c in enumerate(completions)]


def format_like(completions, **kwargs):
    # A format reward true for every scorable row: with TRL's sum every scorable row has total >= 1.
    return [None if i % 4 == 3 else 1.0 for i, c in enumerate(completions)]


def accuracy_format_row(text, index):
    if index % 4 == 3:
        return [None, None]
    return [float(len(text) % 2), 1.0]


def test_two_rewards_k_follows_the_verifier_and_unscorable_rows_get_zero(
    tiny_model_path, tiny_dataset, tmp_path, monkeypatch
):
    # The user scenario: reward_funcs=[accuracy, format], format true for every row, plus rows no function scores.
    # Reference (hand formulas, Python floats): k counts rows whose *first* reward is >= 1 (not the total, which is
    # >= 1 for every scorable row and would give k = G), G counts scorable rows, unscorable rows get 0 everywhere
    # and stay out of the group's token mean/std. Before, k = 3 here for every group and unscorable rows got
    # (0 - mean)/std on each token.
    import trl_credit.oppo.parts as oppo_parts

    seen = []
    original = oppo_parts.bayesian_value_recursion

    def spy(*args, **kwargs):
        num_rows = args[4].numel()
        seen.append((args[4].tolist(), torch.as_tensor(args[5]).expand(num_rows).tolist()))
        return original(*args, **kwargs)

    monkeypatch.setattr(oppo_parts, "bayesian_value_recursion", spy)
    monkeypatch.setattr(CapturingOPPOTrainer, "reward_row", staticmethod(accuracy_format_row))
    accuracy = []

    def recording_accuracy(completions, **kwargs):
        values = accuracy_like(completions)
        accuracy.extend(math.nan if v is None else v for v in values)
        return values

    trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=[recording_accuracy, format_like],
                                   args=make_args(tmp_path), train_dataset=tiny_dataset)
    trainer.train()
    assert trainer.state.global_step == 2
    _assert_matches_reference(trainer)
    assert len(accuracy) == 16 and len(seen) == 2
    for step, (num_correct, group_size) in enumerate(seen):
        for row in range(8):
            group = range(step * 8 + (row // 4) * 4, step * 8 + (row // 4) * 4 + 4)
            assert num_correct[row] == sum(1 for j in group if accuracy[j] == 1.0)  # NaN != 1.0
            assert group_size[row] == 3
    assert 0 < sum(1 for a in accuracy if a == 1.0) < 12  # k is neither 0 nor G everywhere: the check is not vacuous
    for output, _ in trainer.generations:
        assert output["advantages"][3::4].abs().sum().item() == 0.0  # exactly 0 on every token of unscorable rows
    logs = [log for log in trainer.state.log_history if "oppo/unscorable_rate" in log]
    assert [log["oppo/unscorable_rate"] for log in logs] == [0.25, 0.25]
    for step, log in enumerate(logs):  # k / G over the batch: correct under the first reward / scorable rows
        correct = sum(1 for a in accuracy[step * 8 : step * 8 + 8] if a == 1.0)
        assert log["oppo/success_rate"] == pytest.approx(correct / 6)


def test_verifier_that_never_scores_warns(tiny_model_path, tiny_dataset, tmp_path):
    def never_scores(completions, **kwargs):
        return [None] * len(completions)

    args = make_args(tmp_path, max_steps=1, per_device_train_batch_size=4, max_completion_length=4)
    trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=[never_scores, length_parity_reward], args=args,
                          train_dataset=tiny_dataset)
    with pytest.warns(UserWarning, match=r"`success_reward` function \('never_scores'\) returned None"):
        trainer.train()
    log = next(log for log in trainer.state.log_history if "oppo/success_rate" in log)
    assert log["oppo/success_rate"] == 0.0


@pytest.mark.parametrize("reads_answer", [True, False])
def test_evidence_auc_tells_a_scorer_that_reads_the_answer_from_one_that_does_not(
    tiny_model_path, tiny_dataset, tmp_path, monkeypatch, reads_answer
):
    # The oracle's log-probs are set by hand from the plain ones: alternating_reward makes the odd rows of every group
    # of 4 correct (2 right, 2 wrong: 4 pairs a group, 8 a step). A scorer that reads the answer lifts a correct row's
    # first token by 1 and lowers a wrong row's: every pair ranked right, AUC 1. One that does not (the tool regime's
    # self-oracle: the appended sentence alone moves the first token, on every row) lowers every first token by 5,
    # clipped to -3 alike: every pair tied, AUC 0.5, and with the warning's pair count at 8 it warns after step 1.
    import warnings

    import trl_credit.oppo.parts as oppo_parts

    original = oppo_parts.score_evidence

    def hand_oracle(trainer, *args, student_logps=None, **kwargs):
        _, plain = original(trainer, *args, student_logps=student_logps, **kwargs)
        oracle = plain.clone()
        correct = torch.arange(plain.size(0)) % 2 == 1
        oracle[:, 0] += torch.where(correct, 1.0, -1.0) if reads_answer else -5.0
        return oracle, plain

    monkeypatch.setattr(oppo_parts, "score_evidence", hand_oracle)
    monkeypatch.setattr(oppo_parts, "EVIDENCE_AUC_WARN_PAIRS", 8)
    args = make_args(tmp_path, max_steps=2)
    trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=alternating_reward, args=args, train_dataset=tiny_dataset)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    values = [log["oppo/evidence_auc"] for log in trainer.state.log_history if "oppo/evidence_auc" in log]
    assert values == ([1.0, 1.0] if reads_answer else [0.5, 0.5])
    warned = [w for w in caught if "does not read the answer" in str(w.message)]
    assert len(warned) == (0 if reads_answer else 1)  # once, not every step
    if warned:
        assert "0.50 of 8 pairs" in str(warned[0].message) and "oracle='teacher'" in str(warned[0].message)


def test_one_extra_pass_matches_the_two_pass_path(tiny_model_path, tiny_dataset, tmp_path, scored_rows, monkeypatch):
    # Same seed, same weights, same first generation batch: s_t recorded during HF generation (plain_logps="auto",
    # the extra pass scores the B oracle rows) against s_t scored by a second forward over the plain rows
    # ("recompute", 2B rows). KV-cached decoding and a padded full forward agree to float32 round-off.
    import trl_credit.oppo.parts as oppo_parts

    seen = {}
    original = oppo_parts.score_evidence

    def record(trainer, *args, student_logps=None, **kwargs):
        oracle_logps, plain = original(trainer, *args, student_logps=student_logps, **kwargs)
        seen.setdefault(trainer.args.plain_logps, []).append((oracle_logps.clone(), plain.clone()))
        return oracle_logps, plain

    monkeypatch.setattr(oppo_parts, "score_evidence", record)
    advantages = {}
    original_advantages = ValueRecursion.token_advantages

    def record_advantages(self, trainer, batch, inputs, output):
        result = original_advantages(self, trainer, batch, inputs, output)
        advantages[trainer.args.plain_logps] = (result[0].clone(), output["completion_mask"].clone())
        return result

    monkeypatch.setattr(ValueRecursion, "token_advantages", record_advantages)
    runs = {}
    for source in ("auto", "recompute"):
        args = make_args(tmp_path / source, plain_logps=source, max_steps=1, max_completion_length=12, temperature=0.7,
                         top_p=0.9, repetition_penalty=1.3)  # sampling rules do not enter s_t
        trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=args,
                                       train_dataset=tiny_dataset)
        trainer.compute_reference = False
        trainer.train()
        runs[source] = trainer
    assert scored_rows == [8, 16]
    (auto_oracle, auto_plain), = seen["auto"]
    (re_oracle, re_plain), = seen["recompute"]
    assert torch.equal(auto_oracle, re_oracle)  # same rollouts, same oracle rows
    assert torch.allclose(auto_plain, re_plain, atol=1e-5), (auto_plain - re_plain).abs().max()
    assert (auto_plain != 0).any()
    logs = {source: next(log for log in t.state.log_history if "oppo/extra_pass_rows" in log) for source, t in runs.items()}
    assert logs["auto"]["oppo/extra_pass_rows"] == 1.0 and logs["recompute"]["oppo/extra_pass_rows"] == 2.0
    (auto_advantages, mask), (re_advantages, re_mask) = advantages["auto"], advantages["recompute"]
    assert torch.equal(mask, re_mask) and mask.sum() > 0
    assert torch.allclose(auto_advantages, re_advantages, atol=1e-3), (auto_advantages - re_advantages).abs().max()
    assert auto_advantages.abs().max() > 0.1  # not a comparison of zeros
    print("max |s_t auto - s_t recompute| =", (auto_plain - re_plain).abs().max().item(),
          "max |advantage difference| =", (auto_advantages - re_advantages).abs().max().item())


def test_self_oracle_reuses_trl_old_logps(tiny_model_path, tiny_dataset, tmp_path, scored_rows):
    # steps_per_generation=2 with no accumulation: TRL computes old_per_token_logps, which are s_t.
    args = make_args(tmp_path, per_device_train_batch_size=4, steps_per_generation=2)
    trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=args, train_dataset=tiny_dataset)
    trainer.train()
    assert scored_rows == [8]  # one generation batch of 8 rows, only the oracle rows scored
    assert "old_per_token_logps" in trainer.generations[0][0]
    _assert_matches_reference(trainer)


@pytest.mark.trl_smoke
def test_teacher_oracle_trains_and_advantages_match_reference(tiny_model_path, tiny_dataset, tmp_path, teacher_path, scored_rows):
    from transformers import AutoModelForCausalLM

    args = make_args(tmp_path, oracle="teacher", teacher_model_name_or_path=teacher_path)
    CapturingOPPOTrainer.reference_scorer = AutoModelForCausalLM.from_pretrained(teacher_path).eval()
    try:
        trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=args, train_dataset=tiny_dataset)
        teacher_before = {n: p.detach().clone() for n, p in trainer.teacher_model.named_parameters()}
        trainer.train()
    finally:
        CapturingOPPOTrainer.reference_scorer = None
    assert trainer.state.global_step == 2
    assert all(not p.requires_grad for p in trainer.teacher_model.parameters())
    assert all(torch.equal(teacher_before[n], p) for n, p in trainer.teacher_model.named_parameters())
    _assert_matches_reference(trainer)  # o_t and s_t from the teacher, not the policy
    assert scored_rows == [16, 16]


def test_teacher_given_as_instance(tiny_model_path, tiny_dataset, tmp_path, teacher_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(teacher_path)
    args = make_args(tmp_path, oracle="teacher", max_steps=1, per_device_train_batch_size=4, max_completion_length=4)
    trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=args, train_dataset=tiny_dataset,
                          teacher_model=teacher, teacher_processing_class=tiny_tokenizer)
    trainer.train()
    assert trainer.state.global_step == 1


def test_teacher_with_another_tokenizer_is_refused(tiny_model_path, tiny_dataset, tmp_path):
    from transformers import AutoTokenizer

    other = str(tmp_path / "other_teacher")
    shutil.copytree(tiny_model_path, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<|extra|>"])
    tokenizer.save_pretrained(other)
    args = make_args(tmp_path, oracle="teacher", teacher_model_name_or_path=other)
    with pytest.raises(ValueError, match="share the policy's tokenizer"):
        OPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=args, train_dataset=tiny_dataset)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
def test_every_trl_loss_type_takes_token_advantages(tiny_model_path, tiny_dataset, tmp_path, loss_type):
    extra = {"importance_sampling_level": "sequence"} if loss_type == "luspo" else {}
    args = make_args(tmp_path, loss_type=loss_type, max_steps=1, per_device_train_batch_size=4, max_completion_length=4, **extra)
    trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=alternating_reward, args=args, train_dataset=tiny_dataset)
    trainer.compute_reference = False
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 1
    assert all(inputs["advantages"].dim() == 2 for inputs in trainer.loss_inputs)
    assert math.isfinite(trainer.state.log_history[0]["loss"])
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())


def test_kl_with_reference_model(tiny_model_path, tiny_dataset, tmp_path):
    args = make_args(tmp_path, beta=0.1, max_steps=1, per_device_train_batch_size=4, max_completion_length=4)
    trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=args, train_dataset=tiny_dataset)
    trainer.train()
    assert trainer.ref_model is not None
    assert any("kl" in log for log in trainer.state.log_history)


def test_lora_with_kl(tiny_model_path, tiny_dataset, tmp_path):
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = make_args(tmp_path, beta=0.1, max_steps=2)
    trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=args,
                                   train_dataset=tiny_dataset, peft_config=peft_config)
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    assert lora_before
    trainer.train()
    assert any(not torch.equal(lora_before[n], p.detach()) for n, p in trainer.model.named_parameters() if "lora_" in n)
    assert any("kl" in log for log in trainer.state.log_history)
    _assert_matches_reference(trainer)  # the self-oracle is the adapted policy


def test_plain_text_prompts(tiny_model_path, tiny_dataset, tmp_path):
    dataset = Dataset.from_dict({"prompt": [p[0]["content"] for p in tiny_dataset["prompt"]], "answer": tiny_dataset["answer"]})
    trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=make_args(tmp_path, max_steps=1, per_device_train_batch_size=4, max_completion_length=4), train_dataset=dataset)
    trainer.train()
    assert any("oppo/value_mean" in log for log in trainer.state.log_history)


def test_ablation_switches_reach_the_recursion(tiny_model_path, tiny_dataset, tmp_path, monkeypatch):
    import trl_credit.oppo.parts as oppo_parts

    seen = []
    original = oppo_parts.bayesian_value_recursion

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(oppo_parts, "bayesian_value_recursion", spy)
    args = make_args(tmp_path, max_steps=1, direction_anchoring=False, use_prior=False, state_tracking=False,
                     evidence_clipping=False, log_lambda_only=True, per_device_train_batch_size=4, max_completion_length=4)
    trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=args, train_dataset=tiny_dataset)
    trainer.train()
    assert seen == [dict(anchoring=False, state_tracking=False, clipping=False, use_prior=False, log_lambda_only=True)]
    log = next(log for log in trainer.state.log_history if "oppo/prior_value_mean" in log)
    assert log["oppo/prior_value_mean"] == pytest.approx(0.5)  # no prior: V_0 = σ(0) whatever k is


# ------------------------------------------------------------------------------------------- refusals
def test_missing_answer_column_is_refused_before_loading(tiny_dataset, tmp_path):
    dataset = tiny_dataset.remove_columns("answer")
    with pytest.raises(ValueError, match="answer_column"):
        OPPOTrainer(model="does/not-exist", reward_funcs=length_parity_reward, args=make_args(tmp_path), train_dataset=dataset)
    args = make_args(tmp_path, answer_column="solution")
    with pytest.raises(ValueError, match="`solution`"):
        OPPOTrainer(model="does/not-exist", reward_funcs=length_parity_reward, args=args, train_dataset=tiny_dataset)


def test_grpo_config_and_teacher_mismatch_are_refused(tiny_dataset, tmp_path):
    from trl import GRPOConfig

    with pytest.raises(TypeError, match="OPPOConfig"):
        OPPOTrainer(model="x", reward_funcs=length_parity_reward, train_dataset=tiny_dataset,
                    args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none"))
    with pytest.raises(ValueError, match="needs a teacher"):
        OPPOTrainer(model="x", reward_funcs=length_parity_reward, train_dataset=tiny_dataset, args=make_args(tmp_path, oracle="teacher"))
    with pytest.raises(ValueError, match="oracle='teacher'"):
        OPPOTrainer(model="x", reward_funcs=length_parity_reward, train_dataset=tiny_dataset, args=make_args(tmp_path), teacher_model="y")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("oracle", "critic", "`oracle`"),
        ("oracle_template", "answer: {ans}", "oracle_template"),
        ("oracle_template", "no placeholder", "oracle_template"),
        ("evidence_clip", 0.0, "evidence_clip"),
        ("prior_strength", -1.0, "prior_strength"),
        ("advantage_eps", 0.0, "advantage_eps"),
        ("answer_column", "", "answer_column"),
        ("teacher_model_name_or_path", "some/teacher", "oracle='teacher'"),
    ],
)
def test_config_validation(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        make_args(tmp_path, **{field: value})


def test_evaluation_uses_oppo_advantages(tiny_model_path, tiny_dataset, tmp_path):
    args = make_args(tmp_path, per_device_train_batch_size=4, per_device_eval_batch_size=4, max_completion_length=4)
    trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=alternating_reward, args=args,
                                   train_dataset=tiny_dataset, eval_dataset=tiny_dataset.select(range(2)))
    trainer.compute_reference = False
    metrics = trainer.evaluate()
    assert "eval_loss" in metrics and "eval_oppo/value_mean" in metrics
    assert all(inputs["advantages"].dim() == 2 for inputs in trainer.loss_inputs)


# ------------------------------------------------------------------------------------------- answers (issue 11 item 3)
@pytest.mark.parametrize(
    "bad, message",
    [(None, "is None"), ("", "is an empty string"), ("  ", "is an empty string"), (float("nan"), "is nan"),
     ([4], "is a list")],
)
def test_bad_answer_is_refused_at_construction_with_its_row(tiny_dataset, tmp_path, bad, message):
    rows = tiny_dataset.to_list()
    rows[5]["answer"] = bad
    dataset = [dict(row) for row in rows]  # a map-style dataset (datasets would coerce the column's type)
    with pytest.raises(ValueError, match=rf"answer of row 5 of `train_dataset` {message}"):
        OPPOTrainer(model="does/not-exist", reward_funcs=length_parity_reward, args=make_args(tmp_path),
                    train_dataset=dataset)


def test_bad_answer_in_hf_dataset_and_eval_split_is_refused(tiny_dataset, tmp_path):
    dataset = tiny_dataset.map(lambda row, i: {"answer": "" if i == 6 else row["answer"]}, with_indices=True)
    with pytest.raises(ValueError, match=r"answer of row 6 of `train_dataset` is an empty string"):
        OPPOTrainer(model="x", reward_funcs=length_parity_reward, args=make_args(tmp_path), train_dataset=dataset)
    with pytest.raises(ValueError, match=r"row 6 of `eval_dataset\['dev'\]`"):
        OPPOTrainer(model="x", reward_funcs=length_parity_reward, args=make_args(tmp_path), train_dataset=tiny_dataset,
                    eval_dataset={"dev": dataset})


def test_numbers_and_strings_are_accepted_as_answers():
    from trl_credit.oppo.answers import answer_problem

    for good in ["17", " x = 2 ", 17, 2.5, -3, True]:
        assert answer_problem(good) is None
    for bad in [None, "", float("inf"), float("nan"), complex(1, 2), {"a": 1}, ("1",)]:
        assert answer_problem(bad) is not None


def test_bad_answer_of_an_iterable_dataset_is_refused_at_the_first_batch(tiny_model_path, tiny_dataset, tmp_path):
    from datasets import IterableDataset

    rows = tiny_dataset.to_list()
    for row in rows:  # whichever rows the first batch draws
        row["answer"] = None
    dataset = IterableDataset.from_generator(lambda: iter(rows))
    trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward,
                          args=make_args(tmp_path, max_steps=1, per_device_train_batch_size=4, max_completion_length=4),
                          train_dataset=dataset)  # construction cannot read an iterable dataset ahead
    with pytest.raises(ValueError, match=r"answer of row 0 of this process's batch \(step 0\) is None"):
        trainer.train()


# ------------------------------------------------------------------------------------------- per-sequence loss decisions
@pytest.mark.parametrize("loss_type", ["grpo", "vespo"])
def test_off_policy_mask_and_vespo_decide_per_sequence_from_the_sign_anchor(
    tiny_model_path, tiny_dataset, tmp_path, monkeypatch, loss_type
):
    # TRL keeps a sequence when A >= 0 or its mean KL <= threshold; a threshold of -1 makes the KL test fail (KL is
    # 0 on policy), so the mask is exactly "A^seq >= 0" per sequence. With OPPO's (B, T) advantages TRL alone
    # would decide per token (normalized token advantages of one completion take both signs).
    from trl import GRPOTrainer

    decisions = []
    original_mask, original_gamma = GRPOTrainer.get_off_policy_mask, GRPOTrainer.get_gamma_weights

    def record_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
        result = original_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold)
        decisions.append(("mask", advantages.clone(), result.clone()))
        return result

    def record_gamma(advantages, log_ratio_per_token, mask, importance_sampling_ratio, **kwargs):
        result = original_gamma(advantages, log_ratio_per_token, mask, importance_sampling_ratio, **kwargs)
        decisions.append(("gamma", advantages.clone(), result.clone()))
        return result

    monkeypatch.setattr(GRPOTrainer, "get_off_policy_mask", staticmethod(record_mask))
    monkeypatch.setattr(GRPOTrainer, "get_gamma_weights", staticmethod(record_gamma))
    losses = []
    args = make_args(tmp_path, loss_type=loss_type, off_policy_mask_threshold=-1.0, max_steps=1,
                     per_device_train_batch_size=8, max_completion_length=8)
    # Parity rewards give unbalanced groups (k != G/2): tokens of one sign's rows then straddle the group mean.
    trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=args,
                                   train_dataset=tiny_dataset)
    trainer.compute_reference = False
    trainer.train()
    inputs = trainer.loss_inputs[0]
    anchor = inputs["sequence_anchors"]
    assert anchor.shape == (8,) and (anchor > 0).any() and (anchor < 0).any()
    opposite = (inputs["advantages"] * anchor.unsqueeze(1) < 0) & inputs["completion_mask"].bool()
    assert opposite.any(), "no token against its sequence's sign: per token = per sequence, the check is vacuous"
    masks = [result for kind, _, result in decisions if kind == "mask"]
    assert len(masks) == 1 and masks[0].shape == (8, 1)
    assert masks[0].squeeze(1).tolist() == (anchor >= 0).float().tolist()
    for kind, advantages, result in decisions:
        assert advantages.shape == (8, 1) and torch.equal(advantages.squeeze(1), anchor.to(advantages.dtype))
        if kind == "gamma":
            assert result.shape == (8, 1)
    assert (loss_type == "vespo") == any(kind == "gamma" for kind, _, _ in decisions)


def test_per_sequence_decisions_keep_trl_static_signatures(tiny_model_path, tiny_dataset, tmp_path):
    # TRL declares both as @staticmethod and calls them with keywords (GRPOTrainer._compute_loss); code that calls
    # them on the class (as TRL's own static API allows) got a TypeError from OPPO's instance methods.
    import inspect

    from trl import GRPOTrainer

    from trl_credit.core.anchors import loss_sequence_anchors

    for name in ("get_off_policy_mask", "get_gamma_weights"):
        assert isinstance(inspect.getattr_static(OPPOTrainer, name), staticmethod)
        assert inspect.signature(getattr(OPPOTrainer, name)) == inspect.signature(getattr(GRPOTrainer, name))
    trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward,
                          args=make_args(tmp_path, max_steps=1), train_dataset=tiny_dataset)
    torch.manual_seed(0)
    B, T = 4, 5
    mask = torch.ones(B, T)
    logps = -torch.rand(B, T)
    sampled = logps + 0.5 + 0.5 * torch.rand(B, T)  # mean KL log(π_old/π_θ) > 0.5 on every row
    ratio = 0.3 * torch.randn(B, T)
    anchors = torch.tensor([1.0, -1.0, 0.0, -1.0])  # sign(A^seq)
    # OPPO's (B, T) advantages after the group normalization: tokens of one completion take both signs
    tokens = torch.tensor([[0.5, -0.2, 0.1, -0.9, 0.3]] * B) * torch.tensor([[1.0], [-1.0], [1.0], [1.0]])

    def mask_call(owner, advantages):
        return owner.get_off_policy_mask(advantages=advantages, per_token_logps=logps, sampling_per_token_logps=sampled,
                                         mask=mask, off_policy_threshold=0.1)

    def gamma_call(owner, advantages):
        return owner.get_gamma_weights(advantages=advantages, log_ratio_per_token=ratio, mask=mask,
                                       importance_sampling_ratio=None, k_pos=2.0, lambda_pos=3.0, k_neg=3.0,
                                       lambda_neg=2.0)

    expected_mask = mask_call(GRPOTrainer, anchors.unsqueeze(1))
    expected_gamma = gamma_call(GRPOTrainer, anchors.unsqueeze(1))
    assert expected_mask.squeeze(1).tolist() == [1.0, 0.0, 1.0, 0.0]  # high KL: kept iff A >= 0
    assert not torch.equal(gamma_call(GRPOTrainer, -anchors.unsqueeze(1)), expected_gamma)  # the sign matters
    for owner in (OPPOTrainer, trainer):
        # sequence-level advantages (B, 1): TRL's results
        assert torch.equal(mask_call(owner, anchors.unsqueeze(1)), expected_mask)
        assert torch.equal(gamma_call(owner, anchors.unsqueeze(1)), expected_gamma)
        # in OPPO's loss, (B, T) advantages are decided per sequence by their anchors, not per token
        with loss_sequence_anchors(anchors):
            assert torch.equal(mask_call(owner, tokens), expected_mask)
            assert torch.equal(gamma_call(owner, tokens), expected_gamma)
        # outside a loss that sets anchors, (B, T) advantages get TRL's own (per-token) decision
        assert torch.equal(mask_call(owner, tokens), mask_call(GRPOTrainer, tokens))
    # OPPO's (B, T) advantages cannot reach TRL's loss without their anchors (the per-sequence decisions would be
    # per token): the core says so for a credit that sets anchors, not guessed, before TRL's loss runs
    with pytest.raises(RuntimeError, match=r"OPPOTrainer: per-token advantages .* without .*`sequence_anchors`"):
        trainer._compute_loss(trainer.model, {"advantages": tokens, "completion_mask": mask})



# ------------------------------------------------------------------------------------------- normalize_then_sum
def parity_alternating_row(text, index):
    return [float(len(text) % 2), float(index % 2)]


def test_normalize_then_sum_trains_with_the_verifier_k(tiny_model_path, tiny_dataset, tmp_path, monkeypatch):
    # TRL z-scores each reward function per group, sums, and divides by the batch std: the sum has zero mean in
    # every group, so sign(A^seq) (the sum of z-scores) ranks a completion within its group; k comes from the verifier.
    monkeypatch.setattr(CapturingOPPOTrainer, "reward_row", staticmethod(parity_alternating_row))
    args = make_args(tmp_path, multi_objective_aggregation="normalize_then_sum")
    trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=[length_parity_reward, alternating_reward],
                                   args=args, train_dataset=tiny_dataset)
    trainer.train()
    assert trainer.state.global_step == 2
    _assert_matches_reference(trainer)
    assert any((output["sequence_anchors"] > 0).any() and (output["sequence_anchors"] < 0).any()
               for output, _ in trainer.generations)


# ------------------------------------------------------------------------------------------- precision (bf16)
@pytest.fixture(scope="module")
def peaked_model_path(tiny_model_path, tmp_path_factory):
    """The tiny model with its LM head scaled by 30: logits of a real model's size (|logit| up to ~20, where bf16
    rounds by ~0.1), and evidence |o_t - s_t| ~ 0.5 like SmolLM2's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(tmp_path_factory.mktemp("tiny_peaked"))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(path)
    return path


TRL_OLD_LOGPS = dict(plain_logps="auto", per_device_train_batch_size=4, steps_per_generation=2)


@pytest.mark.trl_smoke
@pytest.mark.parametrize("settings", [dict(plain_logps="auto"), dict(plain_logps="recompute"), TRL_OLD_LOGPS,
                                      dict(TRL_OLD_LOGPS, cast_lm_head_to_fp32=True)],
                         ids=["generation-record", "extra-pass", "trl-old-logps", "trl-old-logps-float32-head"])
def test_evidence_under_bf16_autocast_is_float32_accurate(peaked_model_path, tiny_dataset, tmp_path, monkeypatch,
                                                          settings):
    # TRL's default bf16=True runs every forward under bf16 autocast (CPU autocast here). Before, the LM head's
    # logits were bf16 in the extra pass (o_t) and in the generation record / TRL's old log-probs (s_t): max error of
    # log λ against a float64 copy of the same weights 0.053-0.056 (mean 0.015; mean |log λ| 0.14). Now both come
    # from a float32 head (the transformer body stays bf16): max 0.0075 (mean 0.0018).
    from transformers import AutoModelForCausalLM

    import trl_credit.oppo.parts as oppo_parts

    batches = []
    original = oppo_parts.bayesian_value_recursion

    def spy(oracle_logps, student_logps, mask, *args, **kwargs):
        batches.append((oracle_logps.clone(), student_logps.clone(), mask.clone()))
        return original(oracle_logps, student_logps, mask, *args, **kwargs)

    monkeypatch.setattr(oppo_parts, "bayesian_value_recursion", spy)
    outputs = []
    original_advantages = ValueRecursion.token_advantages

    def record(self, trainer, batch, inputs, output):
        outputs.append((inputs, {k: v.clone() for k, v in output.items() if torch.is_tensor(v)}))
        return original_advantages(self, trainer, batch, inputs, output)

    monkeypatch.setattr(ValueRecursion, "token_advantages", record)
    args = make_args(tmp_path, **{**dict(max_steps=1, max_completion_length=12, bf16=True), **settings})
    trainer = OPPOTrainer(model=peaked_model_path, reward_funcs=length_parity_reward, args=args,
                          train_dataset=tiny_dataset)
    trainer.train()  # one optimizer step, after the only generation batch: the weights scored are the saved ones
    assert trainer.accelerator.mixed_precision == "bf16"
    reference = AutoModelForCausalLM.from_pretrained(peaked_model_path, dtype=torch.float64).eval()
    (inputs, output), = outputs
    (oracle_logps, plain_logps, mask), = batches
    errors, sizes = [], []
    for i in range(len(inputs)):
        prompt_ids = output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist()
        completion = output["completion_ids"][i][mask[i].bool()].tolist()
        messages = [dict(m) for m in inputs[i]["prompt"]]
        messages[-1]["content"] += f"\n\nThe correct final answer is {inputs[i]['answer']}."
        oracle_ids = trainer._tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        oracle_ids = oracle_ids["input_ids"] if hasattr(oracle_ids, "keys") else oracle_ids
        o, s = _row_logps(reference, oracle_ids, completion), _row_logps(reference, prompt_ids, completion)
        n = len(completion)
        log_lambda = (oracle_logps[i, :n] - plain_logps[i, :n]).double()
        errors += (log_lambda - torch.tensor(o) + torch.tensor(s)).abs().tolist()
        sizes += [abs(a - b) for a, b in zip(o, s)]
    print(f"{settings}: mean |log λ| {sum(sizes) / len(sizes):.3f}, error of log λ: max {max(errors):.4f}, "
          f"mean {sum(errors) / len(errors):.4f}")
    assert sum(sizes) / len(sizes) > 0.1  # evidence of a real size (SmolLM2: 0.15): the check is not vacuous
    assert max(errors) < 0.02
    # the cost stays: "auto" still scores only the B oracle rows (s_t from the float32-head generation record)
    log = next(log for log in trainer.state.log_history if "oppo/extra_pass_rows" in log)
    assert log["oppo/extra_pass_rows"] == (2.0 if settings["plain_logps"] == "recompute" else 1.0)


# ------------------------------------------------------------------------------------------- ties and round-off
TIED = [0.7, 1.0, 0.4, 0.7]  # rows 0 and 3 sit exactly at the group mean 0.7; TRL's float32 mean is 0.70000005


def tied_reward(completions, **kwargs):
    return [TIED[i % 4] for i in range(len(completions))]


def test_rows_at_the_group_mean_get_no_direction_despite_round_off(tiny_model_path, tiny_dataset, tmp_path):
    # Eq. 21's anchor sign(A^seq) of a row that ties the group mean is 0, so its Â_t is 0 and its normalized tokens are
    # (0 - mean_g)/std_g. TRL's float32 advantage of rows 0 and 3 is -2.4e-7: before, their sign was -1 and they got
    # full-size negative credit (Â_t = -|A_t^raw|), as large as the truly worse row 2's.
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(CapturingOPPOTrainer, "reward_row", staticmethod(lambda text, i: [TIED[i % 4]]))
    try:
        trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=tied_reward,
                                       args=make_args(tmp_path, max_steps=1), train_dataset=tiny_dataset)
        trainer.train()
    finally:
        monkeypatch.undo()
    _assert_matches_reference(trainer)
    (output, expected), = trainer.generations
    assert output["sequence_anchors"].tolist() == [0.0, 1.0, -1.0, 0.0] * 2
    for i in (0, 3, 4, 7):  # the tied rows: Â_t = 0, so one value on every token, (0 - mean_g)/std_g
        n = int(output["completion_mask"][i].sum())
        assert len(set(output["advantages"][i, :n].tolist())) == 1
        assert expected[i] == pytest.approx([expected[i][0]] * n)


def verifier_none_row(text, index):
    return [[1.0, 0.0, None, 0.0][index % 4], 1.0]


def verifier_with_a_none(completions, **kwargs):
    return [[1.0, 0.0, None, 0.0][i % 4] for i in range(len(completions))]


def format_always(completions, **kwargs):
    return [1.0] * len(completions)


def test_normalize_then_sum_row_without_a_verifier_score_is_not_correct(tiny_model_path, tiny_dataset, tmp_path):
    # docs/design.md: a row whose verifier returned None while another function scored it is "not correct". With
    # normalize_then_sum TRL's nansum of z-scores put it at the group's mean verifier score (A^seq = round-off, e.g.
    # +3.7e-8), so it got the correct rows' positive sign. Not correct = verifier reward 0, as TRL's sum counts it
    # under sum_then_normalize: z = [+1.5, -0.5, -0.5, -0.5] / (std + 1e-4), so row 2 ranks with the incorrect rows.
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(CapturingOPPOTrainer, "reward_row", staticmethod(verifier_none_row))
    try:
        args = make_args(tmp_path, max_steps=1, multi_objective_aggregation="normalize_then_sum")
        trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=[verifier_with_a_none, format_always],
                                       args=args, train_dataset=tiny_dataset)
        trainer.train()
    finally:
        monkeypatch.undo()
    _assert_matches_reference(trainer)
    (output, _), = trainer.generations
    assert output["sequence_anchors"].tolist() == [1.0, -1.0, -1.0, -1.0] * 2


# ------------------------------------------------------------------------------------------- drop-in (TRL's GRPO configs)
from tests.trainers.dropin_configs import DROPIN_CONFIGS, DROPIN_EVAL_CONFIGS  # noqa: E402


@pytest.mark.parametrize("overrides", DROPIN_CONFIGS)
def test_dropin_trains_with_trl_grpo_test_configurations(tiny_model_path, tiny_dataset, tmp_path, overrides):
    settings = dict(max_steps=1, per_device_train_batch_size=4, num_generations=4, max_completion_length=4)
    settings.update(overrides)
    trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=[length_parity_reward, alternating_reward],
                          args=make_args(tmp_path, **settings), train_dataset=tiny_dataset)
    trainer.train()
    assert trainer.state.global_step == 1
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])


@pytest.mark.parametrize("overrides", DROPIN_EVAL_CONFIGS)
def test_dropin_evaluates_with_trl_grpo_test_configurations(tiny_model_path, tiny_dataset, tmp_path, overrides):
    settings = dict(max_steps=2, per_device_train_batch_size=4, per_device_eval_batch_size=4, num_generations=4,
                    max_completion_length=4, eval_strategy="steps", eval_steps=2)
    settings.update(overrides)
    trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=make_args(tmp_path, **settings),
                          train_dataset=tiny_dataset, eval_dataset=tiny_dataset.select(range(4)))
    trainer.train()
    assert any("eval_loss" in log for log in trainer.state.log_history)


def test_plain_logps_record_that_does_not_line_up_falls_back_to_scoring_with_a_warning(
    tiny_model_path, tiny_dataset, tmp_path, scored_rows, monkeypatch
):
    from trl_credit.generation.hooks import GenerationRecorder

    monkeypatch.setattr(GenerationRecorder, "logps", lambda self, completion_ids: None)
    trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward,
                          args=make_args(tmp_path, max_steps=1, max_completion_length=4), train_dataset=tiny_dataset)
    with pytest.warns(UserWarning, match="extra pass also scores the B plain rows"):
        trainer.train()
    assert scored_rows == [16]
    log = next(log for log in trainer.state.log_history if "oppo/extra_pass_rows" in log)
    assert log["oppo/extra_pass_rows"] == 2.0


def test_generation_recorder_logps_and_entropies_by_hand():
    # Two rows, vocabulary 3, temperature 2. Step 0 (prefill) logits -> distribution d0; step 1's input is the
    # token sampled from d0; row 1 ended with EOS (id 2) after one token, row 0 generated two tokens.
    from types import SimpleNamespace

    from trl_credit.generation.hooks import GenerationRecorder

    recorder = GenerationRecorder(temperature=2.0, logps=True, entropies=True)
    logits0 = torch.tensor([[[0.0, 2.0, 4.0]], [[4.0, 0.0, 2.0]]])
    logits1 = torch.tensor([[[2.0, 2.0, 0.0]], [[0.0, 0.0, 0.0]]])
    recorder(None, (), {"input_ids": torch.tensor([[5, 6], [7, 8]])}, SimpleNamespace(logits=logits0))
    recorder(None, (), {"input_ids": torch.tensor([[1], [2]])}, SimpleNamespace(logits=logits1))

    def log_softmax(values):
        total = math.log(sum(math.exp(v) for v in values))
        return [v - total for v in values]

    d0 = [log_softmax([0.0, 1.0, 2.0]), log_softmax([2.0, 0.0, 1.0])]  # logits / T
    d1 = log_softmax([1.0, 1.0, 0.0])
    rows = recorder.logps([[1, 0], [2]])
    assert rows[0] == pytest.approx([d0[0][1], d1[0]], abs=1e-6)
    assert rows[1] == pytest.approx([d0[1][2]], abs=1e-6)
    assert recorder.logps([[1, 0, 1], [2]]) is None  # three tokens but two steps recorded: does not line up

    def entropy(logps):
        return -sum(math.exp(v) * v for v in logps)

    # entropy of the distribution each token was drawn from (the same temperature-scaled distributions)
    entropies = recorder.entropies([[1, 0], [2]])
    assert entropies[0] == pytest.approx([entropy(d0[0]), entropy(d1)], abs=1e-6)
    assert entropies[1] == pytest.approx([entropy(d0[1])], abs=1e-6)
    assert recorder.entropies([[1, 0, 1], [2]]) is None
