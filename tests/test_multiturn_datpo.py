"""DATPO's trees inside multi-turn rollouts (issue 60 items 3 and 5; docs/datpo.md#multi-turn-rollouts,
docs/multiturn.md#datpo-trees).

Pure pieces first (``select_forks`` with a model mask, worked by hand on a 7-token completion with a 2-token tool
result in the middle), then the trainer on the scripted tiny tool model (tests/tiny_tools.py), 2 base rollouts per
prompt, one fork each (``fork_method="fixed_seg"``, ``max_forks=1``: f = the position of model token ⌊L_m/2⌋) and 2
branches per fork (``difficulty_adaptive=False``). Token counts of the scripted texts (the tiny Qwen tokenizer, checked
in :func:`test_the_scripted_texts_token_counts`): the tool call ``increment(2)`` 20 tokens, a tool span 14 (TRL's qwen3
tool turn and the next generation prompt), ``LONG`` 25, ``DONE`` 4, ``PLAIN`` 23.
"""

import os
from unittest.mock import patch

import pytest
import torch
from transformers import AutoTokenizer

from tests.test_multiturn_trl import TOOL_SPAN, CounterEnvironment, prompts_dataset, tool_call
from tests.tiny_tools import ScriptedGeneration

import trl_credit
from trl_credit.datpo import select_forks
from trl_credit.datpo.forest import TreeBatch
from trl_credit.datpo.multiturn import model_sentence_spans

CALL = tool_call("increment", '{"step": 2}')  # 20 tokens
LONG = "The counter is two now, so the answer is not twelve.<|im_end|>"  # 25 tokens
DONE = "Done!<|im_end|>"  # 4 tokens
PLAIN = "Step one. Step two. Step three."  # 23 tokens
CONTINUATION = tool_call("increment", '{"step": 5}')  # what the script writes inside a turn in progress


class RewardedCounter(CounterEnvironment):
    """TRL's counter owning the reward: the final counter."""

    def get_reward(self) -> float:
        return float(self._counter)


class DriftingCounter(CounterEnvironment):
    """Not deterministic: each reset() starts the counter at another value (100, 200, ...), so a replay of the base
    rollout's calls answers differently from the rollout itself."""

    resets = 0

    def reset(self, **kwargs):
        DriftingCounter.resets += 1
        self._counter = 100 * DriftingCounter.resets


def increment(step: int) -> int:
    """
    Increment a counter that starts at 0.

    Args:
        step: Value to add.

    Returns:
        The counter.
    """
    CALLS.append(step)
    return step


CALLS: list[int] = []


def tool_results(completions, **kwargs):
    """The sum of the integer tool results in the completion (a reward reading the whole leaf's messages)."""
    return [float(sum(int(m["content"]) for m in c if m["role"] == "tool" and m["content"].isdigit()))
            for c in completions]


@pytest.fixture(scope="module")
def tokenizer(tiny_tool_model_path):
    return AutoTokenizer.from_pretrained(tiny_tool_model_path)


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def train(model_path, tmp_path, tokenizer, first_turn, after_tool, reward_funcs=None, max_steps=1, **kwargs):
    """DATPO on one prompt, 2 identical base rollouts (``first_turn``, then ``after_tool`` after a tool result; a
    turn in progress is continued with CONTINUATION). Returns the trainer, the on_credit steps and the script."""
    args = trl_credit.DATPOConfig(
        output_dir=str(tmp_path), learning_rate=0.1, per_device_train_batch_size=2, num_generations=2,
        max_completion_length=256, max_steps=max_steps, logging_steps=1, report_to="none", save_strategy="no",
        use_cpu=True, bf16=False, seed=0, disable_tqdm=True, max_forks=1, max_branches=2, difficulty_adaptive=False,
        fork_method="fixed_seg", use_diversity=False, value_estimate="subtree", branch_budget="remaining")
    trainer = trl_credit.DATPOTrainer(model_path, reward_funcs, args=args, train_dataset=prompts_dataset(), **kwargs)
    steps = []
    trainer.add_credit_callback(steps.append)
    script = ScriptedGeneration(tokenizer, [first_turn], after_tool=after_tool, continuation=CONTINUATION)
    with patch.object(trainer.model, "generate", side_effect=script):
        trainer.train()
    return trainer, steps, script


def row_text(tokenizer, output, row, where=None):
    """The decoded completion of training row ``row`` (its completion mask), or of its tokens where ``where`` is 1."""
    keep = output["completion_mask"][row] == 1
    if where is not None:
        keep = keep & (where[row] == 1)
    return tokenizer.decode(output["completion_ids"][row][keep].tolist())


def step_logs(trainer):
    return [entry for entry in trainer.state.log_history if "loss" in entry]


# ---------------------------------------------------------------------------------------------------- pure pieces
# A 2-turn completion in miniature: turn 1 = tokens 0-2, a tool result 3-4, turn 2 = 5-6.
MASK = [1, 1, 1, 0, 0, 1, 1]
ENTROPIES = [0.1, 0.2, 0.3, 9.0, 9.0, 0.5, 0.4]  # the tool result's "entropies" are the largest: never the model's


def test_token_entropy_forks_lie_on_model_tokens():
    # after_token: fork token t with t and t + 1 model tokens, 0 < t + 1 < 7 -> t in {0, 1, 5} (t = 2 ends turn 1: its
    # next token is the tool's). Highest entropy first: t = 5 (0.5) -> f = 6; then t = 1 (0.2) -> f = 2.
    assert select_forks(ENTROPIES, None, 1, "tok_entropy", model_mask=MASK) == [6]
    assert select_forks(ENTROPIES, None, 2, "tok_entropy", model_mask=MASK) == [2, 6]
    # Without the mask the tool result's token 3 (9.0) would be the fork token: f = 4, inside the tool result.
    assert select_forks(ENTROPIES, None, 1, "tok_entropy") == [4]
    # before_token: fork token t = f, a model token with t >= 1 -> {1, 2, 5, 6}; t = 5 (0.5) -> f = 5, the prefix ends
    # with the tool result and the branch generates turn 2 anew.
    assert select_forks(ENTROPIES, None, 1, "tok_entropy", position="before_token", model_mask=MASK) == [5]
    # a mask without a 0 changes nothing
    assert select_forks(ENTROPIES, None, 2, "tok_entropy", model_mask=[1] * 7) == select_forks(ENTROPIES, None, 2,
                                                                                             "tok_entropy")


def test_sentence_forks_rank_model_sentences_only():
    # Sentences over the model's tokens: (0, 2), (2, 3) in turn 1, (5, 7) in turn 2; mean entropies 0.15, 0.3, 0.45.
    spans = [(0, 2), (2, 3), (5, 7)]
    # after_token: sentence (2, 3) starts at turn 1's last token (f = 3 would replace the tool's token): not a fork.
    # The rest by entropy: (5, 7) -> f = 6, then (0, 2) -> f = 1.
    assert select_forks(ENTROPIES, spans, 1, "sent_entropy", model_mask=MASK) == [6]
    assert select_forks(ENTROPIES, spans, 3, "sent_entropy", model_mask=MASK) == [1, 6]


def test_fixed_and_random_forks_replace_model_tokens():
    # fixed_seg over the model's tokens: positions [0, 1, 2, 5, 6], L_m = 5, k = 2: model tokens 5 // 3 = 1 and
    # 10 // 3 = 3 -> positions 1 and 5. Over all 7 tokens it would be 7 // 3 = 2 and 14 // 3 = 4 (a tool token).
    assert select_forks(None, None, 2, "fixed_seg", num_tokens=7, model_mask=MASK) == [1, 5]
    assert select_forks(None, None, 2, "fixed_seg", num_tokens=7) == [2, 4]
    # random: among the forks whose replaced token is the model's, {1, 2, 5, 6}; all four when asked for 6
    assert select_forks(None, None, 6, "random", num_tokens=7, model_mask=MASK) == [1, 2, 5, 6]
    for seed in range(20):
        import random

        assert set(select_forks(None, None, 2, "random", num_tokens=7, model_mask=MASK,
                                rng=random.Random(seed))) <= {1, 2, 5, 6}


def test_sentences_split_per_model_turn(tokenizer):
    # turn 1 "Step one. Step two." (13 tokens), a tool span (14), turn 2 "Done!<|im_end|>" (4)
    turn1, span, turn2 = encode(tokenizer, "Step one. Step two."), encode(tokenizer, TOOL_SPAN.format(result="2")), \
        encode(tokenizer, DONE)
    ids = turn1 + span + turn2
    mask = [1] * len(turn1) + [0] * len(span) + [1] * len(turn2)
    # "Step one." = tokens 0-5, then " " (6: no visible character, so it stays in the sentence before it, the
    # sentence_spans rule), "Step two." = 7-12; the tool span 13-26 is in no sentence; "Done!<|im_end|>" = 27-30
    assert model_sentence_spans(tokenizer, ids, mask) == [(0, 7), (7, 13), (27, 31)]


def test_the_scripted_texts_token_counts(tokenizer):
    assert [len(encode(tokenizer, text)) for text in (CALL, TOOL_SPAN.format(result="2"), LONG, DONE, PLAIN)] == [
        20, 14, 25, 4, 23]


# ---------------------------------------------------------------------------------------------------- the trainer
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_a_fork_in_the_second_turn_replays_the_environment_and_resumes_the_tool_loop(tiny_tool_model_path, tokenizer,
                                                                                    tmp_path):
    # Base rollout: CALL (20), the tool span of "2" (14), LONG (25): L = 59, L_m = 45 model tokens. fixed_seg, k = 1:
    # model token 45 // 2 = 22 = turn 2's third token -> f = 20 + 14 + 2 = 36 (over all 59 tokens, 59 // 2 = 29 would
    # be inside the tool span). The prefix ends with "The counter"; the script continues the turn in progress with
    # a tool call, increment(5), which TRL's loop executes on the branch's environment, replayed to the fork
    # (reset, increment(2): 2), so it answers 7; after the tool result the script writes LONG again.
    trainer, steps, _ = train(tiny_tool_model_path, tmp_path, tokenizer, CALL, LONG,
                              environment_factory=RewardedCounter)
    output, trees = steps[0].output, steps[0].record.payload(TreeBatch)
    assert trees.forks == [[36], [36]]
    # rows: 2 base rollouts, then 2 branches per fork
    assert output["completion_ids"].size(0) == 6
    base = CALL + TOOL_SPAN.format(result="2") + LONG
    branch = CONTINUATION + TOOL_SPAN.format(result="7") + LONG
    tool_mask = output["tool_mask"]
    for row in (0, 1):  # base rows keep TRL's tool_mask: 0 on the tool result only
        assert row_text(tokenizer, output, row) == base
        assert row_text(tokenizer, output, row, 1 - tool_mask) == TOOL_SPAN.format(result="2")
    for row in range(2, 6):  # a branch row: its completion is the branch (the prefix is in its prompt)
        assert row_text(tokenizer, output, row) == branch
        assert row_text(tokenizer, output, row, 1 - tool_mask) == TOOL_SPAN.format(result="7")
        prompt = tokenizer.decode(output["prompt_ids"][row][output["prompt_mask"][row] == 1].tolist())
        assert prompt.endswith(CALL + TOOL_SPAN.format(result="2") + "The counter")
    # The environment-owned reward is each leaf's own environment's: 2 for the base rollouts, 7 for the branches.
    assert trees.branch_rewards == [7.0] * 4 and trees.base_rewards == [2.0, 2.0]
    # Block advantages (subtree values): V(root) = V(fork) = (2 + 7 + 7) / 3 = 16/3 (every fork's subtree is its base
    # leaf and 2 branches; the root's all 6 leaves, the same mean). Root -> fork: 16/3 - 16/3 = 0; fork -> base leaf:
    # 2 - 16/3 = -10/3; a branch: 7 - 16/3 = 5/3. A tool result gets 0.
    advantages, mask = output["advantages"], output["completion_mask"] * tool_mask
    for row in (0, 1):
        expected = torch.zeros(advantages.size(1))
        expected[36:59] = -10 / 3
        assert torch.allclose(advantages[row], expected * mask[row], atol=1e-6)
    width = len(encode(tokenizer, branch))
    for row in range(2, 6):
        assert torch.allclose(advantages[row, :width], torch.full((width,), 5 / 3) * tool_mask[row, :width],
                              atol=1e-6)
        assert torch.all(advantages[row][tool_mask[row] == 0] == 0)
    # The leaves' texts (Cue-GRPO's cues on the trees) are the model's: the assistant turns of each leaf's messages,
    # without the tool results "2" and "7" (the model wrote "step": 2 and 5 inside its tool calls, which TRL's parser
    # moved out of the text into tool_calls)
    from trl_credit.datpo.credit import tree_leaves

    texts = [text for text, _ in tree_leaves(steps[0].context, trees).local_texts.values()]
    assert len(texts) == 6 and all("The counter is two now" in text for text in texts)
    assert not any("2" in text or "7" in text or "tool_response" in text for text in texts), texts
    # TRL's batch environments are the base rollouts' (untouched by the branches); every step logs the replay rate
    assert [env._counter for env in trainer.environments] == [2, 2]
    log = step_logs(trainer)[-1]
    assert log["datpo/replay_mismatch_rate"] == 0.0
    # tokens per leaf counts the model's tokens: base 45 each, branches 20 + 25 = 45 each: 6 leaves, 270 / 6
    assert log["datpo/tokens_per_leaf"] == pytest.approx(45.0)
    # leaf length: base 45; a branch leaf's prefix holds 22 model tokens, so 22 + 45 = 67: (2 * 45 + 4 * 67) / 6
    assert log["datpo/leaf_length"] == pytest.approx((2 * 45 + 4 * 67) / 6)


def test_a_fork_in_the_first_turn_continues_it_with_tools(tiny_tool_model_path, tokenizer, tmp_path):
    # Base rollout: PLAIN (23) + CALL (20) = turn 1, the tool span of "2" (14), DONE (4): L_m = 47 -> model token
    # 47 // 2 = 23 -> f = 23, right after "Step three." (turn 1 in progress). The branch continues turn 1 with
    # increment(5): the stateless tool runs (5), then DONE. The base rollouts' own calls ran first: [2, 2].
    CALLS.clear()
    trainer, steps, script = train(tiny_tool_model_path, tmp_path, tokenizer, PLAIN + CALL, DONE,
                                   reward_funcs=tool_results, tools=[increment])
    output, trees = steps[0].output, steps[0].record.payload(TreeBatch)
    assert trees.forks == [[23], [23]]
    assert CALLS == [2, 2, 5, 5, 5, 5]
    for row in range(2, 6):
        assert row_text(tokenizer, output, row) == CONTINUATION + TOOL_SPAN.format(result="5") + DONE
        assert row_text(tokenizer, output, row, 1 - output["tool_mask"]) == TOOL_SPAN.format(result="5")
    # the reward reads the whole leaf (prefix messages + branch messages): the branch's tool result 5; the base's 2
    assert trees.branch_rewards == [5.0] * 4 and trees.base_rewards == [2.0, 2.0]
    # the branch generation rows continued the turn in progress ("continuation"), then answered after the tool
    kinds = [kind for call in script.calls for kind, _ in call]
    assert kinds == ["first_turn"] * 2 + ["after_tool"] * 2 + ["continuation"] * 4 + ["after_tool"] * 4


@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_a_replay_mismatch_skips_the_fork_with_a_warning_and_a_rate(tiny_tool_model_path, tokenizer, tmp_path):
    # The base rollouts' increment(2) answered 100 * k + 2; the branch environments' replay (reset again: another
    # start) answers otherwise, so every fork is skipped: no branch rows, rate 1 each step, one warning.
    DriftingCounter.resets = 0
    with pytest.warns(UserWarning, match="replaying the base rollout's tool calls") as warned:
        trainer, steps, _ = train(tiny_tool_model_path, tmp_path, tokenizer, CALL, LONG, reward_funcs=tool_results,
                                  environment_factory=DriftingCounter, max_steps=2)
    assert sum("replaying the base rollout's tool calls" in str(w.message) for w in warned) == 1
    assert [log["datpo/replay_mismatch_rate"] for log in step_logs(trainer)] == [1.0, 1.0]
    for step in steps:
        trees = step.record.payload(TreeBatch)
        assert trees.forks == [[], []] and trees.branch_ids == []
        assert step.output["completion_ids"].size(0) == 2  # the base rows only


# ---------------------------------------------------------------------------------------------------- two processes
def _environment_run(model_path, out_dir, nproc):
    import json

    from tests.mp import run_torchrun

    os.makedirs(out_dir)
    run_torchrun("tests/mp_scripts/datpo_environment_two_processes.py", model_path, out_dir, nproc=nproc,
                 timeout=600)
    reports = [json.load(open(os.path.join(out_dir, f"result_{rank}.json"))) for rank in range(nproc)]
    assert all(report["world"] == nproc and report["steps"] == 1 for report in reports)
    assert all(report["logs"] == reports[0]["logs"] for report in reports)  # metrics over the global batch
    rows = [record[2:] for report in reports for record in report["records"] if record[0] != "counters"]
    counters = [n for report in reports for record in report["records"] if record[0] == "counters"
                for n in record[1]]
    return rows, counters, reports[0]["logs"]


@pytest.mark.multiprocess
def test_environment_trees_in_two_processes_match_one(tiny_tool_model_path, tmp_path):
    """One prompt of 4 base rollouts, split 2 and 2 over two processes: the same rows (each process its base rows, then
    the branches of its forks, whichever process generated their continuations), masks, advantages, environment
    states and metrics as in one process. Per base rollout as in the single-process test: fork 36, 2 branches
    (CONTINUATION, the tool result 7 of the replayed environment, LONG); leaves 2 (base) and 7 (branches): V(root) =
    (4·2 + 8·7) / 12 = 16/3 = V(fork) = (2 + 7 + 7) / 3, so a base row's tokens after the fork get 2 − 16/3 = −10/3, a
    branch's 7 − 16/3 = 5/3, the tokens before the fork 0, a tool result 0."""
    rows_two, counters_two, logs_two = _environment_run(tiny_tool_model_path, str(tmp_path / "two"), 2)
    rows_one, counters_one, logs_one = _environment_run(tiny_tool_model_path, str(tmp_path / "one"), 1)
    base_text, branch_text = CALL + TOOL_SPAN.format(result="2") + LONG, CONTINUATION + TOOL_SPAN.format(
        result="7") + LONG
    # one process: 4 base rows then 8 branches; two: per process 2 base rows then its 4 branches
    assert [text for text, _, _ in rows_one] == [base_text] * 4 + [branch_text] * 8
    assert [text for text, _, _ in rows_two] == ([base_text] * 2 + [branch_text] * 4) * 2
    assert sorted(map(str, rows_two)) == sorted(map(str, rows_one))
    for text, tool_mask, advantages in rows_one:
        expected = [0.0 if not m else (-10 / 3 if text == base_text else 5 / 3) for m in tool_mask]
        if text == base_text:
            expected[:36] = [0.0] * 36  # the block root -> fork: V(fork) − V(root) = 0
        assert advantages == pytest.approx(expected, abs=1e-5)
    assert counters_two == counters_one == [2, 2, 2, 2]
    assert logs_two == pytest.approx(logs_one, rel=1e-6)
    assert logs_one[0]["datpo/replay_mismatch_rate"] == 0.0 and logs_one[0]["datpo/branch_reward"] == 7.0


# ---------------------------------------------------------------------------------------------------- lockstep
class _OtherProcess:
    """The accelerator of process 0 of 2 whose process 1 is scripted: each ``gather`` returns this process's value
    and process 1's next one (``others``), as a gather across the two would."""

    num_processes, device = 2, "cpu"

    def __init__(self, others):
        self.others = list(others)
        self.mine = []

    def gather(self, tensor):
        self.mine.append(int(tensor.item()))
        return torch.tensor([int(tensor.item()), self.others.pop(0)])


def test_lockstep_pads_every_call_and_joins_the_calls_of_a_process_still_running():
    # TRL's tool loop on this process makes one call of 1 row and is done; process 1 makes 2 calls of 3 rows. Process
    # 1 gathers 4 (3 rows + 1) before each of its calls, then 0. Here: the call gathers 1 + 1 = 2 against 4 -> padded
    # to 4 - 1 = 3 rows; done, it gathers 0 against 4 -> a filler call of 3 rows; then 0 against 0 -> finished.
    from types import SimpleNamespace

    from trl_credit.core.tool_loop import Lockstep

    calls = []

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        calls.append([list(p) for p in prompt_ids])
        return [[7, len(calls)] for _ in prompt_ids], None

    trainer = SimpleNamespace(accelerator=_OtherProcess([4, 4, 0]),
                              _tokenizer=SimpleNamespace(bos_token_id=None, eos_token_id=2))
    lockstep = Lockstep(trainer)
    assert lockstep.call(generate, [[5, 6]], None, {}, 1) == ([[7, 1]], None)  # its own row only comes back
    lockstep.finish(generate)
    assert calls == [[[5, 6], [2], [2]], [[2], [2], [2]]]  # padded with the one-token filler (EOS: no BOS)
    assert trainer.accelerator.mine == [2, 0, 0]


@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_the_resumed_tool_loop_generates_through_the_lockstep(tiny_tool_model_path, tokenizer, tmp_path):
    # One process with the lockstep forced on (as with several processes): the branch
    # continuations' tool loop of the first trainer test generates through it (one gather per call, then a last 0)
    # and the rows are the same.
    from trl_credit.core import tool_loop

    seen = []
    real = tool_loop.Lockstep.call

    def counted(self, generate, prompt_ids, *args, **kwargs):
        seen.append(len(prompt_ids))
        return real(self, generate, prompt_ids, *args, **kwargs)

    with patch.object(tool_loop, "collective_generation", lambda trainer: True), \
            patch.object(tool_loop.Lockstep, "call", counted):
        _, steps, _ = train(tiny_tool_model_path, tmp_path, tokenizer, CALL, LONG, environment_factory=RewardedCounter)
    assert seen == [4]  # the 4 branches called increment(5): one round of the loop, 4 rows
    output = steps[0].output
    for row in range(2, 6):
        assert row_text(tokenizer, output, row) == CONTINUATION + TOOL_SPAN.format(result="7") + LONG
