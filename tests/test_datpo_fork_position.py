"""Where DATPO branches relative to the token a fork method selects (docs/datpo.md#forks, `fork_position`).

Paper Alg. 1/3: a fork f ∈ {1..|τ|} (1-indexed tokens) branches from x_f = [q; τ_{1:f}], so the prefix keeps the
fork token (for sent-entropy the first token µ_m of a high-entropy sentence, Alg. 2) and the branches start at the
token after it. In 0-indexed code the prefix is τ[:s + 1] for the sentence starting at token s, and the base
rollout's block boundary is the first token the branches replace, s + 1. `fork_position="before_token"` keeps the
earlier behaviour (prefix τ[:s], the sentence's first token resampled, the first sentence never a fork).

The trainer cases script the base rollouts (a fixed three-sentence text) and reward 0 for a response equal to it
and 1 for any other response (every branch), so the tree's values are fractions worked out by hand below.
"""

from fractions import Fraction as F

import pytest

from tests.test_datpo_trainer import SENTENCES, ScriptedDATPOTrainer, two_prompt_dataset
from trl_credit import DATPOConfig


def _sentence_starts(tokenizer, ids):
    # independent reference: token 0 and the tokens holding the first letters of "Then" and "So"
    starts = [0]
    for word in ("Then", "So"):
        char = SENTENCES.index(word)
        starts.append(next(k for k in range(len(ids)) if len(tokenizer.decode(ids[: k + 1])) > char))
    return starts


def _run(tiny_model_path, tmp_path, reward, **overrides):
    config = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_completion_length=64,
        max_steps=1, report_to="none", use_cpu=True, save_strategy="no", use_diversity=False, max_forks=3,
        max_branches=2, fork_method="sent_entropy", seed=3,
    )
    config.update(overrides)
    trainer = ScriptedDATPOTrainer(model=tiny_model_path, reward_funcs=reward, args=DATPOConfig(**config),
                                   train_dataset=two_prompt_dataset())
    trainer.train()
    output, n_base = trainer.batches[0]
    prompt_len = int(output["prompt_mask"][0].sum())
    rows = []  # (prefix length, completion, per-token advantages) per row of the batch
    for r in range(output["completion_ids"].size(0)):
        mask = output["completion_mask"][r].bool()
        prompt = output["prompt_ids"][r][output["prompt_mask"][r].bool()].tolist()
        rows.append((len(prompt) - prompt_len, prompt[prompt_len:], output["completion_ids"][r][mask].tolist(),
                     output["advantages"][r][mask].tolist()))
    return trainer, n_base, rows


def _base_ids(tokenizer):
    return tokenizer(SENTENCES, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def _not_the_base_reward(tokenizer):
    base = _base_ids(tokenizer)

    def reward(completions, completion_ids, **kwargs):
        return [0.0 if list(ids) == base else 1.0 for ids in completion_ids]

    return reward


def _expected_tree(cuts, length, num_base, branches):
    """Hand-worked Eq. 3 / Eq. 7 for N base rollouts of reward 0, each forked at ``cuts`` with ``branches``
    branches of reward 1 per fork: V(fork j) = (branches at forks j..K) / (those + the base leaf)."""
    k = len(cuts)
    value = [F(branches * (k - j), branches * (k - j) + 1) for j in range(k)]
    root = F(num_base * branches * k, num_base * (branches * k + 1))
    ends = [*value, F(0)]  # the last block ends in the base leaf: r = 0, V(terminal) = 0
    starts = [root, *value]
    bounds = [0, *cuts, length]
    base_row = []
    for j in range(k + 1):
        base_row += [float(ends[j] - starts[j])] * (bounds[j + 1] - bounds[j])
    return base_row, {cut: float(1 - value[j]) for j, cut in enumerate(cuts)}


def test_branches_keep_the_sentence_first_token_by_default(tiny_model_path, tiny_tokenizer, tmp_path):
    base = _base_ids(tiny_tokenizer)
    starts = _sentence_starts(tiny_tokenizer, base)
    _, n_base, rows = _run(tiny_model_path, tmp_path, _not_the_base_reward(tiny_tokenizer))
    # V_root = 0: K̂ = 3, B̂ = 2. All three sentences are forks (the first one too, Alg. 2 ranks every sentence);
    # each branch prefix ends with the sentence's first token, so the fork f (prefix length) is its start + 1.
    cuts = [s + 1 for s in starts]
    prefixes = sorted(prefix_len for prefix_len, *_ in rows[n_base:])
    assert prefixes == sorted(cuts * 2 * n_base)
    for prefix_len, prefix, completion, _ in rows[n_base:]:
        assert prefix == base[:prefix_len]
        assert prefix_len - 1 in starts  # the prefix's last token is a sentence's first token
        assert completion != base[prefix_len:]  # a branch continues after it (reward 1)
    # block boundaries: the sentence's first token closes the block before the fork; the next token opens the next
    expected_base, expected_branch = _expected_tree(cuts, len(base), n_base, branches=2)
    for _, _, completion, advantages in rows[:n_base]:
        assert completion == base
        assert advantages == pytest.approx(expected_base, abs=1e-6)
        # hand values: root→f1 = 6/7 − 6/7, f1→f2 = 4/5 − 6/7, f2→f3 = 2/3 − 4/5, f3→leaf = 0 − 2/3
        then_token = starts[1]
        assert advantages[then_token] == pytest.approx(4 / 5 - 6 / 7)
        assert advantages[then_token + 1] == pytest.approx(2 / 3 - 4 / 5)
        assert advantages[0] == pytest.approx(0.0) and advantages[1] == pytest.approx(4 / 5 - 6 / 7)
    for prefix_len, _, completion, advantages in rows[n_base:]:
        assert advantages == pytest.approx([expected_branch[prefix_len]] * len(completion), abs=1e-6)
    assert DATPOConfig(output_dir=str(tmp_path), use_cpu=True).fork_position == "after_token"


def test_before_token_resamples_the_sentence_first_token(tiny_model_path, tiny_tokenizer, tmp_path):
    base = _base_ids(tiny_tokenizer)
    starts = _sentence_starts(tiny_tokenizer, base)
    reward = _not_the_base_reward(tiny_tokenizer)
    _, n_base, rows = _run(tiny_model_path, tmp_path, reward, fork_position="before_token")
    # the first sentence cannot fork (its prefix would be the bare prompt): 2 forks at the later sentence starts
    cuts = starts[1:]
    assert sorted(prefix_len for prefix_len, *_ in rows[n_base:]) == sorted(cuts * 2 * n_base)
    expected_base, expected_branch = _expected_tree(cuts, len(base), n_base, branches=2)
    for _, _, _, advantages in rows[:n_base]:
        assert advantages == pytest.approx(expected_base, abs=1e-6)
        assert advantages[starts[1] - 1] == pytest.approx(0.0) and advantages[starts[1]] == pytest.approx(2 / 3 - 4 / 5)
    for prefix_len, _, completion, advantages in rows[n_base:]:
        assert advantages == pytest.approx([expected_branch[prefix_len]] * len(completion), abs=1e-6)


# Recorded with the code before `fork_position` existed (branches from τ[:s]), on this tiny case: per row, (prefix
# length, run-length encoded advantages rounded to 6 decimals). `fork_position="before_token"` must reproduce it.
RECORDED_BEFORE_TOKEN = {
    "sent_entropy": [
        (0, [(-0.04, 10), (0.066667, 12), (-0.266667, 10)]),
        (0, [(0.04, 10), (-0.08, 12), (-0.2, 10)]),
        (10, [(-0.2, 22)]),
        (10, [(-0.0, 22)]),
        (22, [(0.333333, 10)]),
        (22, [(-0.066667, 10)]),
        (10, [(0.12, 22)]),
        (10, [(0.12, 22)]),
        (22, [(0.0, 10)]),
        (22, [(0.2, 10)]),
    ],
    "tok_entropy": [
        (0, [(0.1, 18), (0.133333, 13), (-0.533333, 1)]),
        (0, [(-0.1, 18), (-0.066667, 13), (-0.133333, 1)]),
        (18, [(-0.4, 14)]),
        (18, [(0.0, 14)]),
        (31, [(0.266667, 1)]),
        (31, [(0.266667, 1)]),
        (18, [(0.0, 14)]),
        (18, [(0.2, 14)]),
        (31, [(0.066667, 1)]),
        (31, [(0.066667, 1)]),
    ],
}


def _run_lengths(values):
    runs = []
    for value in values:
        value = round(value, 6)
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return [tuple(run) for run in runs]


@pytest.mark.parametrize("method", ["sent_entropy", "tok_entropy"])
def test_before_token_reproduces_the_recorded_old_run(tiny_model_path, tiny_tokenizer, tmp_path, method):
    base = _base_ids(tiny_tokenizer)

    def reward(completions, completion_ids, **kwargs):
        return [0.0 if list(ids) == base else (sum(ids) % 5) / 5 for ids in completion_ids]

    _, _, rows = _run(tiny_model_path, tmp_path, reward, fork_position="before_token", fork_method=method,
                      max_completion_length=32, max_forks=2)
    got = [(prefix_len, _run_lengths(advantages)) for prefix_len, _, _, advantages in rows]
    assert got == RECORDED_BEFORE_TOKEN[method]
