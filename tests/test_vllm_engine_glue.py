"""The two places trl_credit changes how TRL drives a colocated vLLM, with the engine faked at its boundary (the real
engine runs them in tests/engines/test_vllm_colocate.py, marker ``vllm``):

- ``trl_bridge.vllm_push``: on vLLM's CPU platform the weights go through vLLM's ``reload_weights`` (TRL's push
  cannot load there), with TRL's own weight stream; anywhere else TRL's push is left alone;
- ``generation.vllm_hooks``: each row of a call gets its own ``max_tokens`` in colocate mode without tensor
  parallelism; anywhere else the call is left alone.
"""

import sys
import types

import pytest

from trl_credit.generation.vllm_hooks import vllm_row_budgets
from trl_credit.trl_bridge.vllm_push import fix_colocate_push


class Params:  # vLLM's SamplingParams, as far as the hook uses it
    def __init__(self, max_tokens):
        self.max_tokens = max_tokens

    def clone(self):
        return Params(self.max_tokens)


class FakeLLM:
    def __init__(self):
        self.calls, self.prefix_resets = [], 0

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.calls.append((prompts, sampling_params))
        return ["out"] * len(prompts)

    def reset_prefix_cache(self):
        self.prefix_resets += 1

    def wake_up(self, tags=None):
        self.woken = tags


class FakeRunner:
    def __init__(self):
        self.reloaded = None

    def reload_weights(self, weights_iterator=None):
        self.reloaded = list(weights_iterator)


def fake_vllm_generation(mode="colocate", tensor_parallel_size=1, enable_sleep_mode=False):
    llm = FakeLLM()
    runner = FakeRunner()
    llm.llm_engine = types.SimpleNamespace(
        model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner)))
    generation = types.SimpleNamespace(mode=mode, tensor_parallel_size=tensor_parallel_size, llm=llm,
                                       enable_sleep_mode=enable_sleep_mode, _llm_weights_sleeping=enable_sleep_mode)
    generation.trl_pushes = 0

    def sync_weights():
        generation.trl_pushes += 1

    generation.sync_weights = sync_weights
    generation._iter_named_params = lambda: iter([("a.weight", 1), ("b.weight", 2)])
    return generation, runner


@pytest.fixture
def platform(monkeypatch):
    """vllm.platforms.current_platform, faked: set ``.cpu`` to choose the platform."""
    state = types.SimpleNamespace(cpu=True)
    module = types.ModuleType("vllm.platforms")
    module.current_platform = types.SimpleNamespace(is_cpu=lambda: state.cpu)
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.platforms", module)
    return state


def test_cpu_colocate_push_streams_trls_weights_through_reload_weights(platform):
    generation, runner = fake_vllm_generation(enable_sleep_mode=True)
    trainer = types.SimpleNamespace(use_vllm=True, vllm_generation=generation)
    assert fix_colocate_push(trainer)
    generation.sync_weights()
    assert runner.reloaded == [("a.weight", 1), ("b.weight", 2)]  # TRL's stream, whole, in order
    assert generation.trl_pushes == 0  # TRL's push did not run
    assert generation.llm.prefix_resets == 1 and generation.llm.woken == ["weights"]
    assert generation._llm_weights_sleeping is False


@pytest.mark.parametrize("case", ["gpu", "server", "no_vllm"])
def test_trls_push_stays_where_it_works(platform, case):
    platform.cpu = case != "gpu"
    generation, runner = fake_vllm_generation(mode="server" if case == "server" else "colocate")
    trainer = types.SimpleNamespace(use_vllm=case != "no_vllm", vllm_generation=generation)
    assert not fix_colocate_push(trainer)
    generation.sync_weights()
    assert generation.trl_pushes == 1 and runner.reloaded is None


def test_each_row_gets_its_budget_in_colocate_mode():
    generation, _ = fake_vllm_generation()
    llm = generation.llm
    trainer = types.SimpleNamespace(use_vllm=True, vllm_generation=generation)
    budgets = [3, None, 7, 5]
    cap = Params(5)
    with vllm_row_budgets(trainer, budgets):
        llm.generate(["p1", "p2", "p3", "p4"], cap, use_tqdm=False)
        budgets[:] = [1, 2]  # the caller refills the list for its next call
        llm.generate(["p5", "p6"], cap, use_tqdm=False)
    first, second = llm.calls[0][1], llm.calls[1][1]
    # below the cap: its own; None or above the cap: the call's own params (the cap)
    assert [p.max_tokens for p in first] == [3, 5, 5, 5] and first[1] is cap and first[2] is cap
    assert [p.max_tokens for p in second] == [1, 2]
    assert cap.max_tokens == 5  # the call's params are not changed
    assert "generate" not in vars(llm)  # the instance is restored
    llm.generate(["p7"], cap)
    assert llm.calls[-1][1] is cap


@pytest.mark.parametrize("setting", [dict(mode="server"), dict(tensor_parallel_size=2)])
def test_calls_keep_one_cap_where_rows_do_not_line_up(setting):
    # server mode: TRL's client sends one max_tokens; tensor parallelism: TRL gathers the group's rows into one call
    generation, _ = fake_vllm_generation(**setting)
    trainer = types.SimpleNamespace(use_vllm=True, vllm_generation=generation)
    cap = Params(5)
    with vllm_row_budgets(trainer, [3, 4]):
        generation.llm.generate(["p1", "p2"], cap)
    assert generation.llm.calls[0][1] is cap


def test_a_call_whose_rows_do_not_match_the_budgets_is_left_alone():
    generation, _ = fake_vllm_generation()
    trainer = types.SimpleNamespace(use_vllm=True, vllm_generation=generation)
    cap = Params(5)
    with vllm_row_budgets(trainer, [3, 4]):
        generation.llm.generate(["p1", "p2", "p3"], cap)
    assert generation.llm.calls[0][1] is cap
