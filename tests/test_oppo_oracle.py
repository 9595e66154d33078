"""OPPO's oracle prompts (docs/oppo.md#oracle-prompt) and the alignment of the batched scoring pass with plain transformers."""

import copy

import pytest
import torch
from datasets import Dataset

from trl_credit import OPPOConfig, OPPOTrainer
from trl_credit.core.context import BatchContext
from trl_credit.oppo.oracle import DEFAULT_ORACLE_TEMPLATE, build_oracle_prompt, build_oracle_prompts, score_evidence


def test_default_template_is_the_spec_sentence():
    assert DEFAULT_ORACLE_TEMPLATE == "\n\nThe correct final answer is {answer}."


def test_chat_prompt_gets_answer_in_last_user_message_only():
    prompt = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "And 3 + 4?"},
        {"role": "assistant", "content": "Let me think."},  # a prefill after the last user turn stays as it is
    ]
    original = copy.deepcopy(prompt)
    oracle = build_oracle_prompt(prompt, "7")
    assert prompt == original  # not mutated
    assert oracle[3]["content"] == "And 3 + 4?\n\nThe correct final answer is 7."
    assert [m["content"] for i, m in enumerate(oracle) if i != 3] == [m["content"] for i, m in enumerate(prompt) if i != 3]


def test_plain_text_and_content_parts_and_custom_template():
    assert build_oracle_prompt("Q: 3 + 4 =", 7) == "Q: 3 + 4 =\n\nThe correct final answer is 7."
    parts = [{"role": "user", "content": [{"type": "text", "text": "Q"}]}]
    assert build_oracle_prompt(parts, "7")[0]["content"][-1] == {"type": "text", "text": "\n\nThe correct final answer is 7."}
    assert build_oracle_prompts(["a", "b"], [1, 2], " [ans={answer}]") == ["a [ans=1]", "b [ans=2]"]


def test_chat_prompt_without_user_message_is_refused():
    with pytest.raises(ValueError, match="no 'user' message"):
        build_oracle_prompt([{"role": "system", "content": "x"}], "1")


def _reference_logps(model, context_ids, completion, temperature=1.0):
    """log π(y_t | context, y_<t), one token at a time, full forward on the unpadded prefix (plain transformers)."""
    out = []
    with torch.no_grad():
        for t in range(len(completion)):
            ids = torch.tensor([list(context_ids) + list(completion[:t])])
            logits = model(input_ids=ids).logits[0, -1].double() / temperature
            out.append(torch.log_softmax(logits, dim=-1)[completion[t]].item())
    return out


@pytest.mark.parametrize("conversational", [True, False])
def test_oracle_logps_align_with_token_by_token_reference(tiny_model_path, tiny_tokenizer, tiny_dataset, tmp_path, conversational):
    from transformers import AutoModelForCausalLM

    rows = tiny_dataset.select(range(3))
    if conversational:
        dataset = rows
    else:  # plain-text prompts: the question text itself
        dataset = Dataset.from_dict({"prompt": [p[0]["content"] for p in rows["prompt"]], "answer": rows["answer"]})
    args = OPPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=6,
                      report_to="none", use_cpu=True, save_strategy="no", temperature=0.7, bf16=False)
    trainer = OPPOTrainer(model=tiny_model_path, reward_funcs=lambda completions, **k: [0.0] * len(completions),
                          args=args, train_dataset=dataset)
    prompts, answers = list(dataset["prompt"]), list(dataset["answer"])
    oracle_ids, _, _ = trainer._tokenize_prompts(build_oracle_prompts(prompts, answers))
    plain_ids, _, _ = trainer._tokenize_prompts(prompts)

    # The oracle prompt is the plain prompt with the answer sentence in it.
    for ids, answer in zip(oracle_ids, answers):
        assert f"The correct final answer is {answer}." in tiny_tokenizer.decode(ids)
    if conversational:  # independently rendered with the chat template
        expected = tiny_tokenizer.apply_chat_template(
            [[{"role": "user", "content": p[0]["content"] + f"\n\nThe correct final answer is {a}."}] for p, a in zip(prompts, answers)],
            add_generation_prompt=True, tokenize=True,
        )
        expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
        assert [list(x) for x in oracle_ids] == [list(x) for x in expected]
        assert tiny_tokenizer.decode(oracle_ids[0]).endswith("<|im_start|>assistant\n")

    # Completions of different lengths, right-padded; prompts left-padded, as TRL lays them out.
    completions = [[5, 17, 30, 2], [44, 9], [100, 101, 102, 103, 104]]
    pad_id = tiny_tokenizer.pad_token_id
    T = max(map(len, completions))
    completion_ids = torch.tensor([c + [pad_id] * (T - len(c)) for c in completions])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (T - len(c)) for c in completions])
    P = max(map(len, plain_ids))
    prompt_ids = torch.tensor([[pad_id] * (P - len(p)) + list(p) for p in plain_ids])
    prompt_mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in plain_ids])

    ctx = BatchContext.for_trainer(trainer)  # what the credit gets at batch time
    oracle_logps, student_logps = score_evidence(
        ctx, trainer.model, oracle_ids, prompt_ids, prompt_mask, completion_ids, completion_mask, batch_size=2
    )
    reference_model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    for i, completion in enumerate(completions):
        n = len(completion)
        expected_o = _reference_logps(reference_model, oracle_ids[i], completion, temperature=0.7)
        expected_s = _reference_logps(reference_model, plain_ids[i], completion, temperature=0.7)
        assert oracle_logps[i, :n].tolist() == pytest.approx(expected_o, abs=1e-4)
        assert student_logps[i, :n].tolist() == pytest.approx(expected_s, abs=1e-4)
        assert oracle_logps[i, :n].tolist() != pytest.approx(expected_s, abs=1e-4)  # the answer changes the scores

    # Reusing given student log-probs scores only the oracle rows, with the same result.
    given = torch.full_like(student_logps, -1.0)
    o2, s2 = score_evidence(ctx, trainer.model, oracle_ids, prompt_ids, prompt_mask, completion_ids, completion_mask, student_logps=given)
    assert s2 is given
    torch.testing.assert_close(o2 * completion_mask, oracle_logps * completion_mask, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_smollm2_oracle_context_raises_the_correct_answer(tmp_path):
    """With a real model, the answer in the oracle prompt makes the answer token of a completion more likely
    (log λ > 0 there) and leaves the evidence of the other tokens near 0 on average."""
    from trl_credit.models import default_model_path

    path = default_model_path()
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "What is 38 + 45? Put the final answer in \\boxed{}."}]],
                                 "answer": ["83"]})
    args = OPPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, report_to="none",
                      use_cpu=True, bf16=False, save_strategy="no")
    trainer = OPPOTrainer(model=path, reward_funcs=lambda completions, **k: [0.0] * len(completions), args=args, train_dataset=dataset)
    tokenizer = trainer._tokenizer
    prompt = dataset["prompt"][0]
    plain_ids, _, _ = trainer._tokenize_prompts([prompt])
    oracle_ids, _, _ = trainer._tokenize_prompts(build_oracle_prompts([prompt], ["83"]))
    completion = tokenizer("We add the numbers: 38 + 45 = 83. The answer is \\boxed{83}.", add_special_tokens=False)["input_ids"]
    completion_ids = torch.tensor([completion])
    mask = torch.ones_like(completion_ids)
    o, s = score_evidence(trainer, trainer.model, oracle_ids, torch.tensor(plain_ids), torch.ones(1, len(plain_ids[0]), dtype=torch.long),
                          completion_ids, mask)
    log_lambda = (o - s)[0]
    # The first token of the first "83" (right after "= ") is where the answer is decided.
    pieces = [tokenizer.decode(completion[: t + 1]) for t in range(len(completion))]
    first_answer = next(t for t, text in enumerate(pieces) if text.endswith("= 8") or text.endswith("= 83"))
    assert log_lambda[first_answer].item() > 0.5
