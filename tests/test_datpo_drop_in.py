"""DATPO on real scripts' inputs (issue: one notion of success, unscorable rows, no silent degeneration) and the
edges of what reaches the loss: truncation masking, rows per forward, α per optimizer step.

Fixture task (as in tests/test_datpo_trainer.py): two prompts per step; the even-answer prompt is always answered
correctly, the odd one is correct when the token sum of the whole response is odd. A format reward scores 1 on
every row, so TRL's weighted total is >= 1 for every rollout: only the verifier column tells right from wrong.
"""

import math
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.test_datpo_trainer import SENTENCES, RecordingDATPOTrainer, ScriptedDATPOTrainer, two_prompt_dataset
from trl_credit import DATPOConfig, DATPOTrainer


def accuracy(completions, answer, completion_ids, **kwargs):
    return [1.0 if int(a) % 2 == 0 else float(sum(ids) % 2) for a, ids in zip(answer, completion_ids)]


def format_always(completions, **kwargs):
    return [1.0] * len(completions)


def _unscorable(ids):
    return sum(ids) % 3 == 0


def accuracy_or_none(completions, answer, completion_ids, **kwargs):
    return [None if _unscorable(ids) else r for ids, r in zip(completion_ids, accuracy(completions, answer, completion_ids))]


def format_or_none(completions, completion_ids, **kwargs):
    return [None if _unscorable(ids) else 1.0 for ids in completion_ids]


def _config(tmp_path, **overrides):
    config = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=10,
        max_steps=2, learning_rate=1e-2, report_to="none", logging_steps=1, use_cpu=True, save_strategy="no",
        fork_method="tok_entropy", use_diversity=False, seed=3,
    )
    config.update(overrides)
    return DATPOConfig(**config)


def _train_recording(tiny_model_path, tmp_path, monkeypatch, reward_funcs, **overrides):
    trainer = RecordingDATPOTrainer(model=tiny_model_path, reward_funcs=reward_funcs,
                                    args=_config(tmp_path, **overrides), train_dataset=two_prompt_dataset())
    trainer.train()
    return trainer


def _rows(record):
    """(base rows it can grow from, response = prefix + completion, advantages on the completion's loss tokens)
    per batch row; base rows come first and own themselves."""
    batch, base_prompts, base = record["batch"], record["base_prompts"], record["base"]
    rows = []
    for r in range(batch["completion_ids"].size(0)):
        mask = batch["completion_mask"][r].bool()
        if not mask.any():
            continue
        prompt = batch["prompt_ids"][r][batch["prompt_mask"][r].bool()].tolist()
        completion = batch["completion_ids"][r][mask].tolist()
        if r < len(base):
            owners = [r]
        else:  # prompt = base prompt + a proper prefix of the base rollout it branches from
            owners = [
                i for i, p in enumerate(base_prompts)
                if prompt[: len(p)] == p and 1 <= len(prompt) - len(p) < len(base[i])
                and base[i][: len(prompt) - len(p)] == prompt[len(p):]
            ]
        i = owners[0]
        rows.append((owners, prompt[len(base_prompts[i]):] + completion, batch["advantages"][r][mask].tolist()))
    return rows


def test_two_rewards_success_from_the_first_grows_trees(tiny_model_path, tmp_path, monkeypatch):
    trainer = _train_recording(tiny_model_path, tmp_path, monkeypatch, [accuracy, format_always])
    logs = [log for log in trainer.state.log_history if "datpo/pass_rate" in log]
    assert len(logs) == 2
    for log, record in zip(logs, trainer.records):
        answers = record["answers"]
        # the format reward makes every total >= 1; DATPO must still branch on the unsolved (odd) prompt
        assert len(record["branches"]) > 0 and log["datpo/leaves_per_prompt"] > 4
        # V_root and pass rates from the accuracy column only (groups: rows 0-3 and 4-7)
        base_acc = accuracy(None, answers, record["base"])
        v_root = [sum(base_acc[g * 4 : (g + 1) * 4]) / 4 for g in range(2)]
        assert log["datpo/v_root"] == pytest.approx(sum(v_root) / 2)
        assert log["datpo/base_pass_rate"] == pytest.approx(sum(any(a >= 1 for a in base_acc[g * 4 : (g + 1) * 4]) for g in range(2)) / 2)
        correct = [False, False]
        for (i, *_), response, _ in _rows(record):
            correct[i // 4] |= accuracy(None, [answers[i]], [response])[0] >= 1
        assert log["datpo/pass_rate"] == pytest.approx(sum(correct) / 2)


def test_unscorable_rows_get_zero_advantage_and_no_branches(tiny_model_path, tmp_path, monkeypatch):
    trainer = _train_recording(tiny_model_path, tmp_path, monkeypatch, [accuracy_or_none, format_or_none], seed=5)
    seen_unscorable = seen_scorable_nonzero = False
    for record in trainer.records:
        answers, base = record["answers"], record["base"]
        rows = _rows(record)
        for _, response, advantages in rows:
            if _unscorable(response):
                seen_unscorable = True
                assert advantages == [0.0] * len(advantages)  # exactly 0 on every token
            elif any(advantages):
                seen_scorable_nonzero = True
        # an unscorable base rollout does not fork: no branch row grows from it
        for owners, response, _ in rows:
            if response != base[owners[0]]:
                assert not all(_unscorable(base[i]) for i in owners)
        # V_root: fraction correct among the scorable base rollouts of each group
        log = [x for x in trainer.state.log_history if "datpo/leaves_per_prompt" in x][trainer.records.index(record)]
        v_root = []
        for g in range(2):
            scored = [accuracy(None, [answers[i]], [base[i]])[0] for i in range(g * 4, g * 4 + 4) if not _unscorable(base[i])]
            if scored:
                v_root.append(sum(scored) / len(scored))
        if "datpo/v_root" in log:
            assert log["datpo/v_root"] == pytest.approx(sum(v_root) / len(v_root))
    assert seen_unscorable and seen_scorable_nonzero


ONE_SENTENCE = "The answer is \\boxed{7}"


class OneSentenceDATPOTrainer(ScriptedDATPOTrainer):
    text = ONE_SENTENCE
    eos = True

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not self._datpo_branching:
            ids = self._tokenizer(self.text, add_special_tokens=False)["input_ids"]
            ids = ids + [self._tokenizer.eos_token_id] if self.eos else ids
            return [list(ids) for _ in prompt_ids], None
        return DATPOTrainer._generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                                  has_tool_images)


def _zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


@pytest.mark.parametrize("position, fallback", [
    ("before_token", "tok_entropy"), ("before_token", "none"), ("after_token", "none"),
])
def test_one_sentence_rollouts_fall_back_to_token_entropy(tiny_model_path, tmp_path, position, fallback):
    args = _config(tmp_path, fork_method="sent_entropy", fork_fallback=fallback, fork_position=position, max_steps=1,
                   per_device_train_batch_size=4)
    trainer = OneSentenceDATPOTrainer(model=tiny_model_path, reward_funcs=_zero_reward, args=args,
                                      train_dataset=two_prompt_dataset())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    output, n_base = trainer.batches[0]
    log = next(x for x in trainer.state.log_history if "datpo/no_fork_rate" in x)
    no_fork_warnings = [w for w in caught if "datpo/no_fork_rate" in str(w.message)]
    if position == "after_token":
        # the paper's position: the one sentence is a fork (prefix = its first token); no fallback needed
        assert output["completion_ids"].size(0) == n_base + n_base * 1 * 4
        prompt_len = int(output["prompt_mask"][0].sum())
        assert all(int(output["prompt_mask"][r].sum()) == prompt_len + 1 for r in range(n_base, n_base * 5))
        assert log["datpo/no_fork_rate"] == 0.0 and log["datpo/fork_fallback_rate"] == 0.0
        assert not no_fork_warnings
    elif fallback == "tok_entropy":
        # V_root = 0: K̂ = 3, B̂ = 4 on every rollout -> 3 token forks x 4 branches each
        assert output["completion_ids"].size(0) == n_base + n_base * 3 * 4
        assert log["datpo/no_fork_rate"] == 0.0 and log["datpo/fork_fallback_rate"] == 1.0
        assert not no_fork_warnings
    else:
        assert output["completion_ids"].size(0) == n_base  # no tree at all
        assert log["datpo/no_fork_rate"] == 1.0 and log["datpo/fork_fallback_rate"] == 0.0
        message = str(no_fork_warnings[0].message)
        assert len(no_fork_warnings) == 1 and "fork_fallback='tok_entropy'" in message
        assert "fork_position='after_token'" in message


def parity(completions, completion_ids, **kwargs):
    return [float(sum(ids) % 2) for ids in completion_ids]


class TruncatedTreeDATPOTrainer(DATPOTrainer):
    """Base rollouts: ``SENTENCES`` without EOS (truncated; token sum even, so ``parity`` gives 0 and every prompt
    branches). Branch k of a call: one token of the base text, then EOS when its fork is not in ``truncated_forks``
    (finished), else a second text token (truncated). Keeps each generation batch and the policy's weights it was
    generated with."""

    truncated_forks = ()

    def __init__(self, *args, **kwargs):
        self.batches = []
        super().__init__(*args, **kwargs)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        text = self._tokenizer(SENTENCES, add_special_tokens=False)["input_ids"]
        if not self._datpo_branching:
            return [list(text) for _ in prompt_ids], None
        rows = []
        for k, prompt in enumerate(prompt_ids):
            prompt = list(prompt)
            fork = max(f for f in range(1, len(text)) if prompt[-f:] == text[:f])  # the prefix is text[:fork]
            last = text[5] if fork in self.truncated_forks else self._tokenizer.eos_token_id
            rows.append([text[k % 3], last])
        return rows, None

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.batches.append(({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in output.items()},
                             len(inputs)))
        self.weights_at_generation = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return output


def _truncated_tree_trainer(tiny_model_path, tmp_path, truncated_forks=(), **overrides):
    # fixed_seg with K̂ = 3 on the 31-token text: forks at 7, 15, 23; max_completion_length leaves every branch
    # room for its two tokens; one prompt (4 base rollouts) per step
    settings = dict(fork_method="fixed_seg", max_steps=1, per_device_train_batch_size=4, max_completion_length=40,
                    mask_truncated_completions=True, max_branches=2)
    args = _config(tmp_path, **{**settings, **overrides})
    trainer = TruncatedTreeDATPOTrainer(model=tiny_model_path, reward_funcs=parity, args=args,
                                        train_dataset=two_prompt_dataset())
    trainer.truncated_forks = truncated_forks
    return trainer


@pytest.mark.parametrize(
    "value_estimate, truncated_forks, kept",
    [
        ("subtree", (), 23),  # every fork's value rests on finished branches: all blocks but the last
        ("subtree", (23,), 15),  # under fork 23 only truncated leaves: its incoming block 15→23 is masked too
        ("subtree", (7,), 23),  # under fork 7 lie the finished branches of forks 15 and 23
        ("own_branches", (7,), 0),  # V(7) = its own (truncated) branches: root→7 masked, and what follows it
    ],
)
def test_truncated_base_rollout_keeps_the_blocks_valued_by_finished_leaves(
    tiny_model_path, tmp_path, value_estimate, truncated_forks, kept
):
    trainer = _truncated_tree_trainer(tiny_model_path, tmp_path, truncated_forks, value_estimate=value_estimate)
    trainer.train()
    output, n_base = trainer.batches[0]
    length = len(trainer._tokenizer(SENTENCES, add_special_tokens=False)["input_ids"])
    assert n_base == 4 and output["completion_ids"].size(0) == n_base + 4 * 3 * 2  # K̂ = 3 forks, B̂ = 2 branches
    for r in range(n_base):
        mask = output["completion_mask"][r].tolist()
        # the leading blocks whose end value rests on a finished leaf keep their loss; the truncated tail is masked
        assert mask[:length] == [1] * kept + [0] * (length - kept)
    eos = trainer._tokenizer.eos_token_id
    for r in range(n_base, output["completion_ids"].size(0)):  # a truncated branch is masked whole
        ids = output["completion_ids"][r][output["completion_ids"][r] != trainer._tokenizer.pad_token_id].tolist()
        assert output["completion_mask"][r].tolist()[: len(ids)] == [int(ids[-1] == eos)] * len(ids)


def test_no_training_when_every_completion_is_truncated(tiny_model_path, tmp_path):
    # TRL's test_training_with_mask_truncated_completions_all_masked, for trees: no leaf finished, so no block value
    # rests on a finished rollout and nothing is trained (the parameters do not move)
    trainer = _truncated_tree_trainer(tiny_model_path, tmp_path, truncated_forks=(7, 15, 23))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    output, n_base = trainer.batches[0]
    assert output["completion_ids"].size(0) > n_base  # the trees were grown
    assert bool(output["datpo_base_advantages"].abs().sum() > 0)  # and their blocks have advantages
    assert int(output["completion_mask"].sum()) == 0 and int(output["num_items_in_batch"]) == 0
    assert next(x for x in trainer.state.log_history if "loss" in x)["loss"] == 0.0
    for name, param in trainer.model.named_parameters():
        assert torch.equal(param, before[name]), name


@torch.no_grad()
def _row_logps(model, prompt, completion, temperature):
    """Log-probs of ``completion`` after ``prompt`` under ``model``: one unpadded row, all of it attended."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(1, ids[0, len(prompt):, None]).squeeze(1)


def test_kept_blocks_of_truncated_rollouts_get_their_own_old_and_ref_logps(tiny_model_path, tmp_path):
    # num_iterations = 2 makes TRL keep old log-probs, beta > 0 reference log-probs. TRL computes both with a
    # truncated completion masked out of attention; the blocks DATPO keeps must be scored with their real context.
    trainer = _truncated_tree_trainer(tiny_model_path, tmp_path, num_iterations=2, beta=0.1, max_steps=2)
    trainer.train()
    assert len(trainer.batches) == 1  # generated once, before any optimizer step
    output, n_base = trainer.batches[0]
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    policy.load_state_dict(trainer.weights_at_generation)
    reference = trainer.ref_model
    restored = 0
    for r in range(output["completion_ids"].size(0)):
        mask = output["completion_mask"][r].bool()
        if not mask.any():
            continue
        prompt = output["prompt_ids"][r][output["prompt_mask"][r].bool()].tolist()
        completion = output["completion_ids"][r][mask].tolist()
        want_old = _row_logps(policy, prompt, completion, trainer.temperature)
        want_ref = _row_logps(reference, prompt, completion, trainer.temperature)
        # float noise of TRL's batched, fused log-prob pass is up to ~1e-3 here; the masked context was off by ~6
        torch.testing.assert_close(output["old_per_token_logps"][r][mask], want_old, atol=5e-3, rtol=1e-3)
        torch.testing.assert_close(output["ref_per_token_logps"][r][mask], want_ref, atol=5e-3, rtol=1e-3)
        restored += int(r < n_base) * len(completion)
    assert restored == n_base * 23  # the kept blocks of the truncated base rollouts were compared


def test_rows_per_forward_bounds_forwards_and_keeps_the_loss(tiny_model_path, tmp_path):
    results = {}
    for cap in (None, 1000):
        trainer = DATPOTrainer(model=tiny_model_path, reward_funcs=[accuracy, format_always],
                               args=_config(tmp_path, max_steps=1, per_device_train_batch_size=4,
                                            gradient_accumulation_steps=2, rows_per_forward=cap),
                               train_dataset=two_prompt_dataset())
        sizes = []
        hook = trainer.model.register_forward_pre_hook(
            lambda module, args, kwargs: sizes.append((torch.is_grad_enabled(), kwargs["input_ids"].size(0))),
            with_kwargs=True,
        )
        torch.manual_seed(0)
        trainer.train()
        hook.remove()
        log = next(x for x in trainer.state.log_history if "loss" in x)
        results[cap] = (log["loss"], log["grad_norm"], max(n for grad, n in sizes if grad))
    (loss_small, grad_small, most_small), (loss_big, grad_big, most_big) = results[None], results[1000]
    assert most_small <= 4 < most_big  # a micro-batch holds a whole tree's rows; forwards hold at most 4
    assert loss_small == pytest.approx(loss_big, rel=1e-4, abs=1e-6)
    assert grad_small == pytest.approx(grad_big, rel=1e-3)


def test_alpha_follows_optimizer_steps_with_num_iterations(tiny_model_path, tmp_path):
    trainer = DATPOTrainer(model=tiny_model_path, reward_funcs=[accuracy, format_always],
                           args=_config(tmp_path, max_steps=4, num_iterations=2, use_diversity=True),
                           train_dataset=two_prompt_dataset())
    trainer.train()
    alphas = [x["datpo/alpha"] for x in trainer.state.log_history if "datpo/alpha" in x]
    # linear 0.2 -> 0 over the 4 optimizer steps, although only 2 generation batches were drawn
    assert alphas == pytest.approx([0.2, 0.2 * 2 / 3, 0.2 / 3, 0.0])


def test_normalize_then_sum_trains_and_branches(tiny_model_path, tmp_path, monkeypatch):
    trainer = _train_recording(tiny_model_path, tmp_path, monkeypatch, [accuracy, format_always],
                               multi_objective_aggregation="normalize_then_sum", max_steps=1)
    record = trainer.records[0]
    assert len(record["branches"]) > 0
    answers = record["answers"]
    # leaf reward = the accuracy standardized over the tree (format is constant: (1 − 1)/(0 + 1e-4) = 0), so a
    # branch's advantage is (acc − mean)/(std + 1e-4) minus the fork's value on that scale: same sign as r − V
    rows = _rows(record)
    for (i, *_), response, advantages in rows:
        group = [a for (j, *_), resp, _ in rows if j // 4 == i // 4 for a in accuracy(None, [answers[j]], [resp])]
        if len(set(group)) == 1:
            assert all(a == 0 for a in advantages)  # all leaves alike: nothing to learn, as in GRPO
    assert all(math.isfinite(x["loss"]) for x in trainer.state.log_history if "loss" in x)
