"""SRPOTrainer end to end on the CPU with the tiny model (docs/srpo.md): rollout layout, reset states, loss masks,
sub-group advantages, fallback, SRPO localization wiring, metrics. Expected values come from the recorded
generations and the test's own reward arithmetic, never from the trainer's internals."""

import statistics

import pytest
import torch

from trl_credit import SRPOConfig, SRPOTrainer
from trl_credit.core.context import BatchContext
from trl_credit.core.steps import reset_prefix_length, split_thoughts
from trl_credit.tasks.rewards import completion_text

TEMPLATE = "Q: {question}"
SHORT_LOCALIZATION = "P: {question}\n{steps}\nFirst wrong step (1 to {num_steps})?"
NUM_BASE, NUM_SUFFIXES, PER_ROUND = 4, 4, 2


def parity_reward(completions, **kwargs):
    # Correct (1.0) when the text length is odd: about half the random rollouts fail, so seeds exist.
    return [float(len(completion_text(c)) % 2) for c in completions]


def always_correct_reward(completions, **kwargs):
    # >= success_threshold (1.0) for every rollout: no incorrect seed ever, yet the base group has variance.
    return [1.0 + 0.5 * (len(completion_text(c)) % 2) for c in completions]


class RecordingSRPOTrainer(SRPOTrainer):
    """Keeps each step's output and the generation calls made while producing it."""

    calls: list

    def _generate_and_score_completions(self, inputs):
        start = len(self.calls)
        output = super()._generate_and_score_completions(inputs)
        self.records.append(
            {
                "inputs": inputs,
                "output": {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in output.items()},
                "calls": self.calls[start:],
            }
        )
        return output


@pytest.fixture
def generation_log(monkeypatch):
    calls = []
    real = BatchContext.generate
    state = {"localization_answer": None}

    def recording(ctx, prefix_ids, **kwargs):
        if kwargs.get("greedy") and state["localization_answer"] is not None:
            answer = ctx.processing_class.encode(state["localization_answer"], add_special_tokens=False)
            completions, logprobs = [list(answer) for _ in prefix_ids], None
        else:
            completions, logprobs = real(ctx, prefix_ids, **kwargs)
        calls.append({"rows": [list(r) for r in prefix_ids], "kwargs": kwargs, "completions": [list(c) for c in completions]})
        return completions, logprobs

    # every generation SRPO makes (seeds, suffixes, the localization call) goes through the batch's context
    monkeypatch.setattr(BatchContext, "generate", recording)
    return calls, state


def make_trainer(model_path, dataset, tmp_path, calls, reward=parity_reward, **overrides):
    settings = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=16,  # two prompts of num_generations = 8 rows
        num_generations=8,
        reset_groups=1,
        suffixes_per_reset=NUM_SUFFIXES,
        seed_candidates_per_round=PER_ROUND,
        max_seed_rounds=3,
        max_completion_length=12,
        max_steps=2,
        learning_rate=1e-2,
        thought_delimiter=" ",
        rollout_template=TEMPLATE,
        localization_template=SHORT_LOCALIZATION,
        localization_max_tokens=6,
        # The paper's localization (decoded answer, uniform draw when unparsed): these tests drive it through
        # `localization_answer`; the scored choice has its own tests (tests/test_srpo_localization.py).
        localization="generate",
        localization_fallback="random",
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    settings.update(overrides)
    trainer = RecordingSRPOTrainer(
        model=model_path, reward_funcs=reward, args=SRPOConfig(**settings), train_dataset=dataset
    )
    trainer.calls, trainer.records = calls, []
    return trainer


def expected_prompt_ids(tokenizer, prompt):
    messages = [dict(m) for m in prompt]
    messages[-1]["content"] = TEMPLATE.replace("{question}", messages[-1]["content"])
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])


def raw_boundaries(tokenizer, ids, delimiter):
    """Slow reference: token indices i whose last token (i - 1) holds the end of a delimiter occurrence."""
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    ends = {pos + len(delimiter) for pos in range(len(text)) if text.startswith(delimiter, pos)}
    found = set()
    for i in range(1, len(ids) + 1):
        before = len(tokenizer.decode(ids[: i - 1], skip_special_tokens=False, clean_up_tokenization_spaces=False))
        upto = len(tokenizer.decode(ids[:i], skip_special_tokens=False, clean_up_tokenization_spaces=False))
        if any(before < e <= upto for e in ends):
            found.add(i)
    return found


def text_reward(tokenizer, ids):
    return float(len(tokenizer.decode(ids, skip_special_tokens=True)) % 2)


def reference_advantages(rewards):
    # TRL convention: (r - mean) / (unbiased std + 1e-4), 0 when the group's std is 0.
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)
    return [0.0 if std == 0 else (r - mean) / (std + 1e-4) for r in rewards]


def replay_seeds(tokenizer, record, group_prompt_ids):
    """The seed of each prompt from the recorded candidate calls: the first even-length (incorrect) candidate."""
    candidate_calls = [c for c in record["calls"][:-1] if not c["kwargs"].get("greedy")]
    candidates = {g: [] for g in range(len(group_prompt_ids))}
    for call_index, call in enumerate(candidate_calls):
        for position, (row, completion) in enumerate(zip(call["rows"], call["completions"])):
            group = group_prompt_ids.index(row)
            if call_index == 0 and position % (NUM_BASE + PER_ROUND) < NUM_BASE:
                continue  # base rows of round 1 are never seeds
            candidates[group].append(completion)
    seeds = {}
    for g, rollouts in candidates.items():
        incorrect = [c for c in rollouts if text_reward(tokenizer, c) < 1.0]
        seeds[g] = incorrect[0] if incorrect else None
    return seeds, len(candidate_calls)


@pytest.mark.parametrize("reset", ["random", "self"])
def test_two_steps_rollout_layout_masks_and_advantages(reset, tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, _ = generation_log
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reset=reset)
    tokenizer = trainer.processing_class
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())

    checked_suffix_rows = 0
    for record in trainer.records:
        out, inputs = record["output"], record["inputs"]
        group_prompts = [inputs[0]["prompt"], inputs[8]["prompt"]]
        group_prompt_ids = [expected_prompt_ids(tokenizer, p) for p in group_prompts]
        # Round 1 = base group + first seed candidates of every prompt, from the wrapped prompt's ids.
        first = record["calls"][0]
        assert first["rows"] == [group_prompt_ids[0]] * 6 + [group_prompt_ids[1]] * 6
        seeds, num_candidate_calls = replay_seeds(tokenizer, record, group_prompt_ids)
        assert 1 <= num_candidate_calls <= 3
        suffix_call = record["calls"][-1]
        greedy_calls = [c for c in record["calls"] if c["kwargs"].get("greedy")]
        assert len(greedy_calls) == (1 if reset == "self" else 0)
        if greedy_calls:
            assert greedy_calls[0]["kwargs"]["max_new_tokens"] == 6

        rewards = [text_reward(tokenizer, out["completion_ids"][i][out["completion_mask"][i].bool()].tolist()) for i in range(16)]
        loss_mask = out["completion_mask"] * out["tool_mask"]
        suffix_cursor = 0
        for g in range(2):
            rows = range(8 * g, 8 * g + 8)
            assert out["prompt_ids"][8 * g][out["prompt_mask"][8 * g].bool()].tolist() == group_prompt_ids[g]
            # Base rows: the round-1 base completions, trained on every token.
            for b, row in enumerate(rows[:NUM_BASE]):
                completion = first["completions"][6 * g + b]
                assert out["completion_ids"][row][: len(completion)].tolist() == completion
                assert loss_mask[row].tolist() == out["completion_mask"][row].tolist()
                assert loss_mask[row].sum().item() == len(completion)
            seed = seeds[g]
            if seed is None:  # fallback: masked rows, zero advantage
                assert loss_mask[list(rows[NUM_BASE:])].sum().item() == 0
                assert out["advantages"][list(rows[NUM_BASE:])].abs().sum().item() == 0
            else:
                # Reset state = question ids + the seed's ids before a thought boundary (never its last thought).
                reset_row = suffix_call["rows"][suffix_cursor]
                assert reset_row[: len(group_prompt_ids[g])] == group_prompt_ids[g]
                keep = len(reset_row) - len(group_prompt_ids[g])
                assert reset_row[len(group_prompt_ids[g]) :] == seed[:keep]
                assert keep < len(seed)
                assert keep == 0 or keep in raw_boundaries(tokenizer, seed, " ")
                for s, row in enumerate(rows[NUM_BASE:]):
                    assert suffix_call["rows"][suffix_cursor + s] == reset_row
                    suffix = suffix_call["completions"][suffix_cursor + s][: 12 - keep]
                    length = out["completion_mask"][row].sum().item()
                    assert out["completion_ids"][row][:length].tolist() == seed[:keep] + suffix
                    # The loss covers exactly the suffix tokens.
                    assert loss_mask[row].tolist() == [0] * keep + [1] * len(suffix) + [0] * (loss_mask.size(1) - length)
                    checked_suffix_rows += 1
                suffix_cursor += NUM_SUFFIXES
            # Advantages: group-relative within the base group and within the shared-prefix group, separately.
            expected = reference_advantages(rewards[8 * g : 8 * g + 4])
            if seed is not None:
                expected += reference_advantages(rewards[8 * g + 4 : 8 * g + 8])
            else:
                expected += [0.0] * 4
            torch.testing.assert_close(out["advantages"][8 * g : 8 * g + 8], torch.tensor(expected), rtol=0, atol=1e-4)
        assert suffix_cursor == len(suffix_call["rows"])
    assert checked_suffix_rows > 0

    logs = [log for log in trainer.state.log_history if "srpo/fallback_rate" in log]
    assert len(logs) == 2
    for log in logs:
        assert 0.0 <= log["srpo/fallback_rate"] <= 1.0
        assert log["srpo/tokens_vs_base"] > 1.0  # seeds and suffixes cost tokens on top of the base group
        assert 0.0 < log["srpo/reset_position"] <= 1.0
        assert 0.0 <= log["srpo/correction_rate"] <= 1.0
        if reset == "random":
            assert "srpo/localization_parse_rate" not in log  # RRPO never asks the policy


def test_fallback_when_no_incorrect_seed(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, _ = generation_log
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reward=always_correct_reward, max_steps=1)
    trainer.train()
    record = trainer.records[0]
    out = record["output"]
    # All 3 seed rounds ran (nobody found a seed), then the (collective, here empty) localization and suffix calls.
    assert len(record["calls"]) == 3 + 2
    assert [len(c["rows"]) for c in record["calls"][:3]] == [12, 4, 4]  # round 1: 2 x (4 base + 2), then 2 x 2
    assert record["calls"][3]["kwargs"]["greedy"] and record["calls"][3]["rows"] == []
    assert record["calls"][4]["rows"] == []
    loss_mask = out["completion_mask"] * out["tool_mask"]
    tokenizer = trainer.processing_class
    for g in range(2):
        shared = list(range(8 * g + 4, 8 * g + 8))
        assert loss_mask[shared].sum().item() == 0
        assert out["advantages"][shared].abs().sum().item() == 0
        rewards = [
            1.0 + 0.5 * text_reward(tokenizer, out["completion_ids"][i][out["completion_mask"][i].bool()].tolist())
            for i in range(8 * g, 8 * g + 4)
        ]
        # GRPO on the base group alone.
        torch.testing.assert_close(out["advantages"][8 * g : 8 * g + 4], torch.tensor(reference_advantages(rewards)), rtol=0, atol=1e-4)
    log = next(log for log in trainer.state.log_history if "srpo/fallback_rate" in log)
    assert log["srpo/fallback_rate"] == 1.0
    assert log["srpo/seed_rounds"] == 3
    assert "srpo/correction_rate" not in log


def test_srpo_resets_at_the_localized_step(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, state = generation_log
    state["localization_answer"] = "\\boxed{2}"  # the policy "says" the first error is thought 2
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reset="self", max_steps=2)
    trainer.train()
    tokenizer = trainer.processing_class
    localized = 0
    for record in trainer.records:
        group_prompt_ids = [expected_prompt_ids(tokenizer, record["inputs"][i]["prompt"]) for i in (0, 8)]
        seeds, _ = replay_seeds(tokenizer, record, group_prompt_ids)
        greedy = [c for c in record["calls"] if c["kwargs"].get("greedy")]
        suffix_rows = record["calls"][-1]["rows"]
        cursor = 0
        for g in range(2):
            if seeds[g] is None:
                continue
            ends = split_thoughts(seeds[g], tokenizer, " ")
            expected_keep = reset_prefix_length(ends, 2) if len(ends) >= 2 else 0
            assert suffix_rows[cursor] == group_prompt_ids[g] + seeds[g][:expected_keep]
            if len(ends) >= 2:
                localized += 1
                prompt_text = tokenizer.decode(greedy[0]["rows"][0])
                assert "Step 1: " in prompt_text and "Step 2: " in prompt_text and "First wrong step" in prompt_text
            cursor += NUM_SUFFIXES
    assert localized > 0
    rates = [log["srpo/localization_parse_rate"] for log in trainer.state.log_history if "srpo/localization_parse_rate" in log]
    assert rates and all(rate == 1.0 for rate in rates)


def test_model_card_names_the_method(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, _ = generation_log
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, max_steps=1)
    trainer.create_model_card()
    card = (tmp_path / "README.md").read_text()
    assert "SRPO" in card and "2605.25507" in card


def test_config_validation(tmp_path):
    common = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=8)
    with pytest.raises(ValueError, match="reset must be"):
        SRPOConfig(reset="never", **common)
    with pytest.raises(ValueError, match="num_generations"):
        SRPOConfig(num_generations=5, suffixes_per_reset=4, **common)  # explicit 1x4: 5 - 4 = a base group of one
    with pytest.raises(ValueError, match="num_generations"):
        SRPOConfig(num_generations=8, reset_groups=3, **common)  # 3 * 4 > 8
    with pytest.raises(ValueError, match="suffixes_per_reset"):
        SRPOConfig(suffixes_per_reset=1, **common)
    with pytest.raises(ValueError, match="rollout_template"):
        SRPOConfig(rollout_template="no placeholder", **common)
    with pytest.raises(ValueError, match="localization_template"):
        SRPOConfig(localization_template="{question} only", **common)
    # (one process: TRL's own divisibility check fires first; with several processes ours names whole groups)
    with pytest.raises(ValueError, match="num_generations"):
        SRPOConfig(num_generations=8, per_device_train_batch_size=12, **{k: v for k, v in common.items() if k != "per_device_train_batch_size"})
    assert SRPOConfig(multi_objective_aggregation="normalize_then_sum", **common).reset_groups == 1  # supported
    # The paper's compute-matched splits at budget 8: 1x4 (base 4), 2x4 and 1x8 (no base group).
    assert SRPOConfig(**common).num_base_generations == 4
    assert SRPOConfig(reset_groups=2, **common).num_base_generations == 0
    assert SRPOConfig(suffixes_per_reset=8, **common).num_base_generations == 0
    config = SRPOConfig(thought_delimiter="\\n", **common)
    assert config.thought_delimiter == "\n"
    # GRPOConfig's defaults (the paper's 0.7 / 0.95 / "grpo" are in examples/recipes/srpo.yaml)
    assert (config.temperature, config.top_p, config.beta, config.loss_type) == (1.0, 1.0, 0.0, "dapo")


def test_construction_errors(tiny_model_path, tiny_dataset, tmp_path):
    args = SRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=8)
    from trl import GRPOConfig

    with pytest.raises(TypeError, match="SRPOConfig"):
        SRPOTrainer(model=tiny_model_path, reward_funcs=parity_reward, args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True),
                    train_dataset=tiny_dataset)
    with pytest.raises(ValueError, match="user message"):
        SRPOTrainer(model=tiny_model_path, reward_funcs=parity_reward, args=args,
                    train_dataset=tiny_dataset.map(lambda row: {"prompt": [{"role": "system", "content": "hi"}]}))
    with pytest.raises(ValueError, match="text-only prompts, but train_dataset has an 'image' column"):
        SRPOTrainer(model=tiny_model_path, reward_funcs=parity_reward, args=args,
                    train_dataset=tiny_dataset.add_column("image", [None] * len(tiny_dataset)))
    with pytest.raises(ValueError, match="rollout_func"):
        SRPOTrainer(model=tiny_model_path, reward_funcs=parity_reward, args=args, train_dataset=tiny_dataset,
                    rollout_func=lambda prompts, trainer: {})


def test_evaluation_uses_iid_rollouts(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, _ = generation_log
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, max_steps=1, per_device_eval_batch_size=8)
    metrics = trainer.evaluate(eval_dataset=tiny_dataset.select(range(2)))
    assert "eval_loss" in metrics
    assert calls == []  # no seeds, localization or suffixes outside training
    assert "srpo/fallback_rate" not in trainer._metrics["eval"]


def test_plain_text_prompts(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, _ = generation_log
    text_dataset = tiny_dataset.map(lambda row: {"prompt": row["prompt"][-1]["content"]})
    trainer = make_trainer(tiny_model_path, text_dataset, tmp_path, calls, max_steps=1, reset="self")
    tokenizer = trainer.processing_class
    trainer.train()
    record = trainer.records[0]
    question = record["inputs"][0]["prompt"]
    expected = tokenizer(TEMPLATE.replace("{question}", question))["input_ids"]
    assert record["calls"][0]["rows"][0] == expected  # text prompts are wrapped and tokenized without a chat template
    for call in record["calls"]:
        if call["kwargs"].get("greedy") and call["rows"]:
            assert tokenizer.decode(call["rows"][0]).startswith("P: " + question)  # plain-text localization prompt
    assert trainer.state.global_step == 1


# ---------------------------------------------------------------- success from the verifier, unscorable rows


def format_reward(completions, **kwargs):
    # A format reward every rollout satisfies: with the weighted total, every rollout would score >= 1.0.
    return [1.0 for _ in completions]


def rows_text_rewards(tokenizer, out, rows):
    return [text_reward(tokenizer, out["completion_ids"][i][out["completion_mask"][i].bool()].tolist()) for i in rows]


def step_logs(trainer):
    return [log for log in trainer.state.log_history if "srpo/fallback_rate" in log]


def test_two_rewards_success_follows_the_first_reward(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    """reward_funcs=[accuracy-like, format-like]: the weighted total is >= 1.0 for every rollout, yet seeds are the
    rollouts the first reward (parity) calls wrong, resets happen, and the pass rates follow that reward."""
    calls, _ = generation_log
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reward=[parity_reward, format_reward])
    tokenizer = trainer.processing_class
    trainer.train()
    assert trainer.state.global_step == 2
    logs = step_logs(trainer)
    assert len(logs) == 2 and min(log["srpo/fallback_rate"] for log in logs) < 1.0
    suffix_rows_seen = 0
    for record, log in zip(trainer.records, logs):
        out = record["output"]
        group_prompt_ids = [expected_prompt_ids(tokenizer, record["inputs"][i]["prompt"]) for i in (0, 8)]
        seeds, _ = replay_seeds(tokenizer, record, group_prompt_ids)
        accuracy = rows_text_rewards(tokenizer, out, range(16))
        base = [accuracy[i] for g in range(2) for i in range(8 * g, 8 * g + NUM_BASE)]
        assert log["srpo/base_pass_rate"] == pytest.approx(sum(base) / len(base))
        shared = [accuracy[i] for g in range(2) if seeds[g] is not None for i in range(8 * g + 4, 8 * g + 8)]
        if shared:
            assert log["srpo/correction_rate"] == pytest.approx(sum(shared) / len(shared))
        suffix_rows_seen += len(shared)
        for g in range(2):
            # Advantages: TRL's weighted total (accuracy + format), per sub-group.
            total = [a + 1.0 for a in accuracy[8 * g : 8 * g + 8]]
            expected = reference_advantages(total[:4]) + (reference_advantages(total[4:]) if seeds[g] else [0.0] * 4)
            torch.testing.assert_close(out["advantages"][8 * g : 8 * g + 8], torch.tensor(expected), rtol=0, atol=1e-4)
    assert suffix_rows_seen > 0


def sometimes_unscorable_reward(completions, **kwargs):
    # None (unscorable: the only reward function returns None) when the text length is a multiple of 3.
    lengths = [len(completion_text(c)) for c in completions]
    return [None if n % 3 == 0 else float(n % 2) for n in lengths]


def test_unscorable_rows_get_zero_advantage_and_stay_out_of_group_statistics(
    tiny_model_path, tiny_dataset, tmp_path, generation_log
):
    calls, _ = generation_log
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reward=sometimes_unscorable_reward,
                           max_completion_length=6)
    tokenizer = trainer.processing_class
    trainer.train()
    unscorable_seen = 0

    def reward_of(ids):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return None if len(text) % 3 == 0 else float(len(text) % 2)

    for record, log in zip(trainer.records, step_logs(trainer)):
        out = record["output"]
        rewards = [reward_of(out["completion_ids"][i][out["completion_mask"][i].bool()].tolist()) for i in range(16)]
        loss_mask = out["completion_mask"] * out["tool_mask"]
        base_scored = []
        for g in range(2):
            sub_groups = [range(8 * g, 8 * g + 4)]
            if loss_mask[8 * g + 4 : 8 * g + 8].sum() > 0:  # a reset group (not fallback rows)
                sub_groups.append(range(8 * g + 4, 8 * g + 8))
            for rows in sub_groups:
                scored = [i for i in rows if rewards[i] is not None]
                expected = dict(zip(scored, reference_advantages([rewards[i] for i in scored]))) if len(scored) > 1 else {}
                for i in rows:
                    if rewards[i] is None:
                        unscorable_seen += 1
                        assert out["advantages"][i].item() == 0.0
                    else:
                        assert out["advantages"][i].item() == pytest.approx(expected.get(i, 0.0), abs=1e-4)
            base_scored += [rewards[i] for i in range(8 * g, 8 * g + 4) if rewards[i] is not None]
        if base_scored:
            assert log["srpo/base_pass_rate"] == pytest.approx(sum(base_scored) / len(base_scored))
    assert unscorable_seen > 0


# ---------------------------------------------------------------- no silent degeneration


def test_single_thought_seeds_warn_and_are_logged(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, _ = generation_log
    # The tiny model never writes this delimiter: every seed is one thought, so every reset is at the question.
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, thought_delimiter="@@@", reset="self")
    with pytest.warns(UserWarning, match="thought_delimiter") as caught:
        trainer.train()
    assert sum("single thought" in str(w.message) for w in caught) == 1  # once, not every step
    logs = [log for log in step_logs(trainer) if "srpo/single_thought_rate" in log]
    assert logs
    for log in logs:
        assert log["srpo/single_thought_rate"] == 1.0
        assert log["srpo/reset_at_question_rate"] == 1.0
        assert log["srpo/reset_position"] == 0.0  # reset at the question, not at the last thought
        assert "srpo/localization_parse_rate" not in log  # nothing to localize in a one-thought seed
    assert all(not c["rows"] for c in calls if c["kwargs"].get("greedy"))


def test_reset_position_is_the_kept_fraction_of_thoughts(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, state = generation_log
    state["localization_answer"] = "\\boxed{2}"
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reset="self")
    tokenizer = trainer.processing_class
    trainer.train()
    for record, log in zip(trainer.records, step_logs(trainer)):
        group_prompt_ids = [expected_prompt_ids(tokenizer, record["inputs"][i]["prompt"]) for i in (0, 8)]
        seeds, _ = replay_seeds(tokenizer, record, group_prompt_ids)
        positions, at_question, single = [], [], []
        for seed in seeds.values():
            if seed is None:
                continue
            num_thoughts = len(split_thoughts(seed, tokenizer, " "))
            step = 2 if num_thoughts >= 2 else 1
            positions.append((step - 1) / num_thoughts)
            at_question.append(float(step == 1))
            single.append(float(num_thoughts == 1))
        if positions:
            assert log["srpo/reset_position"] == pytest.approx(sum(positions) / len(positions))
            assert log["srpo/reset_at_question_rate"] == pytest.approx(sum(at_question) / len(at_question))
            assert log["srpo/single_thought_rate"] == pytest.approx(sum(single) / len(single))


@pytest.mark.parametrize("answer, parsed", [("2<|im_end|>", 1.0), ("2", 0.0), ("it is 2<|im_end|>", 0.0)])
def test_bare_integer_parses_only_when_the_answer_ended_with_eos(
    answer, parsed, tiny_model_path, tiny_dataset, tmp_path, generation_log
):
    calls, state = generation_log
    state["localization_answer"] = answer
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reset="self", max_steps=1)
    if parsed:
        trainer.train()
    else:
        with pytest.warns(UserWarning, match="localization answers did not name a step"):
            trainer.train()
    rates = [log["srpo/localization_parse_rate"] for log in step_logs(trainer) if "srpo/localization_parse_rate" in log]
    assert rates and all(rate == parsed for rate in rates)


def test_no_seed_at_all_warns_naming_the_success_reward(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, _ = generation_log
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reward=always_correct_reward, max_steps=1)
    with pytest.warns(UserWarning, match="always_correct_reward"):
        trainer.train()


def test_no_seed_without_a_base_group_warns_that_nothing_is_trained(tiny_model_path, tiny_dataset, tmp_path,
                                                                    generation_log):
    # num_generations=3: the default split is 1x3 with no base group, so a prompt without an incorrect seed has
    # only masked rows (the paper's fallback, GRPO on the base group, has no group to use).
    calls, _ = generation_log
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reward=always_correct_reward, max_steps=1,
                           num_generations=3, per_device_train_batch_size=3, reset_groups=None,
                           suffixes_per_reset=None, weight_decay=0.0)  # no decay: only gradients move weights
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.warns(UserWarning, match="has no base group to fall back to") as caught:
        trainer.train()
    assert any("it trained nothing (this split has no base group)" in str(w.message) for w in caught)
    out = trainer.records[0]["output"]
    assert (out["completion_mask"] * out["tool_mask"]).sum().item() == 0
    assert all(torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())


# ---------------------------------------------------------------- default split, refusals


@pytest.mark.parametrize("generations, base, suffixes", [(2, 0, 2), (3, 0, 3), (4, 2, 2), (5, 3, 2), (7, 4, 3),
                                                         (8, 4, 4), (16, 8, 8)])
def test_default_split_is_half_base_half_shared_prefix(generations, base, suffixes, tmp_path):
    config = SRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=generations,
                        per_device_train_batch_size=generations)
    assert (config.num_base_generations, config.reset_groups, config.suffixes_per_reset) == (base, 1, suffixes)


def test_explicit_splits_are_kept(tmp_path):
    common = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=16,
                  per_device_train_batch_size=16)
    config = SRPOConfig(reset_groups=2, **common)  # suffixes_per_reset defaults to 4 when the split is explicit
    assert (config.num_base_generations, config.reset_groups, config.suffixes_per_reset) == (8, 2, 4)
    config = SRPOConfig(suffixes_per_reset=4, **common)
    assert (config.num_base_generations, config.reset_groups, config.suffixes_per_reset) == (12, 1, 4)
    with pytest.raises(ValueError, match="seed_source"):
        SRPOConfig(seed_source="base", suffixes_per_reset=16, **common)  # no base group to draw a seed from
    with pytest.raises(ValueError, match="seed_source"):
        SRPOConfig(seed_source="old", **common)


@pytest.mark.parametrize("generations", [2, 3, 5, 7])
def test_odd_and_small_group_sizes_train(generations, tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, _ = generation_log
    settings = dict(output_dir=str(tmp_path), num_generations=generations, per_device_train_batch_size=generations,
                    max_completion_length=8, max_steps=1, thought_delimiter=" ", rollout_template=TEMPLATE,
                    localization_template=SHORT_LOCALIZATION, localization_max_tokens=4, report_to="none",
                    use_cpu=True, save_strategy="no", logging_steps=1, seed=0)
    trainer = RecordingSRPOTrainer(model=tiny_model_path, reward_funcs=parity_reward, args=SRPOConfig(**settings),
                                   train_dataset=tiny_dataset)
    trainer.calls, trainer.records = calls, []
    trainer.train()
    assert trainer.state.global_step == 1
    out = trainer.records[0]["output"]
    assert out["completion_ids"].size(0) == generations
    base = trainer.args.num_base_generations
    # Round 1: the base group and one seed candidate (the default), from the one prompt of the step.
    assert len(calls[0]["rows"]) == base + 1


def test_missing_rewards_refusal(tiny_model_path, tiny_dataset, tmp_path):
    # (An environment_factory trains: its resets replay the environment, tests/test_multiturn_trl.py and
    # tests/test_multiturn_resets.py; its get_reward may then be the only reward.)
    args = SRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=8)
    with pytest.raises(ValueError, match="No reward source provided"):
        SRPOTrainer(model=tiny_model_path, args=args, train_dataset=tiny_dataset)


# ---------------------------------------------------------------- cost


def test_one_seed_candidate_per_round_by_default(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, _ = generation_log
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reward=always_correct_reward, max_steps=1,
                           seed_candidates_per_round=SRPOConfig.seed_candidates_per_round)
    assert trainer.args.seed_candidates_per_round == 1
    trainer.train()
    # Round 1: 2 prompts x (4 base + 1 candidate); rounds 2 and 3: 1 candidate per prompt still without a seed.
    assert [len(c["rows"]) for c in calls[:3]] == [10, 2, 2]


def test_suffix_budget_is_max_completion_length_minus_the_prefix(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, state = generation_log
    state["localization_answer"] = "\\boxed{2}"  # resets after the first thought: a non-empty prefix
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reset="self")
    tokenizer = trainer.processing_class
    trainer.train()
    checked = 0
    for record in trainer.records:
        suffix_call = record["calls"][-1]
        group_prompt_ids = [expected_prompt_ids(tokenizer, record["inputs"][i]["prompt"]) for i in (0, 8)]
        budgets = suffix_call["kwargs"]["max_new_tokens"]
        assert len(budgets) == len(suffix_call["rows"])
        for row, budget, completion in zip(suffix_call["rows"], budgets, suffix_call["completions"]):
            prompt = next(p for p in group_prompt_ids if row[: len(p)] == p)
            prefix_length = len(row) - len(prompt)
            assert budget == 12 - prefix_length
            assert len(completion) <= budget  # nothing generated past the row's budget
            checked += int(prefix_length > 0)
    assert checked > 0


def test_hf_generation_stops_each_row_at_its_budget_and_at_stop_strings(tiny_model_path, tiny_dataset, tmp_path):
    from trl_credit.core.generation import generate_from_prefixes

    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, [], max_completion_length=10)
    tokenizer = trainer.processing_class
    raw = []
    real_generate = trainer._generate_single_turn

    def spy(*args, **kwargs):
        completion_ids, logprobs = real_generate(*args, **kwargs)
        raw.append([list(ids) for ids in completion_ids])
        return completion_ids, logprobs

    trainer._generate_single_turn = spy
    prompt = tokenizer("What is 3 + 4?")["input_ids"]
    free, _ = generate_from_prefixes(trainer, [prompt, prompt], greedy=True)
    assert len(free[0]) > 3  # the untouched greedy answer is longer than the budgets below
    completions, _ = generate_from_prefixes(trainer, [prompt, prompt], greedy=True, max_new_tokens=[2, 3])
    assert completions == [free[0][:2], free[1][:3]]
    # generate itself stopped: what it returned past a row's budget is padding (no token sampled there)
    pad = tokenizer.pad_token_id
    assert all(t == pad for t in raw[-1][0][2:]) and all(t == pad for t in raw[-1][1][3:])
    assert max(len(ids) for ids in raw[-1]) <= 3
    # A stop string: the row ends with the token that completes it.
    text = tokenizer.decode(free[0], skip_special_tokens=True)
    stop = tokenizer.decode(free[0][:3], skip_special_tokens=True)[-2:]
    assert stop.strip() and stop in text
    expected = next(n for n in range(1, len(free[0]) + 1) if stop in tokenizer.decode(free[0][:n], skip_special_tokens=True))
    stopped, _ = generate_from_prefixes(trainer, [prompt], greedy=True, stop_strings=[stop])
    assert stopped == [free[0][:expected]]
    assert len(raw[-1][0]) == expected  # generation itself ended there (one row: no padding)
    assert "generate" not in trainer.accelerator.unwrap_model(trainer.model_wrapped).__dict__  # wrapper removed


def test_localization_call_stops_after_the_boxed_step(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, _ = generation_log
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reset="self", max_steps=1)
    trainer.train()
    greedy = [c for c in calls if c["kwargs"].get("greedy")]
    assert greedy and greedy[0]["rows"]
    stops = greedy[0]["kwargs"]["stop_strings"]
    assert stops[0] == "\\boxed{1}" and all(s.startswith("\\boxed{") and s.endswith("}") for s in stops)


def test_seed_source_base_makes_no_seed_generation_call(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, _ = generation_log
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, seed_source="base", reset="random")
    tokenizer = trainer.processing_class
    trainer.train()
    for record, log in zip(trainer.records, step_logs(trainer)):
        sampled = [c for c in record["calls"] if not c["kwargs"].get("greedy")]
        assert len(sampled) == 2  # the base group, then the suffixes: no seed candidates
        group_prompt_ids = [expected_prompt_ids(tokenizer, record["inputs"][i]["prompt"]) for i in (0, 8)]
        assert sampled[0]["rows"] == [group_prompt_ids[0]] * NUM_BASE + [group_prompt_ids[1]] * NUM_BASE
        assert log["srpo/seed_rounds"] == 0
        cursor = 0
        for g in range(2):
            base = sampled[0]["completions"][NUM_BASE * g : NUM_BASE * (g + 1)]
            failed = [c for c in base if text_reward(tokenizer, c) < 1.0]
            if not failed:
                continue
            # The seed is the first failed base rollout: the reset state is the question + a prefix of it.
            row = sampled[1]["rows"][cursor]
            keep = len(row) - len(group_prompt_ids[g])
            assert row[len(group_prompt_ids[g]) :] == failed[0][:keep]
            cursor += NUM_SUFFIXES
        assert cursor == len(sampled[1]["rows"])


def test_token_accounting(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    calls, _ = generation_log
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reset="self")
    trainer.train()
    for record, log in zip(trainer.records, step_logs(trainer)):
        sampled = [c for c in record["calls"] if not c["kwargs"].get("greedy")]
        localization = [c for c in record["calls"] if c["kwargs"].get("greedy")]
        first, rounds, suffix_call = sampled[0], sampled[1:-1], sampled[-1]
        base = [ids for i, ids in enumerate(first["completions"]) if i % (NUM_BASE + PER_ROUND) < NUM_BASE]
        candidates = [ids for i, ids in enumerate(first["completions"]) if i % (NUM_BASE + PER_ROUND) >= NUM_BASE]
        candidates += [ids for call in rounds for ids in call["completions"]]
        tokens = lambda rows: sum(len(ids) for ids in rows)  # noqa: E731
        iid_mean = (tokens(base) + tokens(candidates)) / (len(base) + len(candidates))
        grpo = 2 * 8 * iid_mean  # a GRPO step: 2 prompts x 8 iid rollouts
        everything = tokens(base) + tokens(candidates) + tokens(suffix_call["completions"])
        everything += sum(tokens(c["completions"]) for c in localization)
        assert log["srpo/tokens_vs_grpo"] == pytest.approx(everything / grpo)
        assert log["srpo/paper_tokens_vs_grpo"] == pytest.approx((tokens(base) + tokens(suffix_call["completions"])) / grpo)


@pytest.mark.parametrize("loss_type", ["dapo", "dr_grpo"])
def test_lora_two_rewards_other_loss_types(loss_type, tiny_model_path, tiny_dataset, tmp_path, generation_log):
    """The user's setup: LoRA, [accuracy, format] rewards, a loss type other than the default."""
    from peft import LoraConfig

    calls, _ = generation_log
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=16, num_generations=8, max_completion_length=12,
                    max_steps=2, learning_rate=5e-2, loss_type=loss_type, thought_delimiter=" ", rollout_template=TEMPLATE,
                    localization_template=SHORT_LOCALIZATION, localization_max_tokens=6, report_to="none", use_cpu=True,
                    save_strategy="no", logging_steps=1, seed=0)
    trainer = RecordingSRPOTrainer(
        model=tiny_model_path, reward_funcs=[parity_reward, format_reward], args=SRPOConfig(**settings),
        train_dataset=tiny_dataset,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    trainer.calls, trainer.records = calls, []
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters() if "lora_" in n)
    logs = step_logs(trainer)
    assert min(log["srpo/fallback_rate"] for log in logs) < 1.0  # seeds found although every total reward is >= 1
    assert any(c["rows"] for record in trainer.records for c in record["calls"][-1:])  # suffixes were generated



def length_mod3_reward(completions, **kwargs):
    # A second reward that varies with the text, independent of parity_reward.
    return [float(len(completion_text(c)) % 3 == 0) for c in completions]


def reference_normalize_then_sum(rewards_per_func, group_rows, weights):
    """Slow reference of TRL's normalize_then_sum over the given groups (lists of row indices; rows in no group get
    0 and are outside every statistic): z-score each function per group (unbiased std + 1e-4; std 0 -> 0), weighted
    sum, then (s - mean) / (std + 1e-4) over the rows of all groups."""
    summed = {}
    for rows in group_rows:
        for row in rows:
            summed[row] = 0.0
        for k, weight in enumerate(weights):
            values = [rewards_per_func[row][k] for row in rows]
            mean, std = statistics.mean(values), statistics.stdev(values)
            for row, value in zip(rows, values):
                summed[row] += weight * (0.0 if std == 0 else (value - mean) / (std + 1e-4))
    mean, std = statistics.mean(summed.values()), statistics.stdev(summed.values())
    return {row: (value - mean) / (std + 1e-4) for row, value in summed.items()}


def test_normalize_then_sum_per_sub_group_end_to_end(tiny_model_path, tiny_dataset, tmp_path, generation_log):
    """multi_objective_aggregation="normalize_then_sum" with two rewards: each reward function is normalized within
    the base group and within the shared-prefix group (never across them), weighted, then rescaled over the batch."""
    calls, _ = generation_log
    weights = [1.0, 0.5]
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, calls, reward=[parity_reward, length_mod3_reward],
                           multi_objective_aggregation="normalize_then_sum", reward_weights=weights)
    tokenizer = trainer.processing_class
    trainer.train()
    assert trainer.state.global_step == 2
    assert min(log["srpo/fallback_rate"] for log in step_logs(trainer)) < 1.0
    checked_suffix_groups = 0
    for record in trainer.records:
        out = record["output"]
        group_prompt_ids = [expected_prompt_ids(tokenizer, record["inputs"][i]["prompt"]) for i in (0, 8)]
        seeds, _ = replay_seeds(tokenizer, record, group_prompt_ids)
        texts = [tokenizer.decode(out["completion_ids"][i][out["completion_mask"][i].bool()].tolist(),
                                  skip_special_tokens=True) for i in range(16)]
        rewards_per_func = [(float(len(t) % 2), float(len(t) % 3 == 0)) for t in texts]
        groups = []
        for g in range(2):
            groups.append(list(range(8 * g, 8 * g + NUM_BASE)))
            if seeds[g] is not None:
                groups.append(list(range(8 * g + NUM_BASE, 8 * g + 8)))
                checked_suffix_groups += 1
        reference = reference_normalize_then_sum(rewards_per_func, groups, weights)
        expected = torch.tensor([reference.get(row, 0.0) for row in range(16)])
        torch.testing.assert_close(out["advantages"], expected, rtol=0, atol=1e-4)
    assert checked_suffix_groups > 0

# ---------------------------------------------------------------------------------------------------------------
# Drop-in: the configurations of TRL's own GRPO tests, with SRPO's default split (derived from num_generations)

from tests.trainers.dropin_configs import DROPIN_CONFIGS, DROPIN_EVAL_CONFIGS  # noqa: E402


def alternating_reward(completions, **kwargs):
    # A second reward that varies within every group (unlike `format_reward`), so each reward function matters.
    return [float(i % 2) for i in range(len(completions))]


def dropin_config(tmp_path, group, **overrides):
    # SRPO's own defaults (split derived from num_generations, seed rounds, templates) plus the test-speed settings
    # TRL's tests set. group=3 is TRL's own baseline (num_generations=3, per_device_train_batch_size=3: one reset
    # group of 3, no base group), where a config's batch size override without its own num_generations is dropped
    # so that whole groups still fit (steps_per_generation=2 then makes two prompts of 3 per generation batch);
    # group=4 is 2 base + 1x2.
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=group, num_generations=group,
                    max_completion_length=4, max_steps=1, learning_rate=1e-2, report_to="none", use_cpu=True,
                    save_strategy="no", logging_steps=1, seed=0)
    if group == 3 and "num_generations" not in overrides:
        overrides = {k: v for k, v in overrides.items() if k != "per_device_train_batch_size"}
    settings.update(overrides)
    return SRPOConfig(**settings)


# Further settings of TRL's GRPO tests that reach SRPO's own generation calls (seeds, localization, suffixes).
SRPO_EXTRA_DROPIN_CONFIGS = [
    pytest.param(dict(top_p=0.9, top_k=10, min_p=0.01, repetition_penalty=1.1), id="generation_kwargs"),
    pytest.param(dict(beta=0.1, use_bias_correction_kl=True), id="bias_correction_kl"),
    pytest.param(dict(beta=0.1, sync_ref_model=True, ref_model_sync_steps=1), id="sync_ref_model"),
    pytest.param(dict(scale_rewards=False), id="scale_rewards-False"),
    pytest.param(dict(num_generations=6, per_device_train_batch_size=3, gradient_accumulation_steps=2),
                 id="num_generations-larger-than-batch"),
    pytest.param(dict(generation_kwargs={"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1}),
                 id="generation_kwargs-beams"),
    pytest.param(dict(chat_template_kwargs={"enable_thinking": False}), id="chat_template_kwargs"),
]


@pytest.mark.parametrize("group", [3, 4], ids=["G3", "G4"])
@pytest.mark.parametrize("overrides", DROPIN_CONFIGS + SRPO_EXTRA_DROPIN_CONFIGS)
def test_dropin_trains_with_trl_grpo_test_configurations(tiny_model_path, tiny_dataset, tmp_path, overrides, group):
    import math

    trainer = SRPOTrainer(model=tiny_model_path, reward_funcs=[parity_reward, alternating_reward],
                          args=dropin_config(tmp_path, group, **overrides), train_dataset=tiny_dataset)
    trainer.train()
    assert trainer.state.global_step == 1
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
    assert "srpo/fallback_rate" in trainer.state.log_history[0]  # SRPO's rollout ran, not plain GRPO


@pytest.mark.parametrize("overrides", DROPIN_EVAL_CONFIGS)
def test_dropin_evaluates_with_trl_grpo_test_configurations(tiny_model_path, tiny_dataset, tmp_path, overrides):
    # TRL's eval tests: num_generations=3, per_device_eval_batch_size=3.
    settings = dict(max_steps=2, per_device_eval_batch_size=3, eval_strategy="steps", eval_steps=2)
    settings.update(overrides)
    trainer = SRPOTrainer(model=tiny_model_path, reward_funcs=parity_reward, args=dropin_config(tmp_path, 3, **settings),
                          train_dataset=tiny_dataset, eval_dataset=tiny_dataset.select(range(4)))
    trainer.train()
    assert any("eval_loss" in log for log in trainer.state.log_history)


def test_dropin_reward_reading_a_dataset_column_and_a_reward_returning_none(tiny_model_path, tiny_dataset, tmp_path):
    # TRL's tests: a reward function reading an extra dataset column (also when scoring SRPO's seed candidates) and
    # a second reward function that returns None for every row, with TRL's baseline num_generations=3.
    seen_columns = []

    def column_reward(completions, some_values, **kwargs):
        seen_columns.append(len(some_values))
        return [float(len(completion_text(c)) % 2 == v % 2) for c, v in zip(completions, some_values, strict=True)]

    def non_applicable_reward(completions, **kwargs):
        return [None] * len(completions)

    dataset = tiny_dataset.add_column("some_values", list(range(len(tiny_dataset))))
    trainer = SRPOTrainer(model=tiny_model_path, reward_funcs=[column_reward, non_applicable_reward],
                          args=dropin_config(tmp_path, 3, max_steps=2), train_dataset=dataset)
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(seen_columns) > 2  # the batch and the seed candidates were scored with the column
    logs = [log for log in trainer.state.log_history if "srpo/fallback_rate" in log]
    assert len(logs) == 2


def test_dropin_rewards_all_none_and_reading_the_trainer_state(tiny_model_path, tiny_dataset, tmp_path, caplog):
    # TRL's tests: a reward function reading `trainer_state` (num_generations=2: SRPO's 1x2), and one that returns
    # None for everything (TRL's warning still appears; nothing is a seed, nothing is trained, no crash).
    states = []

    def state_reward(completions, trainer_state=None, **kwargs):
        states.append(trainer_state.global_step)
        return [float(len(completion_text(c)) % 2) for c in completions]

    trainer = SRPOTrainer(model=tiny_model_path, reward_funcs=state_reward, train_dataset=tiny_dataset,
                          args=dropin_config(tmp_path, 2))
    trainer.train()
    assert trainer.state.global_step == 1 and len(states) >= 2  # batch and seed candidates

    def always_none_reward(completions, **kwargs):
        return [None] * len(completions)

    trainer = SRPOTrainer(model=tiny_model_path, reward_funcs=always_none_reward, train_dataset=tiny_dataset,
                          args=dropin_config(tmp_path, 3))
    with caplog.at_level("WARNING", logger="trl.trainer.grpo_trainer"):
        trainer.train()
    assert "All reward functions returned None for the following kwargs:" in caplog.text
    log = next(log for log in trainer.state.log_history if "srpo/fallback_rate" in log)
    assert log["srpo/fallback_rate"] == 1.0


@pytest.mark.parametrize("reset", ["random", "self"])
def test_resume_from_checkpoint_reproduces_the_straight_run(reset, tiny_model_path, tiny_dataset, tmp_path,
                                                            generation_log):
    # The reset generator (RRPO's draws, SRPO's fallback when the localization does not parse, as with the random
    # tiny model) must continue where the checkpoint left it, like the Trainer's global generators do: resuming at
    # step 2 then gives the weights of a run that never stopped (on the old code they differed by 0.003 / 0.011).
    calls, _ = generation_log
    settings = dict(reset=reset, max_steps=4, max_completion_length=24)
    straight = make_trainer(tiny_model_path, tiny_dataset, tmp_path / "a", calls, save_strategy="steps", save_steps=2,
                            **settings)
    straight.train()
    assert all(log["srpo/single_thought_rate"] < 1.0 for log in step_logs(straight)[2:])  # seeds of several thoughts
    resumed = make_trainer(tiny_model_path, tiny_dataset, tmp_path / "b", calls, **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    assert resumed.state.global_step == 4
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b), f"{name} differs by {(a - b).abs().max().item():.3g} after resuming"
    assert resumed._reset_rng.getstate() == straight._reset_rng.getstate()


# ---------------------------------------------------------------- the rollout template implies the thought delimiter


def always_wrong_reward(completions, **kwargs):
    return [0.0 for _ in completions]  # every rollout is incorrect: every prompt has a seed


TWO_LINE_COMPLETION = "3 + 4 = 7\nSo 7."


@pytest.fixture
def two_line_generations(monkeypatch):
    """Every sampled completion is the same two lines, so a seed's thoughts are known: 2 with '\\n', 1 with
    '</thought>' (which the completion does not contain)."""

    def two_lines(ctx, prefix_ids, **kwargs):
        ids = ctx.processing_class.encode(TWO_LINE_COMPLETION, add_special_tokens=False)
        return [list(ids) for _ in prefix_ids], None

    monkeypatch.setattr(BatchContext, "generate", two_lines)  # SRPO's generations (the batch's context)


def test_lines_template_splits_thoughts_at_newlines_in_the_preset_and_the_composed_trainer(
    tiny_model_path, tiny_dataset, tmp_path, two_line_generations
):
    # The composed command of the docs (`--rollout resets --credit oppo --modifiers cue --rollout_template lines`)
    # set no thought_delimiter: it used to stay '</thought>', every seed was one thought and every reset went to the
    # question (srpo/single_thought_rate 1). With 'lines' the delimiter is '\n': the two-line seed has 2 thoughts.
    from trl_credit import CreditConfig, CreditTrainer

    common = dict(per_device_train_batch_size=8, num_generations=8, max_completion_length=12, max_steps=1,
                  learning_rate=1e-2, rollout_template="lines", localization_template=SHORT_LOCALIZATION,
                  localization_max_tokens=6, report_to="none", use_cpu=True, save_strategy="no", logging_steps=1)
    trainers = [
        SRPOTrainer(model=tiny_model_path, reward_funcs=always_wrong_reward, train_dataset=tiny_dataset,
                    args=SRPOConfig(output_dir=str(tmp_path / "srpo"), **common)),
        CreditTrainer(model=tiny_model_path, reward_funcs=always_wrong_reward, train_dataset=tiny_dataset,
                      args=CreditConfig(output_dir=str(tmp_path / "credit"), rollout="resets", credit="oppo",
                                        modifiers=["cue"], cue_partition="random", **common)),
    ]
    for trainer in trainers:
        assert trainer.args.thought_delimiter == "\n"
        trainer.train()
        log = next(entry for entry in trainer.state.log_history if "srpo/single_thought_rate" in entry)
        assert log["srpo/single_thought_rate"] == 0.0
        assert log["srpo/thoughts_per_seed"] == 2.0


def test_the_thought_delimiter_follows_the_template_and_a_mismatch_is_refused_at_construction():
    from trl_credit import CreditConfig

    common = dict(output_dir="unused", use_cpu=True, report_to="none", per_device_train_batch_size=8)
    assert SRPOConfig(**common).thought_delimiter == "</thought>"  # thought_mdp, the paper's
    assert SRPOConfig(rollout_template="lines", **common).thought_delimiter == "\n"
    assert SRPOConfig(rollout_template="Q: {question}", **common).thought_delimiter == "</thought>"
    assert SRPOConfig(rollout_template="lines", thought_delimiter="\\n", **common).thought_delimiter == "\n"
    assert SRPOConfig(thought_delimiter=" ", **common).thought_delimiter == " "  # any other template: as given
    assert CreditConfig(rollout="resets", rollout_template="lines", **common).thought_delimiter == "\n"
    for config_class, extra in ((SRPOConfig, {}), (CreditConfig, {"rollout": "resets"})):
        with pytest.raises(ValueError, match=r"rollout_template='lines'.*thought_delimiter='</thought>'.*unset"):
            config_class(rollout_template="lines", thought_delimiter="</thought>", **extra, **common)
