"""OPPOTrainer end to end on the CPU with the tiny model: self and teacher oracle, every TRL loss type, LoRA, KL,
plain-text prompts, refusals, and the advantages reaching the loss against an independent reference (SPEC §2)."""

import math
import shutil

import pytest
import torch
from datasets import Dataset

import trl_credit._trl as shared
from tests.tiny import build_tiny_model
from trl_credit import OPPOConfig, OPPOTrainer


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


def reference_advantages(scorer, tokenizer, inputs, output, G, C=3.0, alpha=1.0, eps=1e-6):
    """SPEC §2.1–2.7 with Python floats, one row and one token at a time; nothing from trl_credit.oppo."""
    B = len(inputs)
    contexts, completions, rewards = [], [], []
    for i in range(B):
        prompt_ids = output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist()
        completion = output["completion_ids"][i][output["completion_mask"][i].bool()].tolist()
        messages = [dict(m) for m in inputs[i]["prompt"]]
        messages[-1]["content"] += f"\n\nThe correct final answer is {inputs[i]['answer']}."
        oracle_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        oracle_ids = oracle_ids["input_ids"] if hasattr(oracle_ids, "keys") else oracle_ids
        contexts.append((list(oracle_ids), prompt_ids))
        completions.append(completion)
        rewards.append(float(len(tokenizer.decode(completion, skip_special_tokens=True)) % 2))
    raw_rows = []
    for i in range(B):
        group = range((i // G) * G, (i // G + 1) * G)
        k = sum(1 for j in group if rewards[j] >= 1.0)
        mean_r = sum(rewards[j] for j in group) / G
        sign = 0.0 if all(rewards[j] == rewards[group[0]] for j in group) else math.copysign(1.0, rewards[i] - mean_r)
        o = _row_logps(scorer, contexts[i][0], completions[i])
        s = _row_logps(scorer, contexts[i][1], completions[i])
        ell = math.log((k + alpha) / (G - k + alpha))
        row = []
        for t in range(len(completions[i])):
            log_lambda = max(-C, min(C, o[t] - s[t]))
            a = 1 / (1 + math.exp(-(ell + log_lambda))) - 1 / (1 + math.exp(-ell))
            row.append(sign * abs(a))
            ell += log_lambda
        raw_rows.append(row)
    normalized = []
    for i in range(B):
        tokens = [x for j in range((i // G) * G, (i // G + 1) * G) for x in raw_rows[j]]
        mean = sum(tokens) / len(tokens)
        std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / len(tokens))
        normalized.append([(x - mean) / (std + eps) for x in raw_rows[i]])
    return normalized


class CapturingOPPOTrainer(OPPOTrainer):
    """Records each generation batch (with the reference computed before any optimizer step) and each loss input."""

    reference_scorer = None
    compute_reference = True

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if not self.compute_reference:
            return output
        scorer = self.reference_scorer or self.accelerator.unwrap_model(self.model)
        expected = reference_advantages(scorer, self._tokenizer, inputs, output, self.num_generations)
        self.generations = getattr(self, "generations", []) + [(output, expected)]
        return output

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
    original = shared.score_completions

    def recording(trainer, model, prompt_ids, *args, **kwargs):
        calls.append(prompt_ids.size(0))
        return original(trainer, model, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(shared, "score_completions", recording)
    return calls


# ------------------------------------------------------------------------------------------- training runs
def test_self_oracle_trains_and_advantages_match_reference(tiny_model_path, tiny_dataset, tmp_path, scored_rows):
    trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=make_args(tmp_path), train_dataset=tiny_dataset)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
    _assert_matches_reference(trainer)
    # Self mode without TRL old log-probs: one scoring call per generation batch, oracle + plain rows stacked.
    assert scored_rows == [16, 16]
    logs = [log for log in trainer.state.log_history if "oppo/value_mean" in log]
    assert len(logs) == 2
    for log in logs:
        assert 0.0 < log["oppo/value_mean"] < 1.0
        assert 0.0 <= log["oppo/evidence_clip_rate"] <= 1.0
        assert log["oppo/advantage_abs_mean"] > 0.0
        assert 0.0 < log["oppo/prior_value_mean"] < 1.0


def test_self_oracle_reuses_trl_old_logps(tiny_model_path, tiny_dataset, tmp_path, scored_rows):
    # steps_per_generation=2 with no accumulation: TRL computes old_per_token_logps, which are s_t.
    args = make_args(tmp_path, per_device_train_batch_size=4, steps_per_generation=2)
    trainer = CapturingOPPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=args, train_dataset=tiny_dataset)
    trainer.train()
    assert scored_rows == [8]  # one generation batch of 8 rows, only the oracle rows scored
    assert "old_per_token_logps" in trainer.generations[0][0]
    _assert_matches_reference(trainer)


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
    import trl_credit.oppo.trainer as oppo_trainer

    seen = []
    original = oppo_trainer.bayesian_value_recursion

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(oppo_trainer, "bayesian_value_recursion", spy)
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
        ("multi_objective_aggregation", "normalize_then_sum", "multi_objective_aggregation"),
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
