"""credit="implicit_prm" in training (PRIME; docs/process.md, "Implicit process rewards"). The advantages
reaching TRL's loss equal a reference computed here: the implicit PRM's first update redone by hand on a fresh copy
of the initial policy (the cross-entropy written out, AdamW, the gradient clipped at prime_grad_clip), then the paper's advantage with plain
loops (tests/test_prime.py's reference). The PRM's weights (a LoRA adapter on the policy, a model copy otherwise), the
PRM never touching the policy's gradients, gradient accumulation with several iterations per batch, and two processes.
"""

from __future__ import annotations

import math

import pytest
import torch

from trl_credit import CreditConfig
from trl_credit.core.trainer import CreditTrainer
from trl_credit.prime.parts import ImplicitPRMCredit
from trl_credit.prime.prm import ADAPTER
from trl_credit.tasks.rewards import completion_text
from tests.test_prime import reference_advantages
from tests.tiny import recorded


def accuracy_reward(completions, **kwargs):
    # The verifier (first reward function): correct when the text length is odd; a multiple of 7: unscorable.
    return [None if len(completion_text(c)) % 7 == 0 else float(len(completion_text(c)) % 2) for c in completions]


def format_reward(completions, **kwargs):
    return [None if len(completion_text(c)) % 7 == 0 else float("the" in completion_text(c)) for c in completions]


def tiny_args(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path), credit="implicit_prm", per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=10, max_steps=1, learning_rate=1e-2, prime_learning_rate=1e-2,
                  report_to="none", use_cpu=True, save_strategy="no", logging_steps=1, seed=0,
                  # every group trains in the tests of the advantage's machinery (the tiny model truncates most rows
                  # and its verdicts are arbitrary); the prompt filter's own tests turn it on
                  prime_prompt_filter=False)
    values.update(overrides)
    return CreditConfig(**values)


def logps_of(model, batch):
    """log pi(y_t | x, y_<t) of every completion token, one plain forward over the batch."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, batch["prompt_ids"].size(1) - 1:-1]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, batch["completion_ids"][..., None])[..., 0]


def forward_counter(module):
    """A list that grows by one at each forward of ``module``."""
    calls = []
    module.register_forward_hook(lambda *args: calls.append(1))
    return calls


@pytest.mark.parametrize("trl_beta", [0.0, 0.04], ids=["no_kl", "kl"])
def test_one_step_equals_a_hand_made_prm_update_and_the_papers_advantage(tiny_model_path, tiny_dataset, tmp_path,
                                                                         trl_beta):
    """With TRL's beta > 0 TRL scores the rows with its reference model, the PRM's reference too (full weights): PRIME
    reuses those log-probs, so the reference runs one forward per batch (8 rows, one chunk), not two."""
    from transformers import AutoModelForCausalLM

    beta, lr = 0.05, 1e-2
    # float32 (TRL turns bf16 on by default, on the CPU too): the reference below runs without autocast, and Adam's
    # first step, lr * g / (|g| + eps), turns bf16's rounding of small gradients into whole steps.
    trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward],
                            args=tiny_args(tmp_path, bf16=False, prime_grad_clip=0.05, beta=trl_beta),
                            train_dataset=tiny_dataset)
    assert isinstance(trainer.credit, ImplicitPRMCredit) and trainer._name == "groups x implicit_prm"
    reference_forwards = forward_counter(trainer.credit.prm.reference)
    if trl_beta:
        assert trainer.credit.prm.reference is trainer.ref_model
    policy_grads = []
    trainer.add_credit_callback(lambda step: policy_grads.append(
        [p.grad is None or not p.grad.any() for p in trainer.model.parameters()]))
    batches, losses = recorded(trainer)
    trainer.train()
    assert len(reference_forwards) == 1  # TRL's (kl) or PRIME's (no_kl): one reference forward of the batch
    assert policy_grads and all(all(flags) for flags in policy_grads)  # the PRM's update left the policy's alone
    batch = batches[0]
    mask = batch["completion_mask"].double()
    lengths = [int(n) for n in batch["completion_mask"].sum(dim=1)]
    texts = trainer.processing_class.batch_decode(
        [ids[:n] for ids, n in zip(batch["completion_ids"].tolist(), lengths)], skip_special_tokens=True)
    valid = [len(t) % 7 != 0 for t in texts]
    labels = torch.tensor([float(len(t) % 2) for t in texts], dtype=torch.float64)  # the verifier's verdicts
    outcomes = [float(len(t) % 2) + float("the" in t) for t in texts]  # TRL's total reward
    assert 0 < sum(labels[valid]) < sum(valid), "both verdicts among the rows, else the check would be weak"

    # The PRM's update by hand: pi_phi and pi_ref both start as the policy; L_CE = mean over the credited rows of
    # -[y log sigma(s) + (1 - y) log(1 - sigma(s))], s = beta * sum_t (log pi_phi - log pi_ref); AdamW; the gradient
    # clipped at norm 0.05 (prime_grad_clip, set below the gradient's norm so that the clip acts).
    prm = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    keep = torch.tensor(valid)
    rows = {k: v[keep] for k, v in batch.items() if torch.is_tensor(v) and v.dim() == 2 and k != "advantages"}
    with torch.no_grad():
        ref_logps = logps_of(ref, rows).double()
    s = beta * ((logps_of(prm, rows).double() - ref_logps) * rows["completion_mask"]).sum(dim=1)
    y = labels[keep]
    sig = torch.sigmoid(s)
    loss = -(y * torch.log(sig) + (1 - y) * torch.log(1 - sig)).mean()
    assert float(loss.detach()) == pytest.approx(math.log(2))  # s = 0 before the first step: ln 2
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(list(prm.parameters()), 0.05)
    # the clip acts here (Adam's first step hardly depends on the gradient's scale, so this step alone would not
    # tell another clip apart: test_the_prms_gradient_is_clipped_at_prime_grad_clip does)
    assert norm > 0.05
    torch.optim.AdamW(prm.parameters(), lr=lr, weight_decay=0.0).step()
    with torch.no_grad():
        prm_logps = logps_of(prm, batch).double()
        ref_all = logps_of(ref, batch).double()
    scores = (beta * (prm_logps - ref_all) * mask).sum(dim=1)

    expected = reference_advantages(
        prm_logps.tolist(), ref_all.tolist(), lengths, [i // 4 for i in range(8)], valid, outcomes, beta, 1.0,
        norm=True, whiten=True, process_coef=1.0, outcome_coef=1.0)
    got = batch["advantages"]
    for i in range(8):
        assert got[i, :lengths[i]].tolist() == pytest.approx(expected[i], abs=2e-4), i
        assert got[i, lengths[i]:].abs().sum() == 0
    assert max(abs(a) for row in expected for a in row) > 0.5
    # the process part is not flat: tokens of one row differ (a pure outcome advantage would be constant per row)
    assert any(max(row) - min(row) > 1e-3 for row, v in zip(expected, valid) if v and len(row) > 1)
    # TRL's loss gets these advantages (its micro-batches: the same rows)
    seen = {tuple(ids.tolist()): adv for micro in losses for ids, adv in zip(micro["completion_ids"],
                                                                               micro["advantages"])}
    for ids, adv in zip(batch["completion_ids"], got):
        torch.testing.assert_close(seen[tuple(ids.tolist())], adv)

    log = next(entry for entry in trainer.state.log_history if "prime/prm_loss" in entry)
    assert log["prime/prm_loss"] == pytest.approx(math.log(2))  # the PRM as it met the batch: r_phi = 0
    if not trl_beta:  # with TRL's reference log-probs r_phi(y) is their rounding against PRIME's forward, not 0
        assert log["prime/prm_accuracy"] == 0.5  # every r_phi(y) = 0: sigma = 1/2 predicts neither
    correct = [float(scores[i]) for i in range(8) if valid[i] and labels[i] == 1]
    wrong = [float(scores[i]) for i in range(8) if valid[i] and labels[i] == 0]
    assert log["prime/sequence_reward_correct"] == pytest.approx(sum(correct) / len(correct), abs=1e-5)
    assert log["prime/sequence_reward_wrong"] == pytest.approx(sum(wrong) / len(wrong), abs=1e-5)
    assert log["prime/sequence_reward_correct"] > log["prime/sequence_reward_wrong"]  # one step of CE separates them
    assert log["prime/credited_rate"] == pytest.approx(sum(valid) / 8)
    # TRL's per-sequence value (completions table, off-policy masking): each row's first token's advantage
    torch.testing.assert_close(batch["sequence_anchors"].double(), got[:, 0].double().cpu(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_lora_policy_gets_a_second_adapter_not_a_copy(tiny_model_path, tiny_dataset, tmp_path, loss_type):
    from peft import LoraConfig

    args = tiny_args(tmp_path, max_steps=2, loss_type=loss_type)
    trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=tiny_dataset,
                            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    prm = trainer.credit.prm
    assert prm.peft and prm.model is None and prm.reference is None  # no second model: an adapter on the policy
    policy = trainer.model
    assert set(policy.peft_config) == {"default", ADAPTER}
    named = dict(policy.named_parameters())
    base = {n: p.detach().clone() for n, p in named.items() if "lora_" not in n}
    start = {n: p.detach().clone() for n, p in named.items() if "lora_" in n}
    # The PRM adapter starts as the policy's (lora_B = 0: identity), and is not trained by the policy's optimizer.
    for name, value in start.items():
        if f".{ADAPTER}." in name:
            torch.testing.assert_close(value, start[name.replace(f".{ADAPTER}.", ".default.")])
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable and all(".default." in n for n in trainable)
    trainer.train()
    named = dict(trainer.accelerator.unwrap_model(trainer.model).named_parameters())
    assert all(torch.equal(named[n], value) for n, value in base.items())  # base weights frozen
    moved = {n for n, value in start.items() if not torch.equal(named[n], value)}
    assert any(f"lora_B.{ADAPTER}." in n for n in moved)  # the PRM learned
    assert any("lora_B.default." in n for n in moved)  # the policy learned
    assert {n for n, p in named.items() if p.requires_grad} == trainable  # requires_grad restored after each update
    assert policy.active_adapters == ["default"]
    logs = [entry for entry in trainer.state.log_history if "prime/prm_loss" in entry]
    assert len(logs) == 2 and logs[1]["prime/prm_loss"] != pytest.approx(math.log(2))
    assert all(math.isfinite(entry["loss"]) for entry in logs)


def test_gradient_accumulation_and_several_iterations(tiny_model_path, tiny_dataset, tmp_path):
    # 8-row generation batches split into 2 micro-batches of 4, each trained twice (num_iterations=2): a new batch
    # every 4 micro-steps, so 4 optimizer steps of the policy see 2 generation batches and 2 PRM updates.
    args = tiny_args(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2, num_iterations=2,
                     max_steps=4, prime_update="after")
    trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=tiny_dataset)
    batches, _ = recorded(trainer)
    trainer.train()
    assert len(batches) == 2
    steps = {int(state["step"]) for state in trainer.credit.prm.optimizer.state.values()}
    assert steps == {2}
    logs = [entry for entry in trainer.state.log_history if "prime/prm_loss" in entry]
    assert logs and all(math.isfinite(entry["prime/prm_loss"]) for entry in logs)
    # "after": the first batch is scored by the initial PRM (= the reference): no process signal, only the outcome,
    # so each row's advantage is constant over its tokens.
    first = batches[0]
    for advantages, mask in zip(first["advantages"], first["completion_mask"]):
        values = advantages[mask.bool()]
        assert torch.allclose(values, values[0].expand_as(values))


def test_a_plain_grpo_config_is_refused(tiny_model_path, tiny_dataset, tmp_path):
    from trl import GRPOConfig

    plain = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=8,
                       num_generations=4, max_completion_length=8)
    with pytest.raises(ValueError, match="CreditConfig"):
        CreditTrainer(tiny_model_path, [accuracy_reward], args=plain, train_dataset=tiny_dataset,
                      credit=ImplicitPRMCredit())


# ------------------------------------------------------------------------------------------- two processes
@pytest.mark.multiprocess
@pytest.mark.parametrize("weights", ["full", "lora"])
def test_two_processes_equal_one_process(tiny_model_path, tmp_path, weights):
    """One group of 8 rows spanning both processes (4 rows each) or all on one: the same rows get the same per-token
    advantages (row means, the largest return, the whitening moments and the PRM's gradients summed across
    processes), and the PRM's metrics are the same; with LoRA the PRM is an adapter of the DDP-wrapped policy."""
    import json
    import os

    from tests.mp import run_torchrun

    results = {}
    for nproc in (2, 1):
        out = str(tmp_path / str(nproc))
        os.makedirs(out)
        run_torchrun("tests/mp_scripts/prime_two_processes.py", tiny_model_path, out, weights, nproc=nproc,
                     timeout=600)
        reports = [json.load(open(os.path.join(out, f"result_{rank}.json"))) for rank in range(nproc)]
        assert all(r["logs"] == reports[0]["logs"] for r in reports)
        rows = {(step, row): (text, adv) for r in reports for step, row, text, adv in r["records"]}
        results[nproc] = rows, reports[0]["logs"]
    (rows_two, logs_two), (rows_one, logs_one) = results[2], results[1]
    assert len(rows_one) == 16 and rows_two.keys() == rows_one.keys()
    for key, (text, advantages) in rows_one.items():
        assert rows_two[key][0] == text
        assert rows_two[key][1] == pytest.approx(advantages, rel=1e-4, abs=1e-4), key
    assert any(max(a) - min(a) > 1e-3 for (step, _), (_, a) in rows_one.items() if step == 1)  # process signal
    assert len(logs_one) == 2
    for log_one, log_two in zip(logs_one, logs_two, strict=True):
        assert log_two == pytest.approx(log_one, rel=1e-4, abs=1e-6)


def test_cue_modifier_boosts_the_positive_tokens_of_correct_rows(tiny_model_path, tiny_dataset, tmp_path):
    """modifiers=["cue"] with uniform_boost: the same run (same seed, same generations, same PRM update) as the credit
    alone, except that each row of Cue-GRPO's positive set (correct, positive direction: its first token's
    advantage) has its positive tokens times tau = 1.25; every other value is unchanged."""
    runs = {}
    for name, extra in (("alone", {}), ("cue", {"modifiers": ["cue"], "cue_weighting": "uniform_boost",
                                               "cue_tau": 1.25})):
        trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward],
                                args=tiny_args(tmp_path / name, **extra), train_dataset=tiny_dataset)
        batches, _ = recorded(trainer)
        trainer.train()
        runs[name] = batches[0]
    alone, cue = runs["alone"], runs["cue"]
    assert torch.equal(alone["completion_ids"], cue["completion_ids"])
    lengths = cue["completion_mask"].sum(dim=1).tolist()
    boosted = 0
    for i in range(alone["advantages"].size(0)):
        a, b = alone["advantages"][i, :lengths[i]], cue["advantages"][i, :lengths[i]]
        changed = ~torch.isclose(a, b, rtol=1e-6, atol=1e-7)
        if changed.any():
            assert alone["advantages"][i, 0] > 0  # a row of positive direction
            ids = cue["completion_ids"][i, :lengths[i]]
            assert len(trainer.processing_class.decode(ids, skip_special_tokens=True)) % 2 == 1  # correct
            torch.testing.assert_close(b[changed], 1.25 * a[changed])
            assert (a[changed] > 0).all() and torch.equal(changed, a > 0)
            boosted += 1
    assert boosted >= 1


def test_evaluation_batches_are_scored_but_not_learned_from(tiny_model_path, tmp_path):
    from trl_credit.tasks.data import make_arithmetic_dataset

    data = make_arithmetic_dataset(num_train=8, num_test=4, seed=0)
    args = tiny_args(tmp_path, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
    trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=data["train"],
                            eval_dataset=data["test"])
    trainer.train()
    evaluation = next(log for log in trainer.state.log_history if "eval_loss" in log)
    assert "eval_prime/prm_loss" in evaluation and math.isfinite(evaluation["eval_loss"])
    assert {int(state["step"]) for state in trainer.credit.prm.optimizer.state.values()} == {1}  # the train batch


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_checkpoints_hold_the_prm_and_a_resumed_run_continues_it(tiny_model_path, tiny_dataset, tmp_path, lora):
    """The PRM is no part of the policy's optimizer (nor, without LoRA, of its weights): each checkpoint gets its
    parameters and AdamW state, and resuming restores them instead of restarting the PRM."""
    import os

    from peft import LoraConfig
    from transformers import TrainerCallback

    from trl_credit.prime.prm import CHECKPOINT_FILE

    peft = dict(peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])) if lora else {}
    args = tiny_args(tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    first = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=tiny_dataset,
                          **peft)
    first.train()
    saved = [p.detach().clone() for p in first.credit.prm.parameters]
    path = os.path.join(str(tmp_path), "checkpoint-2", CHECKPOINT_FILE)
    assert os.path.exists(path)

    args = tiny_args(tmp_path, max_steps=3, save_strategy="no")
    resumed = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=tiny_dataset,
                            **peft)
    at_start = {}

    class Peek(TrainerCallback):  # the PRM when the first resumed step begins
        def on_step_begin(self, args, state, control, **kwargs):
            at_start.setdefault("parameters", [p.detach().clone() for p in resumed.credit.prm.parameters])

    resumed.add_callback(Peek())
    resumed.train(resume_from_checkpoint=os.path.join(str(tmp_path), "checkpoint-2"))
    assert all(torch.equal(a, b) for a, b in zip(at_start["parameters"], saved))  # restored, not the initial policy
    steps = {int(state["step"]) for state in resumed.credit.prm.optimizer.state.values()}
    assert steps == {3}  # AdamW's 2 steps restored, then 1 more

    os.remove(path)
    again = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args, train_dataset=tiny_dataset,
                          **peft)
    with pytest.raises(ValueError, match=f"training resumes at step 2, but .*{CHECKPOINT_FILE} does not exist"):
        again.train(resume_from_checkpoint=os.path.join(str(tmp_path), "checkpoint-2"))


def test_a_row_alone_in_its_group_gets_zero_and_stays_out_of_the_whitening(tiny_model_path, tiny_dataset, tmp_path):
    """Rows 1-3 of the first group are unscorable (every reward function returns None), so row 0 is alone in its
    group: no leave-one-out baseline, advantage 0 on every token (docs/process.md). The whitening's moments come from
    the rows that have a baseline only (the second group), so over that group's trained tokens the advantages have
    mean 0 and unbiased variance v / (v + 1e-8) ~ 1 (verl's masked_whiten of exactly those tokens). Before the fix
    row 0 got (0 - mean) / std on every token and its zeros entered the moments of every other row."""
    def verifier(completions, **kwargs):
        return [None if i in (1, 2, 3) else float(len(completion_text(c)) % 2) for i, c in enumerate(completions)]

    def formatting(completions, **kwargs):
        return [None if i in (1, 2, 3) else float("the" in completion_text(c)) for i, c in enumerate(completions)]

    trainer = CreditTrainer(tiny_model_path, [verifier, formatting], args=tiny_args(tmp_path, bf16=False),
                            train_dataset=tiny_dataset)
    batches, _ = recorded(trainer)
    trainer.train()
    batch = batches[0]
    advantages, trained = batch["advantages"].double(), batch["completion_mask"].double()
    assert advantages[:4].abs().max() == 0  # row 0 alone, rows 1-3 unscorable: no credit
    values = advantages[4:][trained[4:].bool()]
    assert values.numel() > 2 and values.abs().max() > 0.1
    assert float(values.mean()) == pytest.approx(0.0, abs=1e-6)  # float32 advantages in TRL's batch
    assert float(values.var(unbiased=True)) == pytest.approx(1.0, abs=1e-6)


def test_the_prms_gradient_is_clipped_at_prime_grad_clip(tiny_model_path, tiny_dataset, tmp_path):
    """The gradient reaching the PRM's AdamW step has norm min(|g|, prime_grad_clip): unclipped with a clip far above
    it (1e6), exactly the clip (0.05) below it. The default is the released recipe's 10.0."""
    assert tiny_args(tmp_path).prime_grad_clip == 10.0
    norms = {}
    for clip in (1e6, 0.05):
        trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward],
                                args=tiny_args(tmp_path / str(clip), bf16=False, prime_grad_clip=clip),
                                train_dataset=tiny_dataset)
        prm = trainer.credit.prm

        def at_step(optimizer, args, kwargs, clip=clip, prm=prm):
            norms[clip] = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in prm.parameters])))

        prm.optimizer.register_step_pre_hook(at_step)
        trainer.train()
    assert norms[1e6] > 0.05  # the unclipped gradient: above the second run's clip
    assert norms[0.05] == pytest.approx(0.05, rel=1e-4)


# ------------------------------------------------------------------------------------------- the prompt filter
def verdicts_by_row(correct_rows, unscorable_rows=()):
    """A verifier and a format reward that judge a row by its index in the batch (one process: every row)."""
    def verifier(completions, **kwargs):
        return [None if i in unscorable_rows else float(i in correct_rows) for i in range(len(completions))]

    def formatting(completions, **kwargs):
        return [None if i in unscorable_rows else float("the" in completion_text(c))
                for i, c in enumerate(completions)]

    return [verifier, formatting]


def test_the_prompt_filter_drops_a_group_as_if_its_rows_were_unscorable(tiny_model_path, tiny_dataset, tmp_path):
    """Groups of 4: group 0 has 2 correct rows (accuracy 0.5, inside (0.2, 0.8): kept), group 1 all 4 (accuracy 1.0:
    dropped). The dropped rows get advantage 0 and no PRM label, so the kept group's advantages (the PRM trained on
    its 4 rows only, the batch's largest return and whitening over them) are those of a run without the filter
    where group 1's rows are unscorable; the share of groups dropped is 1/2, the credited rows 4 of 8."""
    runs = {}
    for name, correct, unscorable, on in (("filter", (0, 1, 4, 5, 6, 7), (), True),
                                          ("unscorable", (0, 1), (4, 5, 6, 7), False)):
        trainer = CreditTrainer(tiny_model_path, verdicts_by_row(correct, unscorable),
                                args=tiny_args(tmp_path / name, bf16=False, prime_prompt_filter=on,
                                               prime_filter_truncated=False), train_dataset=tiny_dataset)
        batches, _ = recorded(trainer)
        trainer.train()
        runs[name] = batches[0], next(e for e in trainer.state.log_history if "prime/prm_loss" in e), trainer
    (filtered, log, trainer), (reference, _, _) = runs["filter"], runs["unscorable"]
    assert torch.equal(filtered["completion_ids"], reference["completion_ids"])
    assert filtered["advantages"][4:].abs().max() == 0
    assert filtered["advantages"][:4].abs().max() > 0.1
    torch.testing.assert_close(filtered["advantages"], reference["advantages"], rtol=0, atol=1e-6)
    assert log["prime/filtered_group_rate"] == 0.5
    assert log["prime/credited_rate"] == 0.5
    assert "prime/filtered_group_rate" not in runs["unscorable"][1]  # logged only with the filter on


def test_the_prompt_filter_drops_a_group_holding_a_truncated_row(tiny_model_path, tiny_dataset, tmp_path):
    """Groups of 2, each with one correct row (accuracy 0.5: the accuracy filter keeps all 4), so a group is dropped
    exactly when one of its rows is truncated (its last generated token neither EOS nor padding, TRL's test)."""
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(tiny_model_path).eos_token_id
    # EOS made likelier at every step (a bias on its logit), so that some rows end before 10 tokens and others not
    trainer = CreditTrainer(tiny_model_path, verdicts_by_row((0, 2, 4, 6)), args=tiny_args(
        tmp_path, bf16=False, num_generations=2, prime_prompt_filter=True,
        generation_kwargs={"sequence_bias": [[[eos], 4.5]]}), train_dataset=tiny_dataset)
    batches, _ = recorded(trainer)
    trainer.train()
    batch = batches[0]
    ends = {trainer.processing_class.eos_token_id, trainer.processing_class.pad_token_id}
    lengths = batch["completion_mask"].sum(dim=1).tolist()
    truncated = [ids[n - 1] not in ends for ids, n in zip(batch["completion_ids"].tolist(), lengths)]
    dropped = [any(truncated[g * 2:(g + 1) * 2]) for g in range(4)]
    assert 0 < sum(dropped) < 4, "some groups dropped and some kept, else the check would be weak"
    log = next(e for e in trainer.state.log_history if "prime/filtered_group_rate" in e)
    assert log["prime/filtered_group_rate"] == sum(dropped) / 4
    for g in range(4):
        advantages = batch["advantages"][g * 2:(g + 1) * 2]
        assert bool(advantages.abs().max() == 0) == dropped[g], g


def test_a_batch_the_filter_empties_trains_nothing_and_warns_once(tiny_model_path, tiny_dataset, tmp_path):
    """Every row correct: both groups at accuracy 1.0 are dropped. Advantages 0, no PRM step, one warning naming the
    bounds and the way out, the rate 1.0 logged every step."""
    trainer = CreditTrainer(tiny_model_path, verdicts_by_row(range(8)), args=tiny_args(
        tmp_path, bf16=False, max_steps=2, prime_prompt_filter=True), train_dataset=tiny_dataset)
    batches, _ = recorded(trainer)
    with pytest.warns(UserWarning, match="every group of a generation batch was dropped by PRIME's prompt filter") \
            as caught:
        trainer.train()
    assert sum("prompt filter" in str(w.message) for w in caught) == 1
    assert all(b["advantages"].abs().max() == 0 for b in batches)
    assert not trainer.credit.prm.optimizer.state  # the PRM never stepped
    rates = [e["prime/filtered_group_rate"] for e in trainer.state.log_history if "prime/filtered_group_rate" in e]
    assert rates == [1.0, 1.0]


# ------------------------------------------------------------------------------------------- update order, references
def hand_updated_prm(model_path, batch, valid, labels, beta, lr, clip, ce_mask=None):
    """The PRM after one AdamW step of L_CE on ``batch``'s ``valid`` rows, redone by hand on a fresh copy of the
    initial policy (as in the first test), and the reference (the initial policy). ``ce_mask``: the tokens whose
    log-ratios make r_phi(y) (default: every completion token)."""
    from transformers import AutoModelForCausalLM

    prm = AutoModelForCausalLM.from_pretrained(model_path)
    ref = AutoModelForCausalLM.from_pretrained(model_path)
    keep = torch.tensor(valid)
    rows = {k: v[keep] for k, v in batch.items() if torch.is_tensor(v) and v.dim() == 2 and k != "advantages"}
    with torch.no_grad():
        ref_logps = logps_of(ref, rows).double()
    tokens = (rows["completion_mask"] if ce_mask is None else ce_mask[keep]).double()
    s = beta * ((logps_of(prm, rows).double() - ref_logps) * tokens).sum(dim=1)
    y = labels[keep]
    loss = -(y * torch.log(torch.sigmoid(s)) + (1 - y) * torch.log(1 - torch.sigmoid(s))).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(prm.parameters()), clip)
    torch.optim.AdamW(prm.parameters(), lr=lr, weight_decay=0.0).step()
    return prm, ref


def verdicts(trainer, batch):
    lengths = [int(n) for n in batch["completion_mask"].sum(dim=1)]
    texts = trainer.processing_class.batch_decode(
        [ids[:n] for ids, n in zip(batch["completion_ids"].tolist(), lengths)], skip_special_tokens=True)
    valid = [len(t) % 7 != 0 for t in texts]
    labels = torch.tensor([float(len(t) % 2) for t in texts], dtype=torch.float64)
    outcomes = [float(len(t) % 2) + float("the" in t) for t in texts]
    return lengths, valid, labels, outcomes


def test_after_scores_each_batch_with_its_updates_own_forward(tiny_model_path, tiny_dataset, tmp_path):
    """prime_update="after": one PRM forward per batch (the update's, before its step, scores the batch), where
    "before" runs two (update, then score). The second batch's advantages are those of the PRM updated by hand on the
    first batch, scoring the second (the paper's advantage with plain loops)."""
    forwards = {}
    for order in ("before", "after"):
        trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=tiny_args(
            tmp_path / order, bf16=False, max_steps=2, prime_update=order), train_dataset=tiny_dataset)
        calls = forward_counter(trainer.credit.prm.model)
        batches, _ = recorded(trainer)
        trainer.train()
        forwards[order] = len(calls)
    assert forwards == {"before": 4, "after": 2}  # 2 batches of 8 rows, one chunk each
    first, second = batches
    lengths, valid, labels, _ = verdicts(trainer, first)
    assert 0 < sum(labels[valid]) < sum(valid)
    prm, ref = hand_updated_prm(tiny_model_path, first, valid, labels, 0.05, 1e-2, 10.0)
    with torch.no_grad():
        prm_logps, ref_logps = logps_of(prm, second).double(), logps_of(ref, second).double()
    lengths, valid, _, outcomes = verdicts(trainer, second)
    expected = reference_advantages(prm_logps.tolist(), ref_logps.tolist(), lengths, [i // 4 for i in range(8)],
                                    valid, outcomes, 0.05, 1.0, norm=True, whiten=True, process_coef=1.0,
                                    outcome_coef=1.0)
    assert any(max(row) - min(row) > 1e-3 for row, v in zip(expected, valid) if v and len(row) > 1)
    for i in range(8):
        assert second["advantages"][i, :lengths[i]].tolist() == pytest.approx(expected[i], abs=2e-4), i


def test_sync_ref_model_keeps_the_prms_reference_at_the_initial_weights(tiny_model_path, tiny_dataset, tmp_path):
    """TRL's sync_ref_model moves TRL's reference toward the policy; the PRM's implicit rewards are against a fixed
    reference, so it gets its own frozen copy (with a warning), which the sync leaves at the initial weights."""
    args = tiny_args(tmp_path, bf16=False, max_steps=2, beta=0.04, sync_ref_model=True, ref_model_sync_steps=1,
                     ref_model_mixup_alpha=0.5)
    with pytest.warns(UserWarning, match="sync_ref_model=True: TRL's reference model drifts"):
        trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=args,
                                train_dataset=tiny_dataset)
    prm = trainer.credit.prm
    assert prm.reference is not trainer.ref_model and not prm.reference_is_trls
    initial = [p.detach().clone() for p in prm.reference.parameters()]
    trl_initial = [p.detach().clone() for p in trainer.ref_model.parameters()]
    trainer.train()
    assert all(torch.equal(a, p) for a, p in zip(initial, prm.reference.parameters()))
    assert any(not torch.equal(a, p) for a, p in zip(trl_initial, trainer.ref_model.parameters()))  # TRL's moved


def test_trls_reference_logprobs_stand_in_only_once_the_prm_has_moved(tiny_model_path, tiny_dataset, tmp_path):
    """prime_update="after" with TRL's beta > 0: the first batch meets the PRM at its initialization (π_φ = π_ref),
    whose rewards must be exactly 0, so PRIME runs its own reference forward there (TRL's fused LM head rounds
    differently): each row's advantage is its outcome term alone, constant over its tokens. The second batch meets a
    PRM that has stepped, and reuses TRL's: 3 reference forwards over 2 batches, not 4."""
    trainer = CreditTrainer(tiny_model_path, [accuracy_reward, format_reward], args=tiny_args(
        tmp_path, bf16=False, max_steps=2, prime_update="after", beta=0.04), train_dataset=tiny_dataset)
    calls = forward_counter(trainer.ref_model)
    batches, _ = recorded(trainer)
    trainer.train()
    assert len(calls) == 3
    for advantages, mask in zip(batches[0]["advantages"], batches[0]["completion_mask"]):
        values = advantages[mask.bool()]
        assert torch.equal(values, values[0].expand_as(values))


# ------------------------------------------------------------------------------------------- multi-turn rows
def test_tool_result_tokens_get_no_reward_no_ce_and_no_advantage(tiny_model_path, tiny_dataset, tmp_path):
    """A user's rollout_func (accepted: PRIME generates nothing itself) returns fixed 2-turn completions: 3 model
    tokens, a 2-token tool result (env_mask 0, TRL's tool_mask), then model tokens up to EOS. The forwards attend to
    every token, but only the model's own carry implicit rewards, the PRM's CE, the row means, the largest return and
    the whitening; the tool tokens get advantage 0. Expected: the PRM's update redone by hand with r_phi(y) summed over
    the model tokens, then the paper's advantage with plain loops over each row's model tokens alone (gamma 1, so
    dropping the tool tokens from a row changes none of its returns)."""
    generator = torch.Generator().manual_seed(0)
    lengths = [7, 8, 6, 9, 8, 7, 9, 6]  # EOS (id 2) included
    completions = [torch.randint(3, 300, (n - 1,), generator=generator).tolist() + [2] for n in lengths]
    env_mask = [[1, 1, 1, 0, 0] + [1] * (n - 5) for n in lengths]
    prompt = torch.randint(3, 300, (5,), generator=generator).tolist()

    def rollout_func(prompts, trainer):
        assert len(prompts) == 8
        return {"prompt_ids": [prompt] * 8, "completion_ids": completions,
                "logprobs": [[0.0] * n for n in lengths], "env_mask": env_mask}

    def verifier(completions, **kwargs):
        return [float(i in (0, 1, 4)) for i in range(len(completions))]  # group accuracies 0.5 and 0.25

    def formatting(completions, **kwargs):
        return [0.0] * len(completions)

    trainer = CreditTrainer(tiny_model_path, [verifier, formatting], args=tiny_args(tmp_path, bf16=False),
                            train_dataset=tiny_dataset, rollout_func=rollout_func)
    batches, _ = recorded(trainer)
    trainer.train()
    batch = batches[0]
    assert batch["completion_ids"].tolist() == [c + [0] * (9 - len(c)) for c in completions]
    own = (batch["tool_mask"] * batch["completion_mask"]).double()
    assert own.sum(dim=1).tolist() == [n - 2 for n in lengths]
    labels = torch.tensor([float(i in (0, 1, 4)) for i in range(8)], dtype=torch.float64)
    prm, ref = hand_updated_prm(tiny_model_path, batch, [True] * 8, labels, 0.05, 1e-2, 10.0, ce_mask=own)
    with torch.no_grad():
        prm_logps, ref_logps = logps_of(prm, batch).double(), logps_of(ref, batch).double()
    keep = [[t for t in range(9) if own[i, t]] for i in range(8)]
    expected = reference_advantages(
        [[prm_logps[i, t].item() for t in keep[i]] for i in range(8)],
        [[ref_logps[i, t].item() for t in keep[i]] for i in range(8)], [len(k) for k in keep],
        [i // 4 for i in range(8)], [True] * 8, labels.tolist(), 0.05, 1.0, norm=True, whiten=True,
        process_coef=1.0, outcome_coef=1.0)
    got = batch["advantages"]
    assert (got[:, 3:5] == 0).all()  # the tool result
    for i in range(8):
        assert got[i, keep[i]].tolist() == pytest.approx(expected[i], abs=2e-4), i
    assert any(max(row) - min(row) > 1e-3 for row in expected)  # the process part is not flat
