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

# A hand-made episode: 417 -> 352 -> 168 -> answer 52. 168 is a trap key (one 8): its mis-copy 169 is the decoy,
# whose chain (as long as what was left of the true one: 169 alone) ends in another answer, 37.
STORE = {"417": "key 352", "352": "key 168", "168": "answer 52", "169": "answer 37"}
RIGHT = [("lookup", 417), ("lookup", 352), ("lookup", 168), ("submit", 52)]


def test_expected_calls_follow_the_chain_then_submit_its_answer():
    assert expected_calls(STORE, 417) == RIGHT
    assert expected_calls(json.dumps(STORE), 352) == RIGHT[1:]  # the store as the dataset holds it (JSON)


@pytest.mark.parametrize("calls, wrong", [
    (RIGHT, (None, None)),
    ([*RIGHT[:2], ("lookup", 169), ("submit", 37)], (3, "planted")),  # the trap key's 8 copied as 9
    ([*RIGHT[:1], ("lookup", 325)], (2, "argument")),  # another key
    ([*RIGHT[:3], ("submit", 25)], (4, "argument")),  # another answer
    ([*RIGHT[:1], ("submit", 52)], (2, "tool")),  # submitted before the chain's end
    (RIGHT[:2], (3, "missing")),  # stopped after two lookups: the third call is missing
    ([], (1, "missing")),
    ([*RIGHT, ("lookup", 417)], (5, "extra")),
    ([("lookup", 417), ("lookup", 359)], (2, "argument")),  # a 2 -> 9 copy where no trap key was due
])
def test_first_wrong_call_and_its_kind(calls, wrong):
    assert first_wrong_call(STORE, 417, calls) == wrong


def test_the_environment_plays_the_tools_and_reports_the_outcome_and_the_turn_rewards():
    env = KeyChainEnvironment()
    assert env.reset(store=json.dumps(STORE), start=417, answer="52", prompt=[]) is None
    assert env.lookup(417) == "key 352" and env.lookup(352) == "key 168" and env.lookup(168) == "answer 52"
    assert env.get_reward() == 0.0  # nothing submitted yet
    assert env.submit(52) == "ok" and env.get_reward() == 1.0
    # one reward per model turn: the four calls right (1.0), then the closing turn, scored by the outcome (None)
    assert env.turn_rewards == [1.0, 1.0, 1.0, 1.0, None]
    with pytest.raises(ValueError, match="already submitted"):  # TRL turns a raising tool into an error result
        env.submit(37)
    assert env.get_reward() == 1.0 and env.first_wrong == (5, "extra")
    assert env.turn_rewards == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]  # the extra call and the closing turn after it

    env.reset(store=STORE, start=417)  # the planted error: the decoy's answer is submitted
    env.lookup(417), env.lookup(352)
    assert env.lookup(169) == "answer 37"
    env.submit(37)
    assert env.get_reward() == 0.0 and env.first_wrong == (3, "planted")
    assert env.turn_rewards == [1.0, 1.0, 0.0, 0.0, 0.0]  # 1 before the first wrong call, 0 from it on

    env.reset(store=STORE, start=417)  # an unknown key raises (TRL: an error result); the episode then stops
    env.lookup(417)
    with pytest.raises(KeyError, match="no key 325"):
        env.lookup(325)
    assert env.turn_rewards == [1.0, 0.0, 0.0] and env.get_reward() == 0.0

    env.reset(store=STORE, start=417)  # stopped short: the closing turn is the missing call
    env.lookup(417)
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
        assert calls[-1] == ("submit", episode["answer"]) and "8" not in str(episode["answer"])
        lengths.append(len(keys))
        trap_keys = [k for k in keys if "8" in str(k)]
        traps.append(len(trap_keys))
        assert all(str(k).count("8") == 1 for k in trap_keys)
        for index, key in enumerate(keys):
            if key in trap_keys:  # the decoy chain: as many keys as the true one has left, another answer
                decoy = expected_calls(store, keychain.miscopy(key))
                assert len(decoy) == len(keys) - index + 1 and decoy[-1][1] != episode["answer"]
                assert all("8" not in str(k) for _, k in decoy[:-1])
    assert set(lengths) == {3, 4, 5, 6}
    shares = [traps.count(n) / len(traps) for n in range(4)]  # TRAP_COUNTS: 0.4, 0.3, 0.2, 0.1 (capped by length)
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
            trap_total += name == "lookup" and "8" in str(key)
        if wrong is not None:
            other_wrong += kind != "planted"
            trap_total += 1
            trap_miscopied += 1
    assert other_wrong == 0  # only the trap errs
    assert 0.75 < trap_miscopied / trap_total < 0.85  # 0.8 asked
