"""DATPOTrainer end to end on the CPU with the tiny model (docs/datpo.md#algorithm).

Two prompts per step: one with an even answer, which the reward function always solves (V_root = 1: no
branches), and one with an odd answer, rewarded 0.5·(parity of the token sum of the whole response), so
V_root <= 0.5 and K̂, B̂ >= 2. Every generated sequence is recorded (base rollouts from ``_generate``, branches
from the rollout's ``generate_branches``) and the training batch is checked against a reference tree built here with
plain loops from those records (paper Eq. 3 / Eq. 7 with V = mean leaf reward under the node).
"""

import math

import pytest
import torch
from datasets import Dataset

from trl_credit import DATPOConfig, DATPOTrainer
from trl_credit.core.context import hook_context
from trl_credit.datpo import split_rows
from trl_credit.tasks.data import make_arithmetic_dataset


def prompt_keyed_reward(completions, answer, completion_ids, **kwargs):
    return [1.0 if int(a) % 2 == 0 else 0.5 * (sum(ids) % 2) for a, ids in zip(answer, completion_ids)]


def two_prompt_dataset():
    rows = make_arithmetic_dataset(num_train=16, num_test=2, seed=0)["train"]
    even = next(r for r in rows if int(r["answer"]) % 2 == 0)
    odd = next(r for r in rows if int(r["answer"]) % 2 == 1)
    return Dataset.from_list([even, odd])


class RecordingDATPOTrainer(DATPOTrainer):
    def __init__(self, *args, **kwargs):
        self.records = []
        super().__init__(*args, **kwargs)
        generate_branches = self.rollout.generate_branches

        def recording(ctx, fork_requests):  # the Trees rollout's phase-2 call
            completions, logprobs = generate_branches(ctx, fork_requests)
            self.records[-1]["branches"].extend(list(map(list, completions)))
            return completions, logprobs

        self.rollout.generate_branches = recording

    def _generate(self, prompts):
        result = super()._generate(prompts)
        if self.model.training:
            self.records.append({"base_prompts": [list(p) for p in result[0]],
                                 "base": [list(c) for c in result[1]], "branches": []})
        return result

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self.records[-1]["answers"] = [x["answer"] for x in inputs]
            self.records[-1]["batch"] = {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in output.items()}
            self.records[-1]["alpha"] = self._diversity_alpha()
        return output


def reference_advantages(record):
    """Plain-loop reference: rows of the batch -> expected per-token A_base (subtree V), and checks of the layout."""
    batch = record["batch"]
    base_prompts, base, answers = record["base_prompts"], record["base"], record["answers"]
    rows = []
    for r in range(batch["completion_ids"].size(0)):
        prompt = batch["prompt_ids"][r][batch["prompt_mask"][r].bool()].tolist()
        completion = batch["completion_ids"][r][batch["completion_mask"][r].bool()].tolist()
        rows.append((prompt, completion))
    n_base = len(base)
    # base rows come first, in generation order, with their full completion
    assert [c for _, c in rows[:n_base]] == base
    assert [p for p, _ in rows[:n_base]] == base_prompts
    # branch rows: prompt = base prompt + a non-empty proper prefix of that base rollout
    forks = {i: set() for i in range(n_base)}
    branch_of = []
    for prompt, completion in rows[n_base:]:
        owners = [
            i for i in range(n_base)
            if prompt[: len(base_prompts[i])] == base_prompts[i]
            and 1 <= len(prompt) - len(base_prompts[i]) < len(base[i])
            and prompt[len(base_prompts[i]):] == base[i][: len(prompt) - len(base_prompts[i])]
        ]
        assert owners, "branch prompt is not prompt + prefix of a base rollout"
        # identical prefixes can occur in several base rows of a group only if the rows share them; pick the first
        i = owners[0]
        f = len(prompt) - len(base_prompts[i])
        forks[i].add(f)
        branch_of.append((i, f, completion))
    # every generated token exactly once: base completions + recorded branches == the batch's completions
    assert sorted(map(tuple, [c for _, c in rows[n_base:]])) == sorted(map(tuple, record["branches"]))
    assert int(batch["num_items_in_batch"]) == sum(map(len, base)) + sum(map(len, record["branches"]))

    def reward(i, response):
        return prompt_keyed_reward(None, [answers[i]], [response])[0]

    groups = {}
    for i in range(n_base):
        groups.setdefault(tuple(base_prompts[i]), []).append(i)
    expected = [None] * len(rows)
    for members in groups.values():
        leaves_under = {}  # node -> leaf rewards; node = "root" or (row, f)
        all_leaves = []
        for i in members:
            r_base = reward(i, base[i])
            all_leaves.append(r_base)
            for f in forks[i]:
                leaves_under[(i, f)] = [r_base]
        for i, f, completion in branch_of:
            if i not in members:
                continue
            r = reward(i, base[i][:f] + completion)
            all_leaves.append(r)
            for g in forks[i]:
                if g <= f:  # a branch at f lies under f and under every earlier fork of its base rollout
                    leaves_under[(i, g)].append(r)
        value = {node: sum(v) / len(v) for node, v in leaves_under.items()}
        value["root"] = sum(all_leaves) / len(all_leaves)
        for i in members:
            cuts = [0, *sorted(forks[i]), len(base[i])]
            nodes = ["root", *[(i, f) for f in sorted(forks[i])]]
            per_token = []
            for j, node in enumerate(nodes):
                end_value = value[nodes[j + 1]] if j + 1 < len(nodes) else reward(i, base[i])  # r + V(terminal)=0
                per_token += [end_value - value[node]] * (cuts[j + 1] - cuts[j])
            expected[i] = per_token
        for n, (i, f, completion) in enumerate(branch_of):
            if i in members:
                expected[n_base + n] = [reward(i, base[i][:f] + completion) - value[(i, f)]] * len(completion)
    return expected


def _train(tiny_model_path, tmp_path, monkeypatch, **overrides):
    trainer_box = {}
    config = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=10,
        max_steps=2, learning_rate=1e-2, report_to="none", logging_steps=1, use_cpu=True, save_strategy="no",
        fork_method="tok_entropy", seed=3,
    )
    config.update(overrides)
    trainer = RecordingDATPOTrainer(
        model=tiny_model_path, reward_funcs=prompt_keyed_reward, args=DATPOConfig(**config),
        train_dataset=two_prompt_dataset(), **trainer_box,
    )
    trainer.train()
    return trainer


def test_tree_batch_matches_reference_and_trains(tiny_model_path, tmp_path, monkeypatch):
    trainer = _train(tiny_model_path, tmp_path, monkeypatch, use_diversity=False)
    assert trainer.state.global_step == 2
    assert len(trainer.records) == 2
    for record in trainer.records:
        expected = reference_advantages(record)
        batch = record["batch"]
        assert batch["advantages"].shape == batch["completion_ids"].shape  # (B, T) for every row
        for r, values in enumerate(expected):
            got = batch["advantages"][r][batch["completion_mask"][r].bool()].tolist()
            assert got == pytest.approx(values, abs=1e-6)
        # the solved prompt (even answer) has V_root = 1: no branches, all its advantages 0
        solved = [i for i, a in enumerate(record["answers"]) if int(a) % 2 == 0]
        assert all(not any(expected[i]) for i in solved)
        assert len(record["branches"]) >= 4 * 2  # the odd prompt: K̂, B̂ >= 2 on (almost) every base rollout
    logs = [log for log in trainer.state.log_history if "datpo/leaves_per_prompt" in log]
    assert len(logs) == 2
    for log, record in zip(logs, trainer.records):
        # 2 prompts: 8 base leaves + every branch
        assert log["datpo/leaves_per_prompt"] == pytest.approx((8 + len(record["branches"])) / 2)
        assert log["datpo/b_hat"] >= 1.0 and log["datpo/k_hat"] >= 1.0  # (0 + >=2) / 2
        assert math.isfinite(log["loss"])


def test_diversity_bonus_only_on_positive_blocks_and_annealed(tiny_model_path, tmp_path, monkeypatch):
    from trl_credit.models import load_default_embedder

    trainer = _train(tiny_model_path, tmp_path, monkeypatch, embedding_model=None)
    assert isinstance(trainer.embedder, type(load_default_embedder()))
    first, last = trainer.records
    assert first["alpha"] == pytest.approx(0.2) and last["alpha"] == pytest.approx(0.0)  # 2-step run: 0.2 -> 0
    bonus_seen = False
    for record in trainer.records:
        expected = reference_advantages(record)
        batch = record["batch"]
        for r, values in enumerate(expected):
            got = batch["advantages"][r][batch["completion_mask"][r].bool()].tolist()
            for g, a in zip(got, values):
                if a > 1e-9:  # positive block: A + α·Div with Div in [0, 2]
                    assert a - 1e-6 <= g <= a + 2 * record["alpha"] + 1e-6
                    bonus_seen |= g > a + 1e-6
                else:
                    assert g == pytest.approx(a, abs=1e-6)
    # only the first step has α > 0; its positive blocks with siblings must receive a bonus
    has_positive = any(a > 1e-9 for row in reference_advantages(first) for a in row)
    assert bonus_seen == has_positive
    assert any("datpo/sibling_diversity" in log for log in trainer.state.log_history)


def test_split_rows_keeps_every_row_and_trims():
    batch = {
        "prompt_ids": torch.tensor([[0, 0, 5], [0, 6, 7], [0, 0, 8], [9, 9, 9], [0, 0, 1], [0, 0, 2], [0, 0, 3]]),
        "completion_ids": torch.arange(7 * 4).view(7, 4),
        "completion_mask": torch.tensor([[1, 0, 0, 0]] * 3 + [[1, 1, 1, 1]] + [[1, 1, 0, 0]] * 3),
        "advantages": torch.ones(7, 4),
        "num_items_in_batch": torch.tensor(16),
    }
    batch["prompt_mask"] = (batch["prompt_ids"] > 0).long()
    chunks = split_rows(batch, 3)
    assert [c["completion_ids"].size(0) for c in chunks] == [3, 2, 2]  # 7 = 3 + 2 + 2, nothing dropped
    assert torch.equal(torch.cat([c["completion_ids"][:, :1] for c in chunks]), batch["completion_ids"][:, :1])
    # chunk 0 = rows 0-2: longest prompt 2 tokens (row 1), longest completion 1 token
    assert chunks[0]["prompt_ids"].tolist() == [[0, 5], [6, 7], [0, 8]]
    assert chunks[0]["completion_ids"].shape == (3, 1) and chunks[0]["advantages"].shape == (3, 1)
    assert chunks[1]["completion_ids"].shape == (2, 4)  # row 3 uses all 4 columns
    assert all(int(c["num_items_in_batch"]) == 16 for c in chunks)
    # pad_to_multiple_of=3: chunk 0 keeps 3 prompt columns (2 rounded up) and 3 completion columns (1 rounded up)
    padded = split_rows(batch, 3, pad_to_multiple_of=3)
    assert padded[0]["prompt_ids"].shape == (3, 3) and padded[0]["completion_ids"].shape == (3, 3)
    assert padded[1]["completion_ids"].shape == (2, 4)  # capped at the batch width


def test_config_validation():
    common = dict(output_dir="/tmp/datpo_cfg", use_cpu=True, report_to="none")
    config = DATPOConfig(**common)
    assert (config.num_generations, config.max_forks, config.max_branches) == (8, 3, 4)  # N: GRPOConfig's 8
    assert (config.loss_type, config.beta, config.epsilon, config.diversity_alpha) == ("dapo", 0.0, 0.2, 0.2)
    for bad, match in [
        (dict(max_forks=0), "max_forks"),
        (dict(max_branches=1.5), "max_branches"),
        (dict(fork_method="attention"), "fork_method"),
        (dict(fork_min_gap=0.1), "fork_min_gap"),
        (dict(fork_method="tok_entropy", fork_min_gap=1.0), "fork_min_gap"),
        (dict(value_estimate="mean"), "value_estimate"),
        (dict(diversity_alpha_schedule="cosine"), "diversity_alpha_schedule"),
        (dict(branch_chunk_size=0), "branch_chunk_size"),
        (dict(fork_fallback="random"), "fork_fallback"),
        (dict(fork_position="sentence_start"), "fork_position"),
        (dict(rows_per_forward=0), "rows_per_forward"),
        (dict(diversity_embedding="some"), "diversity_embedding"),
        (dict(embedding_cache_size=-1), "embedding_cache_size"),
    ]:
        with pytest.raises(ValueError, match=match):
            DATPOConfig(**common, **bad)


def test_trainer_refuses_plain_grpo_config_and_tools(tiny_model_path, tmp_path):
    from trl import GRPOConfig

    with pytest.raises(TypeError, match="DATPOConfig"):
        DATPOTrainer(model=tiny_model_path, reward_funcs=prompt_keyed_reward,
                     args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none"),
                     train_dataset=two_prompt_dataset())
    with pytest.raises(ValueError, match="use_diversity"):
        DATPOTrainer(model=tiny_model_path, reward_funcs=prompt_keyed_reward,
                     args=DATPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", use_diversity=False),
                     train_dataset=two_prompt_dataset(), embedder=object())


class CapturingDATPOTrainer(DATPOTrainer):
    """Keeps each generation batch and the log-probs of its rows recomputed right away (weights unchanged)."""

    def __init__(self, *args, **kwargs):
        self.checks = []
        super().__init__(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
            with torch.no_grad():
                policy, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention, output["completion_ids"].size(1))
                reference, _, _ = self._get_per_token_logps_and_entropies(
                    self.ref_model, input_ids, attention, output["completion_ids"].size(1))
            self.checks.append((output, policy, reference, len(inputs)))
        return output


def test_old_and_ref_logps_cover_branch_rows(tiny_model_path, tmp_path):
    # num_iterations = 2 makes TRL keep old log-probs; beta > 0 makes it compute reference log-probs. Both must be
    # there for the branch rows too, aligned token by token.
    args = DATPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
        max_steps=2, num_iterations=2, beta=0.1, learning_rate=1e-2, report_to="none", use_cpu=True,
        save_strategy="no", fork_method="fixed_seg", use_diversity=False, seed=1,
    )
    trainer = CapturingDATPOTrainer(model=tiny_model_path, reward_funcs=prompt_keyed_reward, args=args,
                                    train_dataset=two_prompt_dataset())
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(trainer.checks) == 1  # generated once, reused for the second iteration
    output, policy, reference, n_base = trainer.checks[0]
    mask = output["completion_mask"].bool()
    assert output["completion_ids"].size(0) > n_base  # there are branch rows
    torch.testing.assert_close(output["old_per_token_logps"][mask], policy[mask], atol=5e-3, rtol=1e-3)  # batching/padding float noise; a misaligned row is off by ~1
    torch.testing.assert_close(output["ref_per_token_logps"][mask], reference[mask], atol=5e-3, rtol=1e-3)  # batching/padding float noise; a misaligned row is off by ~1


SENTENCES = "First, we add 3 and 4. Then we check 7 - 4 = 3. So the answer is \\boxed{7}."


class ScriptedDATPOTrainer(DATPOTrainer):
    """Base rollouts are a fixed three-sentence text (branches: the tiny model's own samples)."""

    def __init__(self, *args, **kwargs):
        self.batches = []
        super().__init__(*args, **kwargs)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not self._datpo_branching:
            ids = self._tokenizer(SENTENCES, add_special_tokens=False)["input_ids"] + [self._tokenizer.eos_token_id]
            return [list(ids) for _ in prompt_ids], None
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.batches.append((output, len(inputs)))
        return output


def test_sentence_entropy_forks_at_sentence_starts(tiny_model_path, tiny_tokenizer, tmp_path):
    ids = tiny_tokenizer(SENTENCES, add_special_tokens=False)["input_ids"]
    # independent reference: the tokens holding the first letters of "Then" and "So"
    starts = []
    for word in ("Then", "So"):
        char = SENTENCES.index(word)
        starts.append(next(k for k in range(len(ids)) if len(tiny_tokenizer.decode(ids[: k + 1])) > char))
    args = DATPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
        max_steps=1, report_to="none", use_cpu=True, save_strategy="no", use_diversity=False,
    )
    # reward 0 everywhere: V_root = 0, K̂ = 3, B̂ = 4; 3 sentences, so 3 forks per rollout, each branching after
    # its sentence's first token (paper Alg. 1/3: prefix τ_{1:f}; tests/test_datpo_fork_position.py has the values)
    trainer = ScriptedDATPOTrainer(model=tiny_model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                                   args=args, train_dataset=two_prompt_dataset())
    trainer.train()
    output, n_base = trainer.batches[0]
    prompt_len = int(output["prompt_mask"][0].sum())
    prefix_lengths = [int(output["prompt_mask"][r].sum()) - prompt_len for r in range(n_base, output["prompt_ids"].size(0))]
    # 4 branches after the first token of each of the 3 sentences (the first starts at token 0)
    assert sorted(prefix_lengths) == sorted([s + 1 for s in [0, *starts]] * 4 * n_base)


def test_sorting_rows_by_length_cuts_padding_of_forward_pieces():
    from trl_credit.datpo import sort_rows_by_length

    # 4 rows, completion lengths 1, 6, 1, 6 (prompts 1 token): two pieces of 2 rows
    lengths = [1, 6, 1, 6]
    batch = {
        "prompt_ids": torch.ones(4, 1, dtype=torch.long), "prompt_mask": torch.ones(4, 1, dtype=torch.long),
        "completion_ids": torch.arange(24).view(4, 6),
        "completion_mask": torch.tensor([[1] * n + [0] * (6 - n) for n in lengths]),
        "advantages": torch.arange(4.0).view(4, 1).expand(4, 6).clone(),
        "num_items_in_batch": torch.tensor(14),
    }

    def padded_tokens(pieces):
        return sum(p["completion_ids"].numel() for p in pieces)

    unsorted = split_rows(batch, 2)
    ordered = split_rows(sort_rows_by_length(batch), 2)
    # unsorted: each piece holds a 6-token row -> 2·6 + 2·6 = 24 slots; sorted: 2·1 + 2·6 = 14 (no padding)
    assert padded_tokens(unsorted) == 24 and padded_tokens(ordered) == 14
    # rows move together with their advantages
    first = ordered[0]
    assert first["advantages"][:, 0].tolist() == [0.0, 2.0] and first["completion_ids"][:, 0].tolist() == [0, 12]


def test_branches_of_a_fork_are_one_run_of_one_call(tiny_model_path, tmp_path):
    # forks (prefix, B̂, budget): B̂ = 2, 3, 2 with branch_chunk_size = 4 -> one call for the two B̂ = 2 forks (4 rows,
    # num_generations = 2; the larger budget first, the call runs with it: 3 new tokens) and one for the B̂ = 3 fork
    # (3 rows, num_generations = 3, 10 new tokens); results in fork order, each cut to its own fork's budget
    args = DATPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, report_to="none",
                       use_cpu=True, use_diversity=False, branch_chunk_size=4)
    trainer = DATPOTrainer(model=tiny_model_path, reward_funcs=prompt_keyed_reward, args=args,
                           train_dataset=two_prompt_dataset())
    calls = []

    def fake_generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        calls.append(([list(p) for p in prompt_ids], num_generations, trainer.generation_config.max_new_tokens))
        return [[p[-1], len(calls), k] for k, p in enumerate(prompt_ids)], None

    trainer._generate_single_turn = fake_generate
    ids, logprobs = trainer.rollout.generate_branches(hook_context(trainer), [([5, 6, 7], 2, 2), ([5, 8], 3, 10), ([9], 2, 3)])
    assert calls == [([[9], [9], [5, 6, 7], [5, 6, 7]], 2, 3), ([[5, 8]] * 3, 3, 10)]
    assert ids == [[7, 1], [7, 1], [8, 2, 0], [8, 2, 1], [8, 2, 2], [9, 1, 0], [9, 1, 1]]
    assert logprobs is None



def test_branch_calls_split_where_the_budget_halves(tiny_model_path, tmp_path):
    # one B̂ = 1, budgets 10, 6, 4 and no chunk size: 6 >= 10/2 shares the 10-token call, 4 < 10/2 gets its own call
    args = DATPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, report_to="none",
                       use_cpu=True, use_diversity=False)
    trainer = DATPOTrainer(model=tiny_model_path, reward_funcs=prompt_keyed_reward, args=args,
                           train_dataset=two_prompt_dataset())
    calls = []

    def fake_generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        budget = trainer.generation_config.max_new_tokens
        calls.append(([list(p) for p in prompt_ids], budget))
        return [[p[-1]] * budget for p in prompt_ids], None

    trainer._generate_single_turn = fake_generate
    trainer.model.train()  # metrics of a training step
    ids, _ = trainer.rollout.generate_branches(hook_context(trainer), [([4], 1, 4), ([10], 1, 10), ([6], 1, 6)])
    assert calls == [([[10], [6]], 10), ([[4]], 4)]
    assert ids == [[4] * 4, [10] * 10, [6] * 6]
    # the sampler really generated 4 tokens past the 6-token fork's budget (as vLLM does): 4 of 10 + 10 + 4
    assert trainer._metrics["train"]["datpo/branch_tokens_past_budget"] == [pytest.approx(4 / 24)]


def test_hf_padding_is_not_counted_as_tokens_past_budget(tiny_model_path, tiny_tokenizer, tmp_path):
    # HF generate: two forks of budgets 8 and 5 share one 8-token call; each row stops at its own budget and
    # generate pads the 5-token rows to the call's length. Those pads were never generated: nothing ran past a
    # budget, so the metric is 0 (EOS suppressed, so every row runs to its budget).
    args = DATPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, report_to="none",
                       use_cpu=True, use_diversity=False,
                       generation_kwargs={"suppress_tokens": [tiny_tokenizer.eos_token_id]})
    trainer = DATPOTrainer(model=tiny_model_path, reward_funcs=prompt_keyed_reward, args=args,
                           train_dataset=two_prompt_dataset())
    prefix = tiny_tokenizer("What is 3 + 4?", add_special_tokens=False)["input_ids"]
    trainer.model.train()  # metrics of a training step
    ids, _ = trainer.rollout.generate_branches(hook_context(trainer), [(prefix, 2, 8), (prefix[:-1], 2, 5)])
    assert [len(row) for row in ids] == [8, 8, 5, 5]  # every row cut to (and reaching) its own budget
    assert trainer._metrics["train"]["datpo/branch_tokens_past_budget"] == [0.0]

@pytest.mark.parametrize("branch_budget", ["remaining", "full"])
def test_branch_budget_bounds_the_leaf_length(tiny_model_path, tmp_path, branch_budget):
    # reward 0 everywhere: every prompt branches (K̂ = 3, B̂ = 4) from tok_entropy forks. The tiny model rarely ends
    # early, so its branches run to their budget: "remaining" keeps every leaf (prefix + branch) within
    # max_completion_length = 8 and some reach it; "full" gives branches 8 new tokens, so leaves exceed it.
    args = DATPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
        max_steps=1, report_to="none", use_cpu=True, save_strategy="no", use_diversity=False,
        fork_method="tok_entropy", branch_budget=branch_budget,
    )
    trainer = BatchKeepingDATPOTrainer(model=tiny_model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                                    args=args, train_dataset=two_prompt_dataset())
    trainer.train()
    output, n_base = trainer.batches[0]
    prompt_len = int(output["prompt_mask"][0].sum())
    leaves = [
        int(output["prompt_mask"][r].sum()) - prompt_len + int(output["completion_mask"][r].sum())
        for r in range(n_base, output["prompt_ids"].size(0))
    ]
    branches = [int(output["completion_mask"][r].sum()) for r in range(n_base, output["prompt_ids"].size(0))]
    assert leaves
    if branch_budget == "remaining":
        assert max(leaves) == 8
    else:
        assert max(leaves) > 8 and max(branches) == 8


class BatchKeepingDATPOTrainer(DATPOTrainer):
    def __init__(self, *args, **kwargs):
        self.batches = []
        super().__init__(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.batches.append((output, len(inputs)))
        return output


class EntropySpyDATPOTrainer(DATPOTrainer):
    """Keeps the entropies recorded during generation and those of the extra forward pass over the same rollouts."""

    def __init__(self, *args, **kwargs):
        self.entropy_pairs = []
        super().__init__(*args, **kwargs)
        grow = self.rollout.grow

        def spying(ctx, inputs, prompt_ids_list, completion_ids_list, rewards_per_func):  # after phase 1
            from trl_credit.core.scoring import pad_rows, score_completions

            sampled = ctx.scratch(self.rollout).get("sampled_entropies")
            p_ids, p_mask, c_ids, c_mask = pad_rows(
                prompt_ids_list, completion_ids_list, self._tokenizer.pad_token_id, self.accelerator.device
            )
            _, forward = score_completions(self, self.model, p_ids, p_mask, c_ids, c_mask, compute_entropy=True)
            self.entropy_pairs.append(
                (sampled, [forward[i, : len(c)].tolist() for i, c in enumerate(completion_ids_list)])
            )
            return grow(ctx, inputs, prompt_ids_list, completion_ids_list, rewards_per_func)

        self.rollout.grow = spying


def _entropy_run(tmp_path, tiny_model_path, lora=False):
    peft_config = None
    if lora:  # generate runs through the PEFT wrapper; the recorder hooks the base causal LM, adapters included
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    args = DATPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
        max_steps=1, report_to="none", use_cpu=True, save_strategy="no", use_diversity=False, temperature=0.7,
        fork_method="tok_entropy", logging_steps=1,
    )
    trainer = EntropySpyDATPOTrainer(model=tiny_model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                                     args=args, train_dataset=two_prompt_dataset(), peft_config=peft_config)
    trainer.train()
    return trainer


@pytest.mark.parametrize("lora", [False, True])
def test_fork_entropies_recorded_by_the_sampler_equal_the_extra_forward(tiny_model_path, tmp_path, lora):
    trainer = _entropy_run(tmp_path, tiny_model_path, lora=lora)
    (sampled, forward), = trainer.entropy_pairs
    assert sampled is not None and [len(r) for r in sampled] == [len(r) for r in forward]
    # same distributions up to float32 accumulation order (cached decoding vs one full forward): entropies ~6 nats
    # agree to ~1e-6 relative without adapters, ~6e-6 with random LoRA adapters
    for got, want in zip(sampled, forward):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
    log = next(log for log in trainer.state.log_history if "datpo/entropy_from_sampler" in log)
    assert log["datpo/entropy_from_sampler"] == 1.0


def test_fork_entropies_fall_back_to_the_forward_when_the_record_does_not_line_up(
    tiny_model_path, tmp_path, monkeypatch
):
    from trl_credit.core.scoring import score_completions as original
    from trl_credit.generation.hooks import GenerationRecorder

    monkeypatch.setattr(GenerationRecorder, "entropies", lambda self, completion_ids: None)
    passes = []

    def counting(trainer, *args, **kwargs):
        passes.append(kwargs.get("compute_entropy", False))
        return original(trainer, *args, **kwargs)

    monkeypatch.setattr("trl_credit.core.scoring.score_completions", counting)  # the pass behind ctx.logprobs
    trainer = _entropy_run(tmp_path, tiny_model_path)
    assert True in passes  # the trainer's own entropy pass ran
    log = next(log for log in trainer.state.log_history if "datpo/entropy_from_sampler" in log)
    assert log["datpo/entropy_from_sampler"] == 0.0


class CountingEmbedder:
    """The packaged embedder behind ``encode``, counting the texts it is given (no tokenizer attribute: each step's
    texts go to ``encode`` in one call)."""

    def __init__(self, model):
        self.model, self.texts = model, []

    def encode(self, texts, **kwargs):
        self.texts.extend(texts)
        return self.model.encode(texts, **kwargs)


def test_gated_embedding_gives_the_same_advantages_from_fewer_texts(tiny_model_path, tmp_path):
    """diversity_embedding="gated" embeds only the sibling groups with a block that gets the bonus: the advantages
    and losses are those of embedding every group (Div of an ungated group is multiplied by a zero gate)."""
    from trl_credit.models import load_default_embedder

    model = load_default_embedder(device="cpu")
    runs = {}
    for mode in ("all", "gated"):
        embedder = CountingEmbedder(model)
        config = DATPOConfig(
            output_dir=str(tmp_path / mode), per_device_train_batch_size=8, num_generations=4, max_completion_length=10,
            max_steps=2, learning_rate=1e-2, report_to="none", logging_steps=1, use_cpu=True, save_strategy="no",
            fork_method="tok_entropy", seed=3, diversity_embedding=mode, embedding_cache_size=0,
        )
        trainer = RecordingDATPOTrainer(model=tiny_model_path, reward_funcs=prompt_keyed_reward, args=config,
                                        train_dataset=two_prompt_dataset(), embedder=embedder)
        trainer.train()
        runs[mode] = (trainer, embedder.texts)
    (full, full_texts), (gated, gated_texts) = runs["all"], runs["gated"]
    # fewer texts: some fork's siblings all scored alike (no A_base > 0 among them), e.g. 110 of 115 on this run
    assert set(gated_texts) <= set(full_texts) and len(gated_texts) < len(full_texts)
    assert full.records[0]["alpha"] > 0  # the first step's bonus reaches the advantages
    assert bool(full.records[0]["batch"]["datpo_diversity_bonus"].abs().max() > 0)  # and some block has one
    for a, b in zip(full.records, gated.records):
        assert torch.equal(a["batch"]["completion_ids"], b["batch"]["completion_ids"])
        for key in ("advantages", "datpo_diversity_bonus"):
            torch.testing.assert_close(a["batch"][key], b["batch"][key], rtol=0, atol=1e-6)
    losses = [[log["loss"] for log in t.state.log_history if "loss" in log] for t in (full, gated)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-7)
