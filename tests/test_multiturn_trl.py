"""TRL's own multi-turn GRPO tests (tools, environments), run for every trainer as for ``GRPOTrainer`` (issue 60).

Ported from TRL's tests/test_grpo_trainer.py (the stored huggingface/trl version closest to 1.16.0, commit
fe6686ac): ``test_train_with_tools`` (sync and async tool), ``test_train_with_malformed_tool_calls``,
``test_train_with_multiple_environments``, ``test_train_with_unknown_environment_raises``,
``test_train_with_environment_factory``, ``test_train_with_environment_owned_reward``,
``test_environment_owned_reward_coexists_with_reward_funcs``, ``test_environment_owned_reward_mixed_environments``
and ``test_train_with_environment_owned_data``. Each asserts what TRL's test asserts: the tool-call and failure
frequencies TRL logs (``tools/call_frequency``, ``tools/failure_frequency``), the environments' states, the
environment-owned reward's column and mean, and that every parameter moved. TRL's tests run offline models and data
from the Hub; here the model is the tiny tool model (tests/tiny_tools.py: a random Qwen3 with TRL's qwen3 template),
the data a small in-memory dataset, and TRL's reward model a reward function with variance within the group. The
generation is scripted as in TRL's tests (``model.generate`` patched, :class:`~tests.tiny_tools.ScriptedGeneration`).

Beyond TRL's assertions, every training test checks the batches reaching TRL's loss (``_compute_loss``): the
tool-result tokens are exactly the positions where ``tool_mask`` is 0 (their text is the tool response the qwen3
template renders), the model's tokens are 1, and a per-token advantage is 0 at every tool-result position (a
per-sequence advantage leaves it to ``tool_mask``, which TRL's loss multiplies into its mask).

Two tests of ours join them: ``test_train_with_rollout_func_env_mask``, a user's ``rollout_func`` with an
``env_mask`` (the environment's tokens get the tool results' treatment), and the refusal of all three, by name, by the
rollouts that generate rows themselves (:data:`REFUSING`: SRPO's resets, DATPO's trees).

A trainer joins every test by one entry of :data:`TRAINERS`; OPPO, which reads every row's answer, is refused by name
where the data has none (:data:`NEEDS_ANSWER_COLUMN`).
"""

import os
from unittest.mock import patch

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from tests.tiny_tools import ASSISTANT_START, ScriptedGeneration

import trl_credit
from trl_credit.process.step_rewards import STEP_REWARDS, register_step_reward

# name -> (trainer class, config class, the trainer's own config settings on the tiny tool model). Every test builds
# its trainer as ``trainer_class(model, reward_funcs, args=config_class(**common, **test's, **settings), ...)``: the
# settings come last, so a trainer whose rollout needs a different batch (SRPO: a base group and reset groups) sets it
# here, and the tests' expectations follow the batch it gets (rows per generation, generations per prompt).
TRAINERS = {
    "grpo": (GRPOTrainer, GRPOConfig, {}),
    "credit": (trl_credit.CreditTrainer, trl_credit.CreditConfig, {}),  # groups x outcome: GRPO's advantage
    "cue_grpo": (trl_credit.CueGRPOTrainer, trl_credit.CueGRPOConfig, {}),  # cues from the completions' text
}

# A step-reward function for credit="process": one reward per step (a model turn, docs/multiturn.md#process-credit),
# 1.0 for a turn holding a tool call whose JSON names an argument the tool has, else 0.0.
def _tool_call_steps(prompt, completion, steps, **row):
    return [float('"b":' in step or '"step":' in step or '"text":' in step) for step in steps]


@pytest.fixture(autouse=True, scope="module")
def _tool_call_steps_registered():
    """The step-reward function, registered for this module's tests only (the registry is global)."""
    register_step_reward("tool_call_steps", _tool_call_steps)
    yield
    STEP_REWARDS.pop("tool_call_steps", None)

TRAINERS.update({
    # OPPO's oracle pass reads the answer column (the datasets here carry "answer"; where the environment owns the data
    # there is none, and OPPO says so by name at construction: NEEDS_ANSWER_COLUMN).
    "oppo": (trl_credit.OPPOTrainer, trl_credit.OPPOConfig, dict(oracle="self", answer_column="answer")),
    "process": (trl_credit.CreditTrainer, trl_credit.CreditConfig, dict(
        credit="process", process_step_reward="tool_call_steps", process_outcome="final_step",
        process_thought_delimiter="\n")),
    "implicit_prm": (trl_credit.CreditTrainer, trl_credit.CreditConfig, dict(
        credit="implicit_prm", prime_learning_rate=1e-2, prime_prompt_filter=False)),  # (3 rows: no 0.2-0.8 group)
    # SRPO: the budget num_generations = base + reset_groups * suffixes_per_reset (base 0 or >= 2); 4 rows per
    # prompt = 2 base rows + 1 reset group of 2 suffixes; the prompts as they are (an agent's task), lines as
    # thoughts, a short localization.
    "srpo": (trl_credit.SRPOTrainer, trl_credit.SRPOConfig, dict(
        num_generations=4, per_device_train_batch_size=4, reset="random", reset_groups=1, suffixes_per_reset=2,
        seed_source="fresh", seed_candidates_per_round=2, max_seed_rounds=1, rollout_template="none",
        thought_delimiter="\n", localization_max_tokens=4, reset_seed=0)),
    "resets_oppo": (trl_credit.CreditTrainer, trl_credit.CreditConfig, dict(
        rollout="resets", credit="oppo", oracle="self", num_generations=4, per_device_train_batch_size=4,
        reset="random", reset_groups=1, suffixes_per_reset=2, seed_source="fresh", seed_candidates_per_round=2,
        max_seed_rounds=1, rollout_template="none", thought_delimiter="\n", localization_max_tokens=4,
        reset_seed=0)),
    # resets x the process credit (model turns as steps; a suffix row's steps inside its prefix stay out of the
    # statistics, docs/process.md)
    "resets_process": (trl_credit.CreditTrainer, trl_credit.CreditConfig, dict(
        rollout="resets", credit="process", process_step_reward="tool_call_steps", process_outcome="final_step",
        process_thought_delimiter="\n", num_generations=4, per_device_train_batch_size=4, reset="random",
        reset_groups=1, suffixes_per_reset=2, seed_source="fresh", seed_candidates_per_round=2, max_seed_rounds=1,
        rollout_template="none", thought_delimiter="\n", localization_max_tokens=4, reset_seed=0)),
})

# DATPO: one prompt per step, its tree at most 3 base rows + 3 x 1 fork x 2 branches; the branches resume TRL's tool
# loop from their forks inside the model's turns (docs/multiturn.md#datpo-trees). The base rows are TRL's, so every
# TRL assertion on them (tool frequencies, environments, rewards) holds as for GRPO.
TRAINERS["datpo"] = (trl_credit.DATPOTrainer, trl_credit.DATPOConfig, dict(
    max_forks=1, max_branches=2, difficulty_adaptive=False, branch_budget="remaining", fork_method="tok_entropy",
    use_diversity=False, rows_per_forward=8))
# trees x Cue-GRPO's rarity weights: the cues come from the leaves' assistant turns (docs/multiturn.md#cue-grpo)
TRAINERS["trees_cue"] = (trl_credit.CreditTrainer, trl_credit.CreditConfig, dict(
    rollout="trees", credit="blocks", modifiers=["cue"], **TRAINERS["datpo"][2]))
#: DATPO's trees (3 base rows and 2 branches from the one fork of each: 9 training rows)
TREES = {"datpo", "trees_cue"}

#: Trainers that read the ground-truth answer of every row (OPPO's oracle prompt): a dataset without the answer column
#: (an environment that owns the data) is refused at construction, naming ``answer_column``.
NEEDS_ANSWER_COLUMN = {"oppo", "resets_oppo"}

#: The resets rollouts (SRPO's): they run TRL's tool loop in their own rows, so tools and environments train, and
#: refuse a user's rollout_func by name (it would replace their generation).
RESETS = {"srpo", "resets_oppo", "resets_process"}

#: Rollouts that generate rows themselves (SRPO's resets, DATPO's trees): a user's rollout_func would replace their
#: generation, so they refuse it by name.
OWN_ROLLOUTS = RESETS | TREES

#: The scripted first turn (index into a test's ``first_turns``) that training row ``i`` holds. TRL's tests lay a
#: batch out as 3 generations, row i answering with turn i % 3. A resets trainer trains on 4 rows per prompt: 2 base
#: rows, the first two rollouts of its round-1 generation call (turns 0, 1; the call's rows 2, 3 are the seed
#: candidates, turns 2, 0), then 2 suffix rows. In every test here the seed is the first failing candidate, turn 2
#: (no tool call: scored 0 by each test's reward), which is one thought (no "\n"), so it resets at the question:
#: the suffixes are the first two rows of the suffix generation call, turns 0, 1 again.
ROW_TURNS = {name: (0, 1, 0, 1) for name in ("srpo", "resets_oppo", "resets_process")}


def row_turn(name, i):
    """The scripted first turn of training row ``i`` (:data:`ROW_TURNS`; TRL's i % 3 otherwise)."""
    return ROW_TURNS[name][i % len(ROW_TURNS[name])] if name in ROW_TURNS else i % 3


#: Rollouts that generate rows themselves without a tool loop: they refuse tools, environments and a user's
#: rollout_func by name at construction (docs/multiturn.md). None left: SRPO's resets and DATPO's trees both resume TRL's
#: tool loop (they refuse only a user's rollout_func: :data:`OWN_ROLLOUTS`).
REFUSING: dict = {}


def multiply_tool(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_multiply_tool(a: int, b: int) -> int:
    """
    Asynchronously multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


def tool_call(name: str, arguments: str) -> str:
    """A first turn that is one tool call, as the qwen3 template renders it (TRL's tests write the same text)."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call><|im_end|>'


DONE = "Done!<|im_end|>"
#: The tool-result span TRL appends after a tool-calling turn: the qwen3 template's tool turn (a user turn holding
#: ``<tool_response>``) and the next generation prompt; the turn's own ``<|im_end|>`` ends the model's tokens.
TOOL_SPAN = "\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n" + ASSISTANT_START


def prompts_dataset(rows: int = 6, **columns) -> Dataset:
    """Conversational prompts (TRL's tests use trl-internal-testing/zen's conversational_prompt_only split) with an
    ``answer`` column (OPPO's oracle reads it; the other trainers pass it to the reward functions)."""
    prompt = [{"role": "user", "content": "What is 3 times 4?"}]
    return Dataset.from_dict({"prompt": [prompt] * rows, "answer": ["12"] * rows, **columns})


def tool_result_reward(completions, **kwargs):
    """1.0 when a tool returned the product 12 in the completion, else 0.0 (TRL's tests score with a tiny reward
    model; a reward with variance within the group makes the advantages, and so the update, non-zero)."""
    return [float(any(m["role"] == "tool" and m["content"] == "12" for m in c)) for c in completions]


def tool_tag_reward(completions, **kwargs):
    """1.0 when the completion's text holds a ``<tool_call>`` tag, else 0.0: variance within a group of completions
    that call no tool, with the 0/1 values a verifier gives (the trainers that tell correct from incorrect read it)."""
    return [float("<tool_call>" in c[-1]["content"]) for c in completions]


def make_trainer(name, model_path, tmp_path, reward_funcs, **kwargs):
    """The trainer of :data:`TRAINERS` ``name`` with TRL's test settings (batches of 3: one prompt, 3 generations;
    lr 0.1), the test's own settings (``args=dict(...)``) and the trainer's; ``kwargs`` go to the trainer."""
    trainer_class, config_class, settings = {**TRAINERS, **REFUSING}[name]
    values = dict(
        output_dir=str(tmp_path), learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
        max_completion_length=128, max_steps=1, logging_steps=1, report_to="none", save_strategy="no",
        use_cpu=True, bf16=False, seed=0, disable_tqdm=True,
    )
    values.update(kwargs.pop("args", {}))
    values.update(settings)
    values.update(kwargs.pop("last", {}))  # a test's settings for one trainer's layout, over the trainer's own
    return trainer_class(model_path, reward_funcs, args=config_class(**values), **kwargs)


def make_or_refuse(name, model_path, tmp_path, reward_funcs, **kwargs):
    """:func:`make_trainer` for data without an answer column (the environment owns the data): a trainer that reads
    every row's answer (:data:`NEEDS_ANSWER_COLUMN`) must refuse it at construction, naming ``answer_column``; None
    then, the trainer otherwise."""
    if name not in NEEDS_ANSWER_COLUMN:
        return make_trainer(name, model_path, tmp_path, reward_funcs, **kwargs)
    with pytest.raises(ValueError, match="answer_column"):
        make_trainer(name, model_path, tmp_path, reward_funcs, **kwargs)
    return None


def record_loss_inputs(trainer) -> list[dict]:
    """Each micro-batch reaching TRL's ``_compute_loss``: its advantages, completion ids and masks."""
    batches = []
    loss = trainer._compute_loss

    def recording(model, inputs):
        batches.append({k: v.detach().clone() for k, v in inputs.items()
                        if k in ("advantages", "completion_ids", "completion_mask", "tool_mask")})
        return loss(model, inputs)

    trainer._compute_loss = recording
    return batches


def train_scripted(trainer, tokenizer, first_turns):
    """Train with ``model.generate`` scripted (TRL's tests: ``patch.object(trainer.model, "generate", ...)``);
    returns the script (its recorded calls) and the batches that reached the loss."""
    script = ScriptedGeneration(tokenizer, first_turns)
    batches = record_loss_inputs(trainer)
    with patch.object(trainer.model, "generate", side_effect=script):
        trainer.train()
    return script, batches


def tool_spans(batches, tokenizer) -> list[str]:
    """Check the loss inputs of every micro-batch and return the text of each row's tool-result span.

    Per row: the ``tool_mask`` = 0 positions form one contiguous span inside the completion (each scripted rollout
    calls tools at most once), the ``tool_mask`` = 1 tokens hold no tool response, and where the advantage is
    per-token it is 0 on every ``tool_mask`` = 0 position. Returns the decoded spans ("" for a row without one). A
    row whose ``tool_mask`` is 0 everywhere trains nothing (a resets trainer's fallback row, a copy of a candidate kept
    for TRL's group size): it has no span and is left out."""
    spans = []
    for batch in batches:
        assert "tool_mask" in batch, "a multi-turn batch reached the loss without TRL's tool_mask"
        tool_mask, completion_mask = batch["tool_mask"], batch["completion_mask"]
        advantages = batch["advantages"]
        if advantages.dim() == 2:  # per-token: nothing of a tool result may carry credit, even outside the loss mask
            assert torch.all(advantages[tool_mask == 0] == 0), "a tool-result token got an advantage"
        for ids, tools, kept in zip(batch["completion_ids"], tool_mask, completion_mask):
            if not torch.any((tools == 1) & (kept == 1)):
                continue  # trains nothing: no span
            outside = ((tools == 0) & (kept == 1)).nonzero().flatten().tolist()
            if outside:
                assert outside == list(range(outside[0], outside[-1] + 1)), "the tool result is not one span"
            model_text = tokenizer.decode(ids[(tools == 1) & (kept == 1)].tolist())
            assert "<tool_response>" not in model_text, f"tool-result tokens count as the model's: {model_text!r}"
            spans.append(tokenizer.decode(ids[outside].tolist()) if outside else "")
    return spans


def last_step_log(trainer) -> dict:
    """The last training step's logged metrics (TRL's log_history ends with the run's summary, train_loss)."""
    return [entry for entry in trainer.state.log_history if "loss" in entry][-1]


def assert_params_changed(previous, trainer):
    for n, param in previous.items():
        assert not torch.equal(param, trainer.model.get_parameter(n)), f"Parameter {n} has not changed."


def parameters(trainer):
    return {n: param.clone() for n, param in trainer.model.named_parameters()}


@pytest.fixture(scope="module")
def tool_tokenizer(tiny_tool_model_path):
    return AutoTokenizer.from_pretrained(tiny_tool_model_path)


# ---------------------------------------------------------------------------------------------------- tools
@pytest.mark.parametrize("tools", [[multiply_tool], [async_multiply_tool]], ids=["sync", "async"])
@pytest.mark.parametrize("name", list(TRAINERS))
def test_train_with_tools(name, tools, tiny_tool_model_path, tool_tokenizer, tmp_path):
    # TRL: the 3 completions of a prompt are a valid tool call, a tool call with a wrong argument name (it fails),
    # and a text without a tool call; the 2 tool-calling rows then answer 'Done!'.
    tool_name = tools[0].__name__
    trainer = make_trainer(name, tiny_tool_model_path, tmp_path, tool_result_reward, train_dataset=prompts_dataset(),
                           tools=tools)
    previous = parameters(trainer)
    first_turns = [tool_call(tool_name, '{"a": 3, "b": 4}'), tool_call(tool_name, '{"a": 3, "c": 4}'),
                   "I don't know any tool<|im_end|>"]
    script, batches = train_scripted(trainer, tool_tokenizer, first_turns)

    rows = trainer.args.per_device_train_batch_size  # one generation batch per step (steps_per_generation = 1)
    calls = sum(row_turn(name, i) != 2 for i in range(rows))  # turns 0 and 1 call the tool (srpo: 4 / 4)
    failures = sum(row_turn(name, i) == 1 for i in range(rows))  # turn 1 names argument "c" (srpo: 2 / 4)
    assert trainer.state.log_history[-1]["train_loss"] is not None
    log = last_step_log(trainer)
    assert log["tools/call_frequency"] == pytest.approx(calls / rows)  # TRL: 2 / 3
    assert log["tools/failure_frequency"] == pytest.approx(failures / calls)  # TRL: 1 / 2
    # The regeneration after the tools: one row per tool call, each after a tool response (resets: the round-1 call's
    # rollouts with a call, turns 0, 1, 2, 0 -> 3 rows; the suffixes' regeneration is the last call, turns 0, 1).
    assert [kind for kind, _ in script.calls[1]] == ["after_tool"] * (3 if name in RESETS else calls)
    if name in RESETS:
        assert [kind for kind, _ in script.calls[-1]] == ["after_tool"] * 2

    # The tool results are TRL's tool_mask = 0 span: the product for the valid call, the error for the wrong one.
    spans = sorted(span for span in tool_spans(batches, tool_tokenizer) if span)
    error = "{'error': \"" + tool_name + "() got an unexpected keyword argument 'c'\"}"
    assert spans == sorted([TOOL_SPAN.format(result="12")] * (calls - failures)
                           + [TOOL_SPAN.format(result=error)] * failures)
    assert_params_changed(previous, trainer)


@pytest.mark.parametrize("name", list(TRAINERS))
def test_train_with_malformed_tool_calls(name, tiny_tool_model_path, tool_tokenizer, tmp_path):
    # TRL: tool calls without a name, with a misspelt tag and with invalid JSON are no tool calls: no second turn.
    trainer = make_trainer(name, tiny_tool_model_path, tmp_path, tool_tag_reward, train_dataset=prompts_dataset(),
                           tools=[multiply_tool])
    previous = parameters(trainer)
    first_turns = [
        '<tool_call>\n{"arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>',
        '<toolcall>\n{"arguments": {"a": 3, "b": 4}}\n</toolcall><|im_end|>',
        '<tool_call>\n{"arguments": {a: 3, b: 4}}\n</tool_call><|im_end|>',
    ]
    script, batches = train_scripted(trainer, tool_tokenizer, first_turns)

    # TRL: generate called once. DATPO's later calls are its branches, each continuing a prefix of a first turn
    # (a fork inside it); none answers a tool response.
    assert [kind for call in script.calls[1:] for kind, _ in call if kind != "continuation"] == [], \
        "a malformed tool call started a second turn"
    if name not in TREES:
        assert len(script.calls) == 1, "a malformed tool call started a second turn"
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert last_step_log(trainer)["tools/call_frequency"] == 0.0
    # no tool tokens; resets: the round-1 candidates (turns 2, 0) both hold "<tool_call>", so no seed: the reset
    # group's 2 rows are fallback rows, which train nothing (left out of the spans)
    # DATPO: 3 base rows and 2 branches from the one fork of each (difficulty_adaptive=False: K = 1, B = 2)
    trained = 2 if name in RESETS else 9 if name in TREES else trainer.args.per_device_train_batch_size
    assert tool_spans(batches, tool_tokenizer) == [""] * trained
    assert_params_changed(previous, trainer)


# ---------------------------------------------------------------------------------------------------- environments
class CounterEnvironment:
    """TRL's test environment: a counter the model increments through a tool; ``get_reward`` only in a subclass."""

    def reset(self, **kwargs):
        self._counter = 0

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self._counter += step
        return self._counter


class RewardedCounterEnvironment(CounterEnvironment):
    """The counter environment owning the reward: the final counter (TRL's ``test_train_with_environment_owned_reward``
    names its class DummyEnvironment)."""

    def get_reward(self) -> float:
        return float(self._counter)


# TRL: a valid increment, an unknown tool (it fails), and no tool call.
COUNTER_TURNS = [tool_call("increment", '{"step": 1}'), tool_call("decrement", '{"step": 2}'),
                 "I won't increment<|im_end|>"]


def counter_reward(completions, **kwargs):
    """1.0 when the increment tool answered (TRL's tests use a reward model: any variance within the group)."""
    return [float(any(m["role"] == "tool" and m["content"] == "1" for m in c)) for c in completions]


@pytest.mark.parametrize("name", list(TRAINERS))
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_train_with_environment_factory(name, tiny_tool_model_path, tool_tokenizer, tmp_path):
    trainer = make_trainer(name, tiny_tool_model_path, tmp_path, counter_reward, train_dataset=prompts_dataset(),
                           environment_factory=CounterEnvironment)
    previous = parameters(trainer)
    script, batches = train_scripted(trainer, tool_tokenizer, COUNTER_TURNS)

    rows = trainer.args.per_device_train_batch_size
    results = [["1", "{'error': 'Tool decrement not found.'}", None][row_turn(name, i)] for i in range(rows)]  # per row
    calls, failures = sum(r is not None for r in results), sum(row_turn(name, i) == 1 for i in range(rows))
    assert trainer.state.log_history[-1]["train_loss"] is not None
    log = last_step_log(trainer)
    assert log["tools/call_frequency"] == pytest.approx(calls / rows)  # TRL: 2 / 3
    assert log["tools/failure_frequency"] == pytest.approx(failures / calls)  # TRL: 1 / 2
    # Each rollout has its own environment: incremented once by the valid call, untouched by the failed call and by
    # the row without a call.
    assert [env._counter for env in trainer.environments] == [[1, 0, 0][row_turn(name, i)] for i in range(rows)]
    spans = [span for span in tool_spans(batches, tool_tokenizer) if span]
    assert sorted(spans) == sorted(TOOL_SPAN.format(result=r) for r in results if r is not None)
    assert_params_changed(previous, trainer)


@pytest.mark.parametrize("name", list(TRAINERS))
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_train_with_environment_owned_reward(name, tiny_tool_model_path, tool_tokenizer, tmp_path):
    # No reward_funcs: the environment's get_reward (the final counter) is the only reward, logged under its class.
    trainer = make_trainer(name, tiny_tool_model_path, tmp_path, None, train_dataset=prompts_dataset(),
                           environment_factory=RewardedCounterEnvironment)
    assert trainer.reward_func_names == ["RewardedCounterEnvironment"]
    assert trainer.reward_weights.tolist() == [1.0]
    tool_names = [tool.__name__ for tool in trainer.tools]
    assert "increment" in tool_names and "get_reward" not in tool_names and "reset" not in tool_names
    previous = parameters(trainer)
    _, batches = train_scripted(trainer, tool_tokenizer, COUNTER_TURNS)

    # Counters 1, 0, 0 -> rewards 1.0, 0.0, 0.0: mean 1/3 (TRL; resets: turns 0, 1, 0, 1 -> 1/2).
    rows = trainer.args.per_device_train_batch_size
    mean = sum([1.0, 0.0, 0.0][row_turn(name, i)] for i in range(rows)) / rows
    assert last_step_log(trainer)["rewards/RewardedCounterEnvironment/mean"] == pytest.approx(mean)
    assert last_step_log(trainer)["reward"] == pytest.approx(mean)
    tool_spans(batches, tool_tokenizer)
    assert_params_changed(previous, trainer)


@pytest.mark.parametrize("name", list(TRAINERS))
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_environment_owned_reward_coexists_with_reward_funcs(name, tiny_tool_model_path, tmp_path):
    class DummyEnvironment:
        def reset(self, **kwargs):
            self._solved = False

        def guess(self, word: str) -> str:
            """
            Submit a guess.

            Args:
                word: The guessed word.

            Returns:
                Feedback about the guess.
            """
            return "nope"

        def get_reward(self) -> float:
            return 1.0 if self._solved else 0.0

    def format_reward(completions, **kwargs):
        return [0.0 for _ in completions]

    trainer = make_or_refuse(name, tiny_tool_model_path, tmp_path, format_reward, environment_factory=DummyEnvironment,
                           args=dict(max_steps=5, reward_weights=[0.5]))
    if trainer is None:
        return
    # The environment's reward comes after the trainer's reward functions, with weight 1.
    assert trainer.reward_func_names == ["format_reward", "DummyEnvironment"]
    assert trainer.reward_weights.tolist() == [0.5, 1.0]
    assert len(trainer.reward_funcs) == 2
    tool_names = [tool.__name__ for tool in trainer.tools]
    assert "guess" in tool_names and "get_reward" not in tool_names


@pytest.mark.parametrize("name", list(TRAINERS))
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_environment_owned_reward_mixed_environments(name, tiny_tool_model_path, tmp_path):
    class ScoredEnvironment:
        def reset(self, **kwargs): ...

        def act(self, x: int) -> int:
            """
            Act.

            Args:
                x: A value.

            Returns:
                The value.
            """
            return x

        def get_reward(self) -> float:
            return 1.0

    class PlainEnvironment:
        def reset(self, **kwargs): ...

        def play(self, x: int) -> int:
            """
            Play.

            Args:
                x: A value.

            Returns:
                The value.
            """
            return x

    def format_reward(completions, **kwargs):
        return [0.0 for _ in completions]

    dataset = Dataset.from_dict({"environment": ["scored", "scored2", "plain"]})
    trainer = make_or_refuse(name, tiny_tool_model_path, tmp_path, format_reward, train_dataset=dataset,
                           environment_factory={"scored": ScoredEnvironment, "scored2": ScoredEnvironment,
                                                "plain": PlainEnvironment})
    if trainer is None:
        return
    # One reward column per environment class owning a reward, however many names map to it.
    assert trainer.reward_func_names == ["format_reward", "ScoredEnvironment"]
    assert trainer.reward_weights.tolist() == [1.0, 1.0]
    assert trainer.reward_funcs[-1](environments=[ScoredEnvironment(), PlainEnvironment()]) == [1.0, None]


@pytest.mark.parametrize("name", list(TRAINERS))
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_train_with_multiple_environments(name, tiny_tool_model_path, tool_tokenizer, tmp_path):
    # A dict environment_factory: each example names its environment, whose tools alone it sees. With
    # shuffle_dataset=False and 2 generations, a batch of 4 is [counter, counter, echo, echo].
    reset_kwargs_seen = {"counter": [], "echo": []}
    tool_calls_made = {"increment": [], "shout": []}

    class Counter:
        def reset(self, **kwargs):
            reset_kwargs_seen["counter"].append(kwargs)
            return "Count."

        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            tool_calls_made["increment"].append(step)
            return step

    class Echo:
        def reset(self, **kwargs):
            reset_kwargs_seen["echo"].append(kwargs)
            return "Echo."

        def shout(self, text: str) -> str:
            """
            Shout the given text.

            Args:
                text: Text to shout.

            Returns:
                The text in upper case.
            """
            tool_calls_made["shout"].append(text)
            return text.upper()

    def answered_reward(completions, **kwargs):  # the rows whose tool answered
        return [float(any(m["role"] == "tool" for m in c)) for c in completions]

    dataset = Dataset.from_dict({"environment": ["counter", "echo"] * 8})
    # resets: 4 generations per prompt, so a batch of 8 = [counter] * 4 + [echo] * 4 (after the trainer's settings)
    trainer = make_or_refuse(name, tiny_tool_model_path, tmp_path, answered_reward, train_dataset=dataset,
                           environment_factory={"counter": Counter, "echo": Echo},
                           args=dict(per_device_train_batch_size=4, num_generations=2, shuffle_dataset=False),
                           last=dict(per_device_train_batch_size=8) if name in RESETS else {})
    if trainer is None:
        return
    assert [tool.__name__ for tool in trainer._env_tools["counter"]] == ["increment"]
    assert [tool.__name__ for tool in trainer._env_tools["echo"]] == ["shout"]
    assert len(trainer._environment_pool["counter"]) == 1 and len(trainer._environment_pool["echo"]) == 1
    previous = parameters(trainer)
    # Rows: counter (valid increment), counter (no call), echo (valid shout), echo (no call).
    first_turns = [tool_call("increment", '{"step": 1}'), "I won't<|im_end|>", tool_call("shout", '{"text": "hi"}'),
                   DONE]
    _, batches = train_scripted(trainer, tool_tokenizer, first_turns)

    assert trainer.state.log_history[-1]["train_loss"] is not None
    log = last_step_log(trainer)
    assert tool_calls_made["increment"] and tool_calls_made["shout"]
    assert reset_kwargs_seen["counter"] and reset_kwargs_seen["echo"]
    assert all("environment" not in kwargs for kwargs in reset_kwargs_seen["counter"] + reset_kwargs_seen["echo"])
    spans = sorted(s for s in tool_spans(batches, tool_tokenizer) if s)
    if name not in RESETS:
        assert log["tools/call_frequency"] == pytest.approx(2 / 4)
        assert log["tools/failure_frequency"] == pytest.approx(0.0)
        assert spans == sorted([TOOL_SPAN.format(result="1"), TOOL_SPAN.format(result="HI")])
    else:
        # The round-1 call's 8 rows answer turns 0-3, 0-3: counter base (increment, won't), candidates (shout: not
        # a counter tool, an error result but a tool message, so 1.0; done: 0.0 -> the seed); echo base (increment:
        # not an echo tool, an error; won't), candidates (shout; done -> the seed). Both seeds are one thought: reset
        # at the question; the 4-row suffix call answers turns 0-3: counter (increment, won't), echo (shout, done).
        # Training rows: counter increment, won't, increment, won't; echo increment (error), won't, shout, done:
        # 4 calls in 8 rows, 1 failure in 4 calls.
        assert log["tools/call_frequency"] == pytest.approx(4 / 8)
        assert log["tools/failure_frequency"] == pytest.approx(1 / 4)
        error = "{'error': 'Tool increment not found.'}"
        assert spans == sorted([TOOL_SPAN.format(result="1")] * 2 + [TOOL_SPAN.format(result=error),
                                                                    TOOL_SPAN.format(result="HI")])
    assert_params_changed(previous, trainer)


@pytest.mark.parametrize("name", list(TRAINERS))
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_train_with_unknown_environment_raises(name, tiny_tool_model_path, tmp_path):
    dataset = prompts_dataset(environment=["unknown"] * 6)
    trainer = make_trainer(name, tiny_tool_model_path, tmp_path, tool_result_reward, train_dataset=dataset,
                           environment_factory={"counter": CounterEnvironment})
    with pytest.raises(ValueError, match="not among the environments"):
        trainer.train()


@pytest.mark.parametrize("name", list(TRAINERS))
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_train_with_environment_owned_data(name, tiny_tool_model_path, tool_tokenizer, tmp_path):
    # No train_dataset: reset() returns the prompt and max_steps sets the length.
    class GuessTheWordEnvironment:
        def reset(self, **kwargs):
            return "Guess the 5-letter word."

    def reward_len(completions, **kwargs):
        return [float(len(completion[-1]["content"])) for completion in completions]

    trainer = make_or_refuse(name, tiny_tool_model_path, tmp_path, reward_len,
                           environment_factory=GuessTheWordEnvironment, args=dict(max_steps=2, max_completion_length=8))
    if trainer is None:
        return
    previous = parameters(trainer)
    script, _ = train_scripted(trainer, tool_tokenizer, ["Done!<|im_end|>", "DoneDone!<|im_end|>",
                                                         "DoneDoneDone!<|im_end|>"])
    assert "Guess the 5-letter word." in script.calls[0][0][1]  # the environment's prompt was generated from
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert_params_changed(previous, trainer)


# ---------------------------------------------------------------------------------------------------- rollout_func
@pytest.mark.parametrize("name", sorted(set(TRAINERS) - OWN_ROLLOUTS))  # resets, trees refuse a rollout_func (below)
def test_train_with_rollout_func_env_mask(name, tiny_tool_model_path, tool_tokenizer, tmp_path):
    # Not one of TRL's tests (TRL checks rollout_func with mocks): a user's rollout_func returning an env_mask, the
    # environment's tokens between two model turns. TRL takes env_mask as its tool_mask; the environment's tokens
    # must reach the loss as tool_mask = 0, with no per-token advantage, as a tool result does.
    environment_text = "\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n" + ASSISTANT_START
    turns = [(tool_call("multiply_tool", '{"a": 3, "b": 4}'), "12"), (tool_call("multiply_tool", '{"a": 3, "b": 5}'),
                                                                       "15"), ("I don't know any tool<|im_end|>", None)]

    def rollout_func(prompts, trainer):
        encode = lambda text: tool_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        prompt_ids, completion_ids, env_mask = [], [], []
        for i, prompt in enumerate(prompts):
            prompt_ids.append(tool_tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                                 return_dict=False))
            first, result = turns[i % 3]
            ids, mask = encode(first), [1] * len(encode(first))
            if result is not None:
                environment, last = encode(environment_text.format(result=result)), encode(DONE)
                ids, mask = ids + environment + last, mask + [0] * len(environment) + [1] * len(last)
            completion_ids.append(ids)
            env_mask.append(mask)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None, "env_mask": env_mask}

    def product_reward(completion_ids, **kwargs):  # 1.0 when the environment answered 12
        return [float("12" in tool_tokenizer.decode(ids)) for ids in completion_ids]

    trainer = make_trainer(name, tiny_tool_model_path, tmp_path, product_reward, train_dataset=prompts_dataset(),
                           rollout_func=rollout_func)
    previous = parameters(trainer)
    batches = record_loss_inputs(trainer)
    trainer.train()

    rows = trainer.args.per_device_train_batch_size
    assert sorted(s for s in tool_spans(batches, tool_tokenizer) if s) == sorted(
        environment_text.format(result=turns[i % 3][1]) for i in range(rows) if turns[i % 3][1] is not None)
    assert last_step_log(trainer)["reward"] == pytest.approx(sum(i % 3 == 0 for i in range(rows)) / rows)
    assert_params_changed(previous, trainer)


def test_the_loss_check_catches_credit_or_loss_on_tool_tokens(tool_tokenizer):
    # The check every test above runs on the loss inputs, on one hand-built row: a tool call, its result, 'Done!'.
    encode = lambda text: tool_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    call, span, done = encode(tool_call("multiply_tool", '{"a": 3, "b": 4}')), encode(TOOL_SPAN.format(result="12")), \
        encode(DONE)
    ids = torch.tensor([call + span + done])
    tool_mask = torch.tensor([[1] * len(call) + [0] * len(span) + [1] * len(done)])
    batch = dict(completion_ids=ids, completion_mask=torch.ones_like(ids), tool_mask=tool_mask)
    per_token = torch.ones(ids.shape) * tool_mask
    assert tool_spans([dict(batch, advantages=per_token)], tool_tokenizer) == [TOOL_SPAN.format(result="12")]
    assert tool_spans([dict(batch, advantages=torch.ones(1))], tool_tokenizer) == [TOOL_SPAN.format(result="12")]
    with pytest.raises(AssertionError, match="a tool-result token got an advantage"):
        tool_spans([dict(batch, advantages=torch.ones(ids.shape))], tool_tokenizer)
    with pytest.raises(AssertionError, match="tool-result tokens count as the model's"):
        tool_spans([dict(batch, tool_mask=torch.ones_like(ids), advantages=torch.ones(1))], tool_tokenizer)


# ---------------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("name", "argument"), [(name, argument) for name in REFUSING
                                                 for argument in ("tools", "environment_factory", "rollout_func")]
                         + [(name, "rollout_func") for name in sorted(OWN_ROLLOUTS)])
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_rollouts_that_generate_themselves_refuse_multi_turn_by_name(name, argument, tiny_tool_model_path, tmp_path):
    class Environment:
        def reset(self, **kwargs):
            return None

        def multiply(self, a: int, b: int) -> int:
            """
            Multiplies two integers.

            Args:
                a: The first integer.
                b: The second integer.

            Returns:
                The product.
            """
            return a * b

    given = {"tools": [multiply_tool], "environment_factory": Environment,
             "rollout_func": lambda prompts, trainer: {}}[argument]
    with pytest.raises(ValueError, match=rf"does not support (a custom )?`{argument}`.*credit='oppo'"):
        make_trainer(name, tiny_tool_model_path, tmp_path, tool_tag_reward, train_dataset=prompts_dataset(),
                     **{argument: given})
