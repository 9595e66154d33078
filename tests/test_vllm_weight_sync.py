"""Weights reach vLLM once per step however many generation calls the step makes (vLLM stubbed at its boundary).

The stub reproduces the control flow of TRL 1.16's ``VLLMGeneration`` (trl/generation/vllm_generation.py) in
colocate mode with sleep mode: ``sync_weights`` wakes the weights and pushes them; ``generate`` pushes them
again when they were discarded by a level-2 sleep, wakes the KV cache, generates, and sleeps at level 2. It also
checks that no generation runs on discarded weights or a sleeping KV cache.
"""

import pytest
from trl import GRPOConfig, GRPOTrainer

from trl_credit.core.generation import generate_from_prefixes, one_weight_push
from trl_credit.core.trainer import CreditTrainer, GroupRollout
from trl_credit.tasks.rewards import final_number_reward

COMPLETION_LENGTH = 3


class FakeLLM:
    def __init__(self):
        self.weights_awake = self.kv_awake = True
        self.sleeps = 0

    def wake_up(self, tags=None):
        for tag in tags or ["weights", "kv_cache"]:
            setattr(self, "weights_awake" if tag == "weights" else "kv_awake", True)

    def sleep(self, level=1):
        assert level == 2
        self.weights_awake = self.kv_awake = False
        self.sleeps += 1


class FakeVLLMGeneration:
    def __init__(self, mode="colocate", enable_sleep_mode=True):
        self.mode, self.enable_sleep_mode = mode, enable_sleep_mode
        self.llm = FakeLLM()
        self.pushes = self.generate_calls = 0
        # sampling attributes VLLMGeneration carries (sampling_overrides changes them per call)
        self.max_completion_length, self.temperature, self.top_p = COMPLETION_LENGTH, 1.0, 1.0
        self.weights_current = False
        if enable_sleep_mode:  # as VLLMGeneration.__init__
            self.llm.sleep(level=2)
            self.llm.sleeps = 0
        self._llm_weights_sleeping = enable_sleep_mode

    def sync_weights(self):
        if self.mode == "colocate" and self.enable_sleep_mode:
            self.llm.wake_up(tags=["weights"])
            self._llm_weights_sleeping = False
        self.pushes += 1
        self.weights_current = True

    def generate(self, prompts, images=None, num_generations=1, profiler=None):
        if self.mode == "colocate" and self.enable_sleep_mode and self._llm_weights_sleeping:
            self.sync_weights()
        if self.enable_sleep_mode:
            self.llm.wake_up(tags=["kv_cache"])
        assert self.llm.weights_awake and self.llm.kv_awake and self.weights_current, "generated on a sleeping engine"
        self.generate_calls += 1
        # one completion per prompt row (colocate: n=1 per row; server: num_generations per unique prompt)
        completion_ids = [[7 + i % 5] * COMPLETION_LENGTH for i, _ in enumerate(prompts)]
        logprobs = [[[-1.0]] * COMPLETION_LENGTH for _ in completion_ids]
        if self.enable_sleep_mode:
            self.llm.sleep(level=2)
            self._llm_weights_sleeping = True
            self.weights_current = False  # level 2 discards the weights
        return prompts, completion_ids, logprobs, None


def _extra_calls(trainer, output):
    # Two extra generation calls of the step, as SRPO (seeds, suffixes) or DATPO (branches) make them.
    prompts = [ids[mask.bool()].tolist() for ids, mask in zip(output["prompt_ids"], output["prompt_mask"])]
    generate_from_prefixes(trainer, prompts[:2])
    generate_from_prefixes(trainer, prompts[:1], greedy=True, max_new_tokens=2)


class TRLOnly(GRPOTrainer):
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        _extra_calls(self, output)
        return output


class ExtraCallsRollout(GroupRollout):
    """GRPO's rollouts, then the extra calls a method's part makes in the same generation phase."""

    def setup(self, trainer):
        super().setup(trainer)
        self.trainer = trainer  # the trainer-level helpers under test (generate_from_prefixes) take it

    def generate_and_score(self, ctx, inputs, capture):
        output, batch = super().generate_and_score(ctx, inputs, capture)
        _extra_calls(self.trainer, output)
        return output, batch


class MethodLike(CreditTrainer):  # how the presets are built: parts of the credit core, no TRL override
    _name = "Demo"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, rollout=ExtraCallsRollout(), **kwargs)


def _run(trainer_class, tiny_model_path, tiny_dataset, tmp_path, steps=2, **vllm_kwargs):
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, num_generations=4,
                      per_device_train_batch_size=4, max_completion_length=COMPLETION_LENGTH, max_steps=steps,
                      logging_steps=1, save_strategy="no", vllm_importance_sampling_correction=False)
    trainer = trainer_class(model=tiny_model_path, reward_funcs=final_number_reward, args=args,
                            train_dataset=tiny_dataset)
    # The boundary: what GRPOTrainer.__init__ sets up when use_vllm=True (minus vLLM itself).
    trainer.use_vllm = True
    trainer._last_loaded_step = -1
    trainer.vllm_generation = FakeVLLMGeneration(**vllm_kwargs)
    trainer.train()
    return trainer.vllm_generation


def test_trl_alone_pushes_weights_on_every_call_in_sleep_mode(tiny_model_path, tiny_dataset, tmp_path):
    # The problem being fixed (and a check that the stub reproduces it): 3 calls a step -> 3 pushes a step.
    vllm = _run(TRLOnly, tiny_model_path, tiny_dataset, tmp_path)
    assert vllm.generate_calls == 6 and vllm.pushes == 6


def test_one_push_per_step_with_several_calls(tiny_model_path, tiny_dataset, tmp_path):
    vllm = _run(MethodLike, tiny_model_path, tiny_dataset, tmp_path)
    assert vllm.generate_calls == 6  # 1 base + 2 extra calls per step, 2 steps
    assert vllm.pushes == 2 and vllm.llm.sleeps == 2  # once per step, asleep during training
    assert not vllm.llm.weights_awake and vllm._llm_weights_sleeping and vllm.enable_sleep_mode


@pytest.mark.parametrize("vllm_kwargs", [dict(mode="colocate", enable_sleep_mode=False), dict(mode="server",
                                                                                              enable_sleep_mode=False)])
def test_without_sleep_mode_trl_already_pushes_once_per_step(vllm_kwargs, tiny_model_path, tiny_dataset, tmp_path):
    for trainer_class in (TRLOnly, MethodLike):
        vllm = _run(trainer_class, tiny_model_path, tiny_dataset, tmp_path, **vllm_kwargs)
        assert vllm.generate_calls == 6 and vllm.pushes == 2 and vllm.llm.sleeps == 0


def test_context_restores_sleep_state_on_error():
    class Trainer:
        use_vllm = True
        _last_loaded_step = 0

        class state:
            global_step = 0

    trainer = Trainer()
    trainer.vllm_generation = FakeVLLMGeneration()
    with pytest.raises(RuntimeError):
        with one_weight_push(trainer):
            assert trainer.vllm_generation.llm.kv_awake and not trainer.vllm_generation.enable_sleep_mode
            raise RuntimeError("boom")
    vllm = trainer.vllm_generation
    assert vllm.enable_sleep_mode and vllm._llm_weights_sleeping and not vllm.llm.weights_awake
    assert vllm.pushes == 1 and not trainer._one_weight_push_active
