"""examples/train_agent.py: its environment, its process step reward, and a one-step run as a user starts it."""

import importlib.util
import json
import os
import random

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def agent():
    spec = importlib.util.spec_from_file_location("train_agent", os.path.join(ROOT, "examples", "train_agent.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_environment_rewards_the_stored_value_submitted_once(agent):
    env = agent.KeyValueEnvironment()
    assert env.reset(store='{"fig": 41, "kiwi": 17}', key="kiwi", prompt=[], answer="17") is None
    assert env.lookup("kiwi") == "17"
    with pytest.raises(KeyError, match="no key 'plum'"):  # TRL turns a raising tool into an error result
        env.lookup("plum")
    assert env.get_reward() == 0.0  # nothing submitted
    assert env.submit(17) == "submitted" and env.get_reward() == 1.0
    with pytest.raises(ValueError, match="already submitted"):
        env.submit(41)
    env.reset(store='{"fig": 41, "kiwi": 17}', key="fig")
    env.submit(17)
    assert env.get_reward() == 0.0  # the value of another key


def test_the_dataset_asks_for_a_key_of_its_store_and_the_answer_is_its_value(agent):
    rows = agent.make_dataset(6, num_keys=3, seed=0)
    for row in rows:
        store = json.loads(row["store"])
        assert len(store) == 3 and row["key"] in store and row["answer"] == str(store[row["key"]])
        assert row["key"] in row["prompt"][0]["content"]


def test_a_scripted_episode_plays_the_tools_and_a_wrong_one_submits_another_value(agent):
    row = agent.make_dataset(1, num_keys=3, seed=0)[0]
    right = agent.scripted_episode(row, wrong=False, rng=random.Random(0))["messages"]
    wrong = agent.scripted_episode(row, wrong=True, rng=random.Random(0))["messages"]
    assert [m["role"] for m in right] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert right[2]["content"] == row["answer"]  # the lookup returned the stored value
    submitted = [m["tool_calls"][0]["function"]["arguments"]["value"] for m in (right[3], wrong[3])]
    assert submitted[0] == int(row["answer"]) and submitted[1] != int(row["answer"])


def test_the_environment_reports_a_turn_reward_per_tool_call_and_none_for_the_answer(agent):
    env = agent.KeyValueEnvironment()
    env.reset(store=json.dumps({"fig": 41, "kiwi": 12}), key="fig")
    env.lookup("kiwi")  # another key: 0
    env.lookup("fig")  # the asked key: 1
    env.submit(40)  # a wrong value: 0
    assert env.turn_rewards == [0.0, 1.0, 0.0, None]
    env.reset(store=json.dumps({"fig": 41}), key="fig")
    env.submit(41)
    assert env.turn_rewards == [1.0, None] and env.get_reward() == 1.0


def test_one_grpo_step_on_the_warm_started_tiny_tool_model(agent, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRL_CREDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    argv = ["--method", "grpo", "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
            "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "48",
            "--num_train", "8", "--warm_start_episodes", "8", "--warm_start_steps", "2",
            "--warm_start_batch_size", "2", "--use_cpu", "true"]
    trainer = agent.main(argv)
    assert trainer.state.global_step == 1
    assert type(trainer).__name__ == "GRPOTrainer"
    assert trainer.reward_func_names == ["KeyValueEnvironment"]  # the environment owns the reward
    assert {tool.__name__ for tool in trainer.tools} == {"lookup", "submit"}
    log = next(entry for entry in trainer.state.log_history if "loss" in entry)
    assert {"tools/call_frequency", "tools/failure_frequency", "rewards/KeyValueEnvironment/mean"} <= set(log)
    (model,) = os.listdir(tmp_path / "cache")  # the warm-started tool model, built into the cache
    build = json.loads(open(tmp_path / "cache" / model / "build.json").read())
    assert build["warm_start"]["conversations"] == 8 and build["warm_start"]["steps"] == 2
    assert "model.safetensors" in os.listdir(tmp_path / "out")
    printed = capsys.readouterr().out
    assert "== GRPO agent run finished: 1 optimizer step ==" in printed and "tools/call_frequency" in printed


def test_every_method_flag_names_a_trainer(agent):
    trainers = agent._trainers()
    assert sorted(trainers) == sorted(agent.METHODS)
    assert trainers["prime"][2]["credit"] == "implicit_prm" and trainers["process"][2]["credit"] == "process"


@pytest.mark.parametrize(("method", "metric"), [("oppo", "oppo/value_mean"), ("process", "process/steps_per_completion"),
                                               ("datpo", "datpo/replay_mismatch_rate")])
def test_one_step_of_a_credit_rule_on_the_agent(method, metric, agent, tmp_path, monkeypatch):
    # The per-token credits on the environment's episodes: OPPO's value recursion, the process credit on the
    # environment's turn rewards (process_step_reward="environment"); DATPO's trees, their branches resumed from forks
    # inside the episodes (each branch's environment replayed to its fork: the store is deterministic, rate 0).
    monkeypatch.setenv("TRL_CREDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    argv = ["--method", method, "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
            "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "48",
            "--num_train", "8", "--warm_start_episodes", "8", "--warm_start_steps", "2",
            "--warm_start_batch_size", "2", "--use_cpu", "true"]
    trainer = agent.main(argv)
    assert trainer.state.global_step == 1
    log = next(entry for entry in trainer.state.log_history if "loss" in entry)
    assert metric in log and "tools/call_frequency" in log
    if method == "datpo":
        assert log["datpo/replay_mismatch_rate"] == 0.0 and log["datpo/leaves_per_prompt"] > 4  # branches grew
