"""What every trainer must do like GRPOTrainer: train with LoRA and several reward functions, log its method metrics
through TRL's logging (what wandb/trackio receive), save an adapter that reloads to the same outputs, and write a
model card naming the method, its hyperparameters and the base model."""

import dataclasses

import pytest
import torch
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, TrainerCallback

import trl_credit


def parity_reward(completions, **kwargs):
    # Variance on random text: some groups have both outcomes, so every method has non-zero advantages.
    return [float(len(c[0]["content"]) % 2) for c in completions]


def short_reward(completions, **kwargs):
    return [0.5 * float(len(c[0]["content"]) < 20) for c in completions]


# method -> (trainer, config, method-specific settings, metric prefix)
CASES = {
    "cue_grpo": ("CueGRPOTrainer", "CueGRPOConfig", dict(num_generations=4), "cue/"),
    "oppo": ("OPPOTrainer", "OPPOConfig", dict(num_generations=4), "oppo/"),
    "datpo": ("DATPOTrainer", "DATPOConfig", dict(num_generations=4), "datpo/"),
    "srpo": ("SRPOTrainer", "SRPOConfig", dict(num_generations=8, rollout_template="lines", thought_delimiter="\n",
                                              localization_max_tokens=4), "srpo/"),
}


class CaptureLogs(TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


@pytest.mark.trl_smoke
@pytest.mark.parametrize("method", sorted(CASES))
def test_lora_training_metrics_adapter_roundtrip_and_card(method, tiny_model_path, tiny_dataset, tmp_path):
    trainer_name, config_name, settings, prefix = CASES[method]
    trainer_class, config_class = getattr(trl_credit, trainer_name), getattr(trl_credit, config_name)
    args = config_class(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        max_completion_length=8,
        max_steps=2,
        learning_rate=5e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
        **settings,
    )
    capture = CaptureLogs()
    trainer = trainer_class(
        model=tiny_model_path,
        reward_funcs=[parity_reward, short_reward],
        args=args,
        train_dataset=tiny_dataset,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
        callbacks=[capture],
    )
    trainer.train()
    assert trainer.state.global_step == 2

    # Method metrics reach the logging callbacks (the path wandb/trackio take), next to GRPO's own.
    logged = {key for logs in capture.logs for key in logs}
    assert "reward" in logged and "rewards/parity_reward/mean" in logged
    assert any(key.startswith(prefix) for key in logged), f"no {prefix}* metric in {sorted(logged)}"

    # The saved adapter reloads onto the base model and reproduces the trained model's outputs.
    trainer.save_model(str(tmp_path / "adapter"))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    inputs = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        base_logits = base(inputs).logits
        reloaded = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
        reloaded_logits = reloaded(inputs).logits
        trained = trainer.accelerator.unwrap_model(trainer.model).eval()
        trained_logits = trained(inputs).logits
    torch.testing.assert_close(reloaded_logits, trained_logits, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(base_logits, trained_logits, atol=1e-6), "training did not move the adapter"

    # The model card names the method, its paper, its hyperparameters and the base model.
    trainer.create_model_card(model_name="demo", dataset_name="arithmetic")
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"## {trainer_class._name} hyperparameters" in card
    assert f"trl_credit.{trainer_name}" in card and tiny_model_path in card
    assert "| `num_generations` | `" + str(settings["num_generations"]) + "` |" in card


def minimal_call(method, model_path, tmp_path, monkeypatch):
    """TRL's quick start, ``GRPOTrainer(model=..., reward_funcs=..., train_dataset=...)``, with the method's trainer:
    no `args`, so every config field keeps its default, bf16 included (the check that refuses bf16 without a GPU is
    bypassed so the call runs on the CPU). Returns the trainer and a config built with the defaults."""
    from trl_credit.tasks.data import make_arithmetic_dataset

    monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.chdir(tmp_path)  # the default output dir is relative
    trainer_class, config_class = getattr(trl_credit, CASES[method][0]), getattr(trl_credit, CASES[method][1])
    defaults = config_class("reference")  # built first: a new config resets the accelerator state of a trainer
    dataset = make_arithmetic_dataset(num_train=4, num_test=1, seed=0)["train"]
    return trainer_class(model=model_path, reward_funcs=parity_reward, train_dataset=dataset), defaults


@pytest.mark.parametrize("method", sorted(CASES))
def test_minimal_call_without_args_builds_the_method_config(method, tiny_model_path, tmp_path, monkeypatch):
    trainer, defaults = minimal_call(method, tiny_model_path, tmp_path, monkeypatch)
    args = trainer.args
    assert type(args) is type(defaults)
    # named after the model like GRPOTrainer's "<model>-GRPO"
    assert args.output_dir == f"{tiny_model_path.rstrip('/').split('/')[-1]}-{type(trainer)._name}"
    # (OPPO's answer_column=None resolves to the dataset's column at construction: `answer` here)
    resolved = {"answer_column": "answer"} if getattr(defaults, "answer_column", "") is None else {}
    names = [f.name for f in dataclasses.fields(args) if f.name != "output_dir"]
    assert {name: getattr(args, name) for name in names} == {name: resolved.get(name, getattr(defaults, name))
                                                             for name in names}
    assert args.per_device_train_batch_size == 8 and args.num_generations == 8  # GRPOConfig's, for every method


# One default step (256-token completions) takes 7 s (OPPO) to 50 s (DATPO) on a CPU: OPPO runs by default.
@pytest.mark.parametrize(
    "method", [m if m == "oppo" else pytest.param(m, marks=pytest.mark.slow) for m in sorted(CASES)]
)
def test_minimal_call_without_args_trains_one_step(method, tiny_model_path, tmp_path, monkeypatch):
    trainer, _ = minimal_call(method, tiny_model_path, tmp_path, monkeypatch)
    trainer.args.max_steps, trainer.args.logging_steps = 1, 1  # read by train(): one logged step of the default run
    trainer.train()
    assert trainer.state.global_step == 1
    logged = {key for log in trainer.state.log_history for key in log}
    assert any(key.startswith(CASES[method][3]) for key in logged), sorted(logged)
