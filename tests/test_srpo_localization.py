"""SRPO's scored localization, oracle resets and localization quality (docs/srpo.md#reset-index).

Expected values are hand-worked (scores, calibration, quality counts) or come from an independent forward pass of
the model, never from the code under test."""

import math
import random

import pytest
import torch

from trl_credit import SRPOConfig, SRPOTrainer
from trl_credit.core.context import BatchContext
from trl_credit.tasks.rewards import completion_text
from trl_credit.srpo.localization import (
    LocalizationQuality,
    calibrate_scores,
    chain_step_checker,
    checked_step,
    normalize_scores,
    pick_step,
    resolve_step_checker,
)
from trl_credit.srpo.localize import answer_scores, localize
from trl_credit.srpo.prompts import localization_prompt
from trl_credit.srpo.resets import Reset
from trl_credit.srpo.step_metrics import StepStats

TEMPLATE = "P: {question}\n{steps}\nFirst wrong step (1 to {num_steps})?"
QUESTION = "What is 3 + 4?"
THOUGHTS = ["we add", "the numbers", "then check", "the result", "so 7"]


def context(trainer) -> BatchContext:
    """What the localization functions get inside a generation batch: the trainer's context (here outside one)."""
    return BatchContext.for_trainer(trainer)


def parity_reward(completions, **kwargs):
    return [float(len(completion_text(c)) % 2) for c in completions]


# ------------------------------------------------------------------------------------------------ pure functions
def test_scores_pick_and_calibration_hand_worked():
    scores = [math.log(0.6), math.log(0.3), math.log(0.1)]
    assert pick_step(scores) == 1  # plain: the position prior wins
    assert pick_step([0.0, 2.0, 2.0]) == 2  # ties: the first
    assert normalize_scores([math.log(2), math.log(6)]) == pytest.approx([math.log(0.25), math.log(0.75)])
    # Content-free chain: 0.7 / 0.2 / 0.1. p / p_cf = 0.857, 1.5, 1.0 -> normalised 0.2553, 0.4468, 0.2979.
    calibrated = calibrate_scores(scores, [math.log(0.7), math.log(0.2), math.log(0.1)])
    total = 0.6 / 0.7 + 0.3 / 0.2 + 0.1 / 0.1
    assert [math.exp(c) for c in calibrated] == pytest.approx([0.6 / 0.7 / total, 1.5 / total, 1.0 / total])
    assert pick_step(calibrated) == 2
    # Temperature > 0 samples from softmax(scores / T): a near-certain answer is always drawn, a flat one evenly.
    rng = random.Random(0)
    assert {pick_step([0.0, 50.0, 0.0], 1.0, rng) for _ in range(20)} == {2}
    draws = [pick_step([0.0, 0.0], 1.0, rng) for _ in range(400)]
    assert 150 < draws.count(1) < 250


def test_quality_counts_hand_worked():
    quality = LocalizationQuality()
    # (h*, first wrong thought): exact, too early (clean), too late (erroneous prefix), checker found nothing.
    flags = [quality.add(3, 3), quality.add(2, 3), quality.add(4, 2), quality.add(1, None)]
    assert flags == [True, True, False, None]
    assert (quality.checked, quality.unchecked, quality.exact, quality.clean) == (3, 1, 1, 2)
    assert quality.rates() == pytest.approx({"exact_rate": 1 / 3, "clean_rate": 2 / 3, "deviation": (0 - 1 + 2) / 3})
    assert LocalizationQuality.from_list(quality.as_list()) == quality
    assert LocalizationQuality().rates() == {}


def test_chain_checker_maps_lines_to_thoughts():
    prompt = (
        "Compute 11 - 6, then multiply by 3, then add 5. Write one step per line as `x op y = z` (op: +, -, *), "
        "then the answer as \\boxed{N}."
    )
    right = ["11 - 6 = 5", "5 * 3 = 15", "15 + 5 = 20", "\\boxed{20}"]
    assert chain_step_checker(prompt, right) is None
    assert chain_step_checker("11 - 6, then multiply by 3, then add 5", right) is None  # the bare question too
    assert chain_step_checker(prompt, ["11 - 6 = 5", "5 * 3 = 16", "16 + 5 = 21", "\\boxed{21}"]) == 2
    # A thought of two lines owns both: line 3 (wrong) is in thought 2.
    assert chain_step_checker(prompt, ["11 - 6 = 5", "5 * 3 = 15\n15 + 5 = 21", "\\boxed{21}"]) == 2
    assert chain_step_checker(prompt, ["11 - 6 = 5", "5 * 3 = 15"]) == 2  # no answer: one past the end -> last


def test_checker_resolution_and_validation():
    assert resolve_step_checker("chain") is chain_step_checker
    assert resolve_step_checker(None) is None
    with pytest.raises(ValueError, match="step_checker must be a callable"):
        resolve_step_checker("nope")
    assert checked_step(lambda q, t: 2, "q", ["a", "b"]) == 2
    for bad in (0, 3, 1.5, True):
        with pytest.raises(ValueError, match="step_checker returned"):
            checked_step(lambda q, t, bad=bad: bad, "q", ["a", "b"])


def test_config_validates_the_new_fields(tmp_path):
    common = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=8)
    for name, value in (("localization", "sample"), ("localization_scoring", "raw"), ("localization_fallback", "x"),
                        ("localization_temperature", -1.0), ("step_checker", "nope")):
        with pytest.raises(ValueError, match=name):
            SRPOConfig(**{name: value}, **common)
    assert SRPOConfig(reset="oracle", step_checker="chain", **common).reset == "oracle"


# ------------------------------------------------------------------------------------------------ with the trainer
def make_trainer(model_path, dataset, tmp_path, step_checker=None, **overrides):
    settings = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=8, seed_candidates_per_round=2,
        max_seed_rounds=3, max_completion_length=12, max_steps=1, thought_delimiter=" ", rollout_template="Q: {question}",
        localization_template=TEMPLATE, localization_max_tokens=6, report_to="none", use_cpu=True, save_strategy="no",
        logging_steps=1, seed=0,
    )
    settings.update(overrides)
    return SRPOTrainer(model=model_path, reward_funcs=parity_reward, args=SRPOConfig(**settings),
                       train_dataset=dataset, step_checker=step_checker)


def favour_token(trainer, token_id: int, bias: float = 30.0):
    """Make the model's logits favour one token everywhere: a bias on the LM head (TRL's fused log-prob pass and
    generation both read it). Returns a function that removes it."""
    lm_head = trainer.model.get_output_embeddings()
    lm_head.bias = torch.nn.Parameter(torch.zeros(lm_head.weight.size(0)), requires_grad=False)
    with torch.no_grad():
        lm_head.bias[token_id] = bias

    def remove():
        lm_head.bias = None

    return remove


def reference_scores(trainer, question, thoughts):
    """An independent forward of prompt + '\\boxed{' + 'N}' for every N: the summed log-probs of the answer tokens."""
    tokenizer = trainer.processing_class
    text = localization_prompt(question, thoughts, TEMPLATE)
    prefix = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"]
    prefix = list(prefix) + tokenizer.encode("\\boxed{", add_special_tokens=False)
    scores = []
    for step in range(1, len(thoughts) + 1):
        answer = tokenizer.encode(f"{step}}}", add_special_tokens=False)
        ids = torch.tensor([prefix + answer])
        with torch.no_grad():
            logps = torch.log_softmax(trainer.model(input_ids=ids).logits[0].float(), dim=-1)
        scores.append(sum(logps[len(prefix) + i - 1, token].item() for i, token in enumerate(answer)))
    return scores


def test_answer_scores_match_an_independent_forward(tiny_model_path, tiny_dataset, tmp_path):
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, localization_scoring="plain")
    stats = StepStats()
    [scores] = answer_scores(context(trainer), [(QUESTION, THOUGHTS, False)], stats)
    reference = reference_scores(trainer, QUESTION, THOUGHTS)
    # Batched (padded) vs one row at a time: float32 attention sums differ in the last digits.
    assert scores == pytest.approx(reference, abs=5e-3)
    assert pick_step(scores) == pick_step(reference)
    assert stats.localization_forward_tokens > 0


@pytest.mark.parametrize("localization", ["scored", "generate"])
def test_scored_choice_follows_a_model_that_favours_an_index(localization, tiny_model_path, tiny_dataset, tmp_path):
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, localization=localization,
                           localization_scoring="plain")
    favoured = trainer.processing_class.encode("3}", add_special_tokens=False)[0]
    handle = favour_token(trainer, favoured)
    try:
        resets = [Reset(0, [1], None, [1, 2, 3, 4, 5], texts=list(THOUGHTS))]
        stats = StepStats()
        localize(context(trainer), resets, [[{"role": "user", "content": QUESTION}]], stats, rng=trainer.rollout.rng)
    finally:
        handle()
    # "generate": the model now writes "333..." (no \boxed{N}), which falls back to the scored choice, not a draw.
    assert (resets[0].step, resets[0].source) == (3, "scored")
    assert (stats.scored, stats.random, stats.generated) == (1, 0, 0)
    assert stats.localization_attempts == (1 if localization == "generate" else 0)


def test_calibrated_scores_cancel_a_bias_that_ignores_the_steps(tiny_model_path, tiny_dataset, tmp_path):
    """A preference for one answer whatever the chain says (here: a +30 logit on "3}") is a prior, not a
    localization: calibrated scoring (the default) divides it out, so the pick is the one without the bias."""
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path)
    assert trainer.args.localization_scoring == "calibrated"

    def pick() -> int:
        resets = [Reset(0, [1], None, [1, 2, 3, 4, 5], texts=list(THOUGHTS))]
        localize(context(trainer), resets, [[{"role": "user", "content": QUESTION}]], StepStats(),
                 rng=trainer.rollout.rng)
        return resets[0].step

    unbiased = pick()
    handle = favour_token(trainer, trainer.processing_class.encode("3}", add_special_tokens=False)[0])
    try:
        biased = pick()
    finally:
        handle()
    assert unbiased != 3  # else the bias would not change a plain pick either, and the test would show nothing
    assert biased == unbiased  # plain scores: 3


def test_generate_with_random_fallback_draws_uniformly(tiny_model_path, tiny_dataset, tmp_path):
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, localization="generate",
                           localization_fallback="random")
    handle = favour_token(trainer, trainer.processing_class.encode("3}", add_special_tokens=False)[0])
    try:
        resets = [Reset(0, [1], None, [1, 2, 3, 4, 5], texts=list(THOUGHTS)) for _ in range(4)]
        stats = StepStats()
        localize(context(trainer), resets, [[{"role": "user", "content": QUESTION}]], stats, rng=trainer.rollout.rng)
    finally:
        handle()
    assert [r.source for r in resets] == ["random"] * 4 and stats.localization_forward_tokens == 0


def seeds_of(trainer, texts):
    return [[(trainer.processing_class.encode(text, add_special_tokens=False), None) for text in texts]]


def test_oracle_resets_land_at_the_checkers_index(tiny_model_path, tiny_dataset, tmp_path):
    asked = []

    def checker(question, thoughts):
        asked.append((question, list(thoughts)))
        return 3 if len(thoughts) >= 3 else None

    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, step_checker=checker, reset="oracle")
    prompt = [{"role": "user", "content": QUESTION}]
    stats = StepStats()
    seeds = seeds_of(trainer, ["we add the numbers then", "we add"])
    resets = trainer.rollout._choose_resets(context(trainer), seeds, [prompt], stats)
    assert asked[0][0] == QUESTION  # the unwrapped question
    assert asked[0][1] == resets[0].texts and len(resets[0].texts) == len(resets[0].ends) >= 3
    assert (resets[0].step, resets[0].source) == (3, "oracle")
    assert resets[1].source == "random" and 1 <= resets[1].step <= 2  # the checker found nothing: a named draw
    assert (stats.oracle_attempts, stats.oracle_misses) == (2, 1)
    assert (stats.checked, stats.unchecked, stats.exact, stats.clean) == (1, 1, 1, 1)


def test_oracle_needs_a_checker(tiny_model_path, tiny_dataset, tmp_path):
    with pytest.raises(ValueError, match="reset='oracle' needs a step checker"):
        make_trainer(tiny_model_path, tiny_dataset, tmp_path, reset="oracle")


def test_quality_metrics_for_random_resets(tiny_model_path, tiny_dataset, tmp_path):
    # The checker says the last thought is wrong: every reset prefix is clean, exact only when h* = H_s.
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, step_checker=lambda q, t: len(t), reset="random")
    stats = StepStats()
    texts = ["a b c d", "a b", "a b c d e f", "a"]
    resets = trainer.rollout._choose_resets(context(trainer), seeds_of(trainer, texts), [[{"role": "user", "content": QUESTION}]],
                                            stats)
    steps = [r.step for r in resets]
    sizes = [len(r.ends) for r in resets]
    assert sizes[3] == 1 and max(sizes) >= 3  # thoughts as the tiny tokenizer cuts them at spaces
    assert stats.checked == 4 and stats.clean == 4
    assert stats.exact == sum(s == n for s, n in zip(steps, sizes))
    assert stats.deviation_sum == sum(s - n for s, n in zip(steps, sizes))


def test_training_step_logs_sources_quality_and_split_corrections(tiny_model_path, tiny_dataset, tmp_path):
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, step_checker=lambda q, t: len(t),
                           localization_scoring="calibrated")
    trainer.train()
    log = next(entry for entry in trainer.state.log_history if "srpo/fallback_rate" in entry)
    if "srpo/localization_source/scored" in log:  # some seed had more than one thought
        assert log["srpo/localization_source/scored"] == 1.0 and log["srpo/localization_source/random"] == 0.0
        assert log["srpo/localization_forward_tokens_vs_grpo"] > 0
    assert log["srpo/localization_clean_rate"] == 1.0  # h* <= H_s always
    assert log["srpo/correction_rate_clean_prefix"] == log["srpo/correction_rate"]
    assert "srpo/correction_rate_erroneous_prefix" not in log


def test_oracle_training_step(tiny_model_path, tiny_dataset, tmp_path):
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, step_checker=lambda q, t: len(t), reset="oracle")
    trainer.train()
    log = next(entry for entry in trainer.state.log_history if "srpo/fallback_rate" in entry)
    assert log["srpo/localization_exact_rate"] == 1.0 and log["srpo/oracle_miss_rate"] == 0.0
    assert log["srpo/localization_deviation"] == 0.0


def test_chain_checker_by_name_end_to_end(tiny_model_path, tmp_path):
    # `--reset oracle --step_checker chain`: the config names the checker. The tiny model's lines are no chain steps
    # (a one-line rollout's single thought resets at the question anyway), so the checker's first wrong thought is
    # the first (unparseable) one and the oracle resets at the question.
    from trl_credit.tasks.chain import make_chain_dataset

    dataset = make_chain_dataset(num_train=8, num_test=2)["train"]
    args = SRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=8, seed_candidates_per_round=2,
        max_completion_length=12, max_steps=1, thought_delimiter="\n", rollout_template="none", reset="oracle",
        step_checker="chain", report_to="none", use_cpu=True, save_strategy="no", logging_steps=1, seed=0,
    )
    trainer = SRPOTrainer(model=tiny_model_path, reward_funcs=parity_reward, args=args, train_dataset=dataset)
    trainer.train()
    log = next(entry for entry in trainer.state.log_history if "srpo/fallback_rate" in entry)
    assert log["srpo/localization_exact_rate"] == 1.0 and log["srpo/reset_at_question_rate"] == 1.0


# ---------------------------------------------------------------------- one prefix pass per chain vs per-row rows
CHAINS = [
    (QUESTION, THOUGHTS, False),
    ("What is 12 * 3 - 5?", ["compute 12 * 3 = 36", "subtract 5", "to get 31", "so 31"], False),
    ("Let x = 2. What is x^2?", ["x^2 = 4"], False),
    ("What is 3 + 4?", ["we add the numbers", "then we check", "the result is 7", "hence", "so", "7", "done",
                        "we verify", "by substitution", "and conclude", "the answer is 7", "final"], False),
    (QUESTION, THOUGHTS, False),  # a repeated chain: run once, both get its scores
]


def per_row_and_shared(trainer, chains):
    """The localization's candidate log-prob sums both ways on the same prompts: every candidate row whole
    (``_per_row_logps``, the path before) and each prefix once (``_shared_prefix_logps``)."""
    from trl_credit.srpo.localize import (
        _localization_prompt_ids,
        _per_row_logps,
        _prefix_can_be_shared,
        _shared_prefix_logps,
    )

    tokenizer = trainer.processing_class
    opening = tokenizer.encode("\\boxed{", add_special_tokens=False)
    prefixes = [p + opening for p in _localization_prompt_ids(context(trainer), chains)]
    answers = [[tokenizer.encode(f"{n}}}", add_special_tokens=False) for n in range(1, len(t) + 1)]
               for _, t, _ in chains]
    assert _prefix_can_be_shared(context(trainer))
    rows = sum(len(a) for a in answers)
    old_stats, new_stats = StepStats(), StepStats()
    old = _per_row_logps(context(trainer), prefixes, answers, old_stats, rows, opening)
    new = _shared_prefix_logps(context(trainer), prefixes, answers, new_stats)
    assert new is not None
    # Tokens run, counted by hand from the rows: each candidate row whole before; each distinct prefix once (all
    # but its last token) and [last prefix token + answer] per candidate of a distinct chain now.
    assert old_stats.localization_forward_tokens == sum(
        len(p) + len(a) for p, c in zip(prefixes, answers) for a in c)
    distinct = {(tuple(p), len(c)): (p, c) for p, c in zip(prefixes, answers)}.values()
    assert new_stats.localization_forward_tokens == sum(len(p) - 1 + sum(1 + len(a) for a in c) for p, c in distinct)
    return old, new


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prefix_scores_equal_per_row_scores(temperature, tiny_model_path, tiny_dataset, tmp_path):
    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, temperature=temperature,
                           per_device_train_batch_size=8)
    old, new = per_row_and_shared(trainer, CHAINS)
    assert [len(s) for s in new] == [len(t) for _, t, _ in CHAINS]
    diff = max(abs(a - b) for o, n in zip(old, new) for a, b in zip(o, n))
    assert diff < 1e-4, diff
    assert [pick_step(s) for s in new] == [pick_step(s) for s in old]
    assert new[0] == new[-1]  # the repeated chain
    # Not trivially equal: the scores differ between candidates and chains.
    assert len({round(v, 3) for s in new for v in s}) > 10
    if temperature != 1.0:  # the temperature reaches the scores (TRL divides the logits by it)
        reference = make_trainer(tiny_model_path, tiny_dataset, tmp_path, per_device_train_batch_size=8)
        _, at_one = per_row_and_shared(reference, CHAINS[:1])
        assert max(abs(a - b) for a, b in zip(at_one[0], new[0])) > 1e-3


def test_shared_prefix_scores_with_lora_equal_per_row_scores(tiny_model_path, tiny_dataset, tmp_path):
    from peft import LoraConfig

    trainer = SRPOTrainer(
        model=tiny_model_path, reward_funcs=parity_reward, train_dataset=tiny_dataset,
        args=SRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=8,
                        max_completion_length=12, thought_delimiter=" ", rollout_template="Q: {question}",
                        localization_template=TEMPLATE, report_to="none", use_cpu=True, save_strategy="no", seed=0),
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                               task_type="CAUSAL_LM"),
    )
    # A trained-looking adapter (PEFT initialises B to zero, which would leave the base model's scores).
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in trainer.model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    old, new = per_row_and_shared(trainer, CHAINS[:4])
    assert max(abs(a - b) for o, n in zip(old, new) for a, b in zip(o, n)) < 1e-4
    assert [pick_step(s) for s in new] == [pick_step(s) for s in old]
    with trainer.model.disable_adapter():  # the adapter moves the scores: the pass went through it
        base, _ = per_row_and_shared(trainer, CHAINS[:1])
    assert max(abs(a - b) for a, b in zip(base[0], new[0])) > 1e-3


def test_answer_scores_stand_aside_where_the_cache_cannot_be_shared(tiny_model_path, tiny_dataset, tmp_path):
    """A model whose cache layers are not all plain full-attention layers (here: a sliding window on the tiny
    Llama) is scored per row, as before: same scores, per-row token count."""
    from trl_credit.srpo.localize import _prefix_can_be_shared

    trainer = make_trainer(tiny_model_path, tiny_dataset, tmp_path, localization_scoring="plain")
    stats = StepStats()
    [shared] = answer_scores(context(trainer), [(QUESTION, THOUGHTS, False)], stats)
    config = trainer.model.config
    config.layer_types, config.sliding_window = ["sliding_attention"] * config.num_hidden_layers, 4096
    try:
        assert not _prefix_can_be_shared(context(trainer))
        per_row_stats = StepStats()
        [per_row] = answer_scores(context(trainer), [(QUESTION, THOUGHTS, False)], per_row_stats)
    finally:
        del config.layer_types, config.sliding_window
    assert per_row == pytest.approx(shared, abs=1e-4)
    assert per_row_stats.localization_forward_tokens > 2 * stats.localization_forward_tokens
