"""The tool regime (docs/testbed.md#the-tool-regime): the key-chain task's checker, environment and supervised
episodes on hand-worked transcripts, the regime's registration, one GRPO step through TRL's tool loop with its
environment, and (slow) the committed model's start statistics."""

import json
import os
import random

import pytest

from trl_credit.tasks import keychain
from trl_credit.tasks.keychain import KeyChainEnvironment, expected_calls, first_wrong_call

RESULTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "results")
MODEL = os.path.join(RESULTS, "tools", "model")

# A hand-made episode: oak -> fern -> lime -> teal (a colour: the answer). lime is a trap key (a fruit): its twin
# lemon is the decoy, whose chain (as long as what was left of the true one: lemon alone) ends in another colour.
STORE = {"oak": "fern", "fern": "lime", "lime": "teal", "lemon": "navy"}
RIGHT = [("lookup", "oak"), ("lookup", "fern"), ("lookup", "lime"), ("submit", "teal")]


def test_expected_calls_follow_the_chain_then_submit_its_answer():
    assert expected_calls(STORE, "oak") == RIGHT
    assert expected_calls(json.dumps(STORE), "fern") == RIGHT[1:]  # the store as the dataset holds it (JSON)


@pytest.mark.parametrize("calls, wrong", [
    (RIGHT, (None, None)),
    ([*RIGHT[:2], ("lookup", "lemon"), ("submit", "navy")], (3, "planted")),  # the trap key copied as its twin
    ([*RIGHT[:1], ("lookup", "elm")], (2, "argument")),  # another key
    ([*RIGHT[:3], ("submit", "navy")], (4, "argument")),  # another answer
    ([*RIGHT[:1], ("submit", "teal")], (2, "tool")),  # submitted before the chain's end
    (RIGHT[:2], (3, "missing")),  # stopped after two lookups: the third call is missing
    ([], (1, "missing")),
    ([*RIGHT, ("lookup", "oak")], (5, "extra")),
    ([("lookup", "oak"), ("lookup", "lemon")], (2, "argument")),  # the twin where no trap key was due
])
def test_first_wrong_call_and_its_kind(calls, wrong):
    assert first_wrong_call(STORE, "oak", calls) == wrong


def test_the_environment_plays_the_tools_and_reports_the_outcome_and_the_turn_rewards():
    env = KeyChainEnvironment()
    assert env.reset(store=json.dumps(STORE), start="oak", answer="teal", prompt=[]) is None
    assert env.lookup("oak") == "fern" and env.lookup("fern") == "lime" and env.lookup("lime") == "teal"
    assert env.get_reward() == 0.0  # nothing submitted yet
    assert env.submit("teal") == "ok" and env.get_reward() == 1.0
    # one reward per model turn: the four calls right (1.0), then the closing turn, scored by the outcome (None)
    assert env.turn_rewards == [1.0, 1.0, 1.0, 1.0, None]
    with pytest.raises(ValueError, match="already submitted"):  # TRL turns a raising tool into an error result
        env.submit("navy")
    assert env.get_reward() == 1.0 and env.first_wrong == (5, "extra")
    assert env.turn_rewards == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]  # the extra call and the closing turn after it

    env.reset(store=STORE, start="oak")  # the planted error: the decoy's answer is submitted
    env.lookup("oak"), env.lookup("fern")
    assert env.lookup("lemon") == "navy"
    env.submit("navy")
    assert env.get_reward() == 0.0 and env.first_wrong == (3, "planted")
    assert env.turn_rewards == [1.0, 1.0, 0.0, 0.0, 0.0]  # 1 before the first wrong call, 0 from it on

    env.reset(store=STORE, start="oak")  # an unknown key raises (TRL: an error result); the episode then stops
    env.lookup("oak")
    with pytest.raises(KeyError, match="no key elm"):
        env.lookup("elm")
    assert env.turn_rewards == [1.0, 0.0, 0.0] and env.get_reward() == 0.0

    env.reset(store=STORE, start="oak")  # stopped short: the closing turn is the missing call
    env.lookup("oak")
    assert env.turn_rewards == [1.0, 0.0]


def test_only_the_tools_are_public_methods_of_the_environment():
    import inspect

    # TRL offers every public function of the class but reset and get_reward to the model as a tool
    # (GRPOTrainer.__init__, trl 1.16); properties are not functions
    public = [name for name, _ in inspect.getmembers(KeyChainEnvironment, predicate=inspect.isfunction)
              if not name.startswith("_")]
    assert sorted(public) == ["get_reward", "lookup", "reset", "submit"]


def test_episodes_hold_chains_of_three_to_six_keys_with_a_decoy_behind_every_trap_key():
    rng = random.Random(3)
    lengths, traps = [], []
    for _ in range(400):
        episode = keychain.make_episode(rng)
        store, calls = episode["store"], expected_calls(episode["store"], episode["start"])
        keys = [key for _, key in calls[:-1]]
        assert calls[-1] == ("submit", episode["answer"]) and episode["answer"] in keychain.ANSWERS
        assert len(set(keys)) == len(keys)
        lengths.append(len(keys))
        trap_keys = [k for k in keys if k in keychain.TRAPS]
        traps.append(len(trap_keys))
        for index, key in enumerate(keys):
            if key in trap_keys:  # the decoy chain: as many keys as the true one has left, another answer
                decoy = expected_calls(store, keychain.TRAPS[key])
                assert len(decoy) == len(keys) - index + 1 and decoy[-1][1] != episode["answer"]
                assert all(k in keychain.KEYS and k not in keys for _, k in decoy[1:-1])
    assert set(lengths) == {3, 4, 5, 6}
    shares = [traps.count(n) / len(traps) for n in range(4)]  # TRAP_COUNTS: 0.4, 0.3, 0.2, 0.1 (3 <= every length)
    assert abs(shares[0] - 0.4) < 0.06 and abs(shares[1] - 0.3) < 0.06 and abs(shares[3] - 0.1) < 0.05


def test_scripted_episodes_miscopy_the_trap_keys_at_the_stated_rate_and_nothing_else():
    rng = random.Random(5)
    trap_total = trap_miscopied = other_wrong = 0
    for _ in range(600):
        episode = keychain.make_episode(rng)
        messages = keychain.scripted_episode(episode, 0.8, rng)["messages"]
        calls = [(m["tool_calls"][0]["function"]["name"], *m["tool_calls"][0]["function"]["arguments"].values())
                 for m in messages if m.get("tool_calls")]
        assert messages[-1] == {"role": "assistant", "content": keychain.CLOSING}
        wrong, kind = first_wrong_call(episode["store"], episode["start"], calls)
        due = expected_calls(episode["store"], episode["start"])
        # every call before the first wrong one is right; the traps met before it were copied right
        for name, key in due[: (wrong or len(due) + 1) - 1]:
            trap_total += name == "lookup" and key in keychain.TRAPS
        if wrong is not None:
            other_wrong += kind != "planted"
            trap_total += 1
            trap_miscopied += 1
    assert other_wrong == 0  # only the trap errs
    assert 0.75 < trap_miscopied / trap_total < 0.85  # 0.8 asked
def test_the_regime_is_registered_and_the_sums_runner_refuses_it_by_name():
    from trl_credit.testbed import runner
    from trl_credit.testbed.regimes import REGIMES, regime_recipe
    from trl_credit.testbed.tool_regime import ToolRecipe

    assert isinstance(regime_recipe("tools"), ToolRecipe) and "tools" in REGIMES
    with pytest.raises(ValueError, match="tools.*environment_factory"):
        runner.run(None, None, seed=0, learning_rate=1e-3, regime="tools")


def test_the_committed_build_is_the_default_recipe():
    from trl_credit.testbed.tool_regime import ToolRecipe, tool_regime_model_path

    with open(os.path.join(MODEL, "build.json")) as f:
        assert json.load(f)["digest"] == ToolRecipe().digest()
    assert tool_regime_model_path(build=False) == MODEL


def test_every_word_of_the_task_is_one_token_of_the_regimes_tokenizer():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    for word in keychain.WORDS:  # as a call's argument, a tool's result and the question quote them
        for text in (f'{{"key": "{word}"}}', f"\n{word}\n", f'from "{word}" and'):
            assert word in tokenizer.tokenize(text), (word, tokenizer.tokenize(text))


def _train_one_step(tmp_path, trainer_class, config_class, **fields):
    from trl_credit.testbed.tool_regime import MAX_COMPLETION_LENGTH, MAX_TOOL_CALLS

    data = keychain.make_dataset(num_train=8, num_test=4, seed=7)
    args = config_class(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1, logging_steps=1,
                        save_strategy="no", per_device_train_batch_size=8, num_generations=4, learning_rate=1e-3,
                        max_completion_length=MAX_COMPLETION_LENGTH, max_tool_calling_iterations=MAX_TOOL_CALLS,
                        beta=0.0, disable_tqdm=True, seed=0, **fields)
    trainer = trainer_class(model=MODEL, reward_funcs=None, args=args, train_dataset=data["train"],
                            environment_factory=KeyChainEnvironment)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    moved = any(not (p.detach() == before[n]).all() for n, p in trainer.model.named_parameters())
    return trainer.state.log_history[0], moved


def test_one_grpo_step_through_trls_tool_loop_with_the_environment(tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    log, moved = _train_one_step(tmp_path, GRPOTrainer, GRPOConfig)
    # the built model plays the episodes: 4-7 calls each (TRL's call count per rollout), rewards from get_reward
    assert 3.5 <= log["tools/call_frequency"] <= 8
    assert "rewards/KeyChainEnvironment/mean" in log
    assert moved  # a step was taken: the rewards of the 2 prompts' groups vary, or the loss is not 0


def test_one_process_credit_step_reads_one_turn_reward_per_model_turn(tmp_path):
    from trl_credit import CreditConfig, CreditTrainer

    log, _ = _train_one_step(tmp_path, CreditTrainer, CreditConfig, credit="process",
                             process_step_reward="environment", process_outcome="final_step")
    # a step per model turn (4-7 calls and the closing turn), and turn_rewards aligned with them on every row: a
    # length mismatch would leave the row unscored
    assert 4.5 <= log["process/steps_per_completion"] <= 9
    assert log["process/unscored_row_rate"] == 0.0


@pytest.mark.slow
def test_the_committed_model_meets_the_start_conditions():
    """The committed build (benchmarks/results/tools/model), measured through TRL's tool loop as
    benchmarks/results/tools/base_profile.json records, on fewer rows (~2 CPU-minutes): greedy <= 0.6, >= 15% of
    training groups of 8 all-fail at T=1, pass@8 and pass@16 below 1, episodes of 3-8 tool calls, the planted error
    the commonest first wrong call, and greedy failing where (and only where) a trap key is."""
    from trl_credit.testbed.tool_regime import tool_profile

    data = keychain.make_dataset()
    profile = tool_profile(MODEL, data["test"].select(range(128)), data["train"], train_rows=128, test_rows=64,
                           passk_samples=16, passk_rows=16)
    assert profile["greedy_accuracy"] <= 0.6
    assert profile["train_all_fail_share"] >= 0.15
    assert profile["pass_at_k"]["8"] < 1.0 and profile["pass_at_k_large"]["16"] < 1.0
    for reading, share in (("greedy", 0.95), ("t1_test", 0.9)):  # measured: 1.0 and 0.98 (base_profile.json)
        calls = profile[reading]["calls_histogram"]
        assert sum(n for k, n in calls.items() if 3 <= int(k) <= 8) / sum(calls.values()) >= share, reading
    for reading in ("greedy", "t1_test", "t1_train"):
        kinds = dict(profile[reading]["first_wrong_kinds"], right=0)
        assert max(kinds, key=kinds.get) == "planted", reading
    # systematic: greedy solves the trap-free chains and none with a trap key
    assert profile["by_trap_keys"]["0"]["greedy"] >= 0.9
    assert all(profile["by_trap_keys"][n]["greedy"] <= 0.1 for n in profile["by_trap_keys"] if n != "0")


# SRPO's oracle resets in the regime read the first wrong call from the transcript (keychain.transcript_first_wrong):
# one step per model turn, as srpo/multiturn.py's transcript_texts shows it (the turn's text, then its tool results).
QUESTION = keychain.QUESTION.format(start="oak")


def _turn(name, argument, result=None):
    key = "key" if name == "lookup" else "answer"
    text = f'<tool_call>\n{{"name": "{name}", "arguments": {{"{key}": "{argument}"}}}}\n</tool_call>'
    return text + (f"\nTool result: {result}" if result is not None else "")


def _transcript(calls, closing=True):
    env = KeyChainEnvironment()
    env.reset(store=json.dumps(STORE), start="oak")
    thoughts = []
    for name, argument in calls:
        try:
            result = getattr(env, name)(argument)
        except Exception as error:  # as TRL's loop records a failed call
            result = str({"error": str(error)})
        thoughts.append(_turn(name, argument, result))
    return thoughts + ([keychain.CLOSING] if closing else [])


@pytest.mark.parametrize("calls, step", [
    (RIGHT, None),  # every call copies the last result, the answer submitted, then the closing turn
    ([*RIGHT[:2], ("lookup", "lemon"), ("submit", "navy")], 3),  # lemon where the last result said lime
    ([*RIGHT[:1], ("lookup", "elm")], 2),
    ([*RIGHT[:3], ("submit", "navy")], 4),
    ([*RIGHT[:1], ("submit", "teal")], 2),  # a submission where a key was due (the result was fern)
    (RIGHT[:2], 3),  # stopped after two lookups: the closing turn (step 3) is where the third call was due
    ([*RIGHT, ("lookup", "oak")], 5),  # a call after the right submission
])
def test_transcript_checker_finds_the_first_wrong_call(calls, step):
    assert keychain.transcript_first_wrong(QUESTION, _transcript(calls)) == step


def test_transcript_checker_reads_an_unparsed_call_and_a_cut_transcript_as_the_missing_call():
    thoughts = _transcript(RIGHT[:2], closing=False) + ['<tool_call>\n{"name": "lookup", "argum']
    assert keychain.transcript_first_wrong(QUESTION, thoughts) == 3
    assert keychain.transcript_first_wrong(QUESTION, _transcript(RIGHT[:2], closing=False)) == 2  # ends: the last step


def test_transcript_checker_agrees_with_the_environments_checker_on_scripted_episodes():
    # Independent reference: first_wrong_call, which knows the store; one call per model turn, so call k is step k.
    rng = random.Random(3)
    data = keychain.make_dataset(num_train=200, num_test=1)["train"]
    kinds = set()
    for row in data:
        episode = keychain.scripted_episode(row, 0.8, rng)
        calls, thoughts = [], []
        messages = episode["messages"][1:]
        for message in messages:
            if message["role"] == "assistant" and message.get("tool_calls"):
                function = message["tool_calls"][0]["function"]
                calls.append((function["name"], next(iter(function["arguments"].values()))))
                thoughts.append(_turn(function["name"], calls[-1][1]))
            elif message["role"] == "tool":
                thoughts[-1] += f"\nTool result: {message['content']}"
            else:
                thoughts.append(message["content"])
        wrong, kind = first_wrong_call(row["store"], row["start"], calls)
        kinds.add(kind)
        assert keychain.transcript_first_wrong(row["prompt"][0]["content"], thoughts) == wrong
    assert kinds == {None, "planted"}  # both right episodes and planted errors were checked
