"""Shareable outputs of the example runner: Hub base id in adapter_config.json and the card, a card whose quick
start loads the adapter, a closing summary, and no deprecation warning from the runner's own defaults."""

import json
import re
import shutil
import warnings

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer, ModelConfig

from trl_credit.model_card import MethodModelCardMixin
from trl_credit.models import DEFAULT_MODEL, DEFAULT_MODEL_HUB_ID, hub_id_of, resolve_model_path
from trl_credit.tasks.rewards import final_number_reward
from trl_credit.scripts import (
    CreditScriptArguments,
    main,
    make_parser,
    method_metric_names,
    offline_defaults,
    training_summary,
)


class CardTrainer(MethodModelCardMixin, GRPOTrainer):
    _name = "Demo"
    _paper = {"title": "A demo paper"}

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self._metrics["train"]["demo/credit"].append(float(self.state.global_step))
        return output


@pytest.fixture
def offline_default_is_tiny(tiny_model_path, tmp_path, monkeypatch):
    """Make the tiny model play the offline default: its converted copy in the trl_credit cache folder."""
    cache = tmp_path / "cache"
    shutil.copytree(tiny_model_path, cache / "SmolLM2-135M-Instruct")
    monkeypatch.setenv("TRL_CREDIT_CACHE", str(cache))
    return str(cache / "SmolLM2-135M-Instruct")


def test_hub_id_mapping_and_offline_resolution(offline_default_is_tiny, tiny_model_path):
    local = offline_default_is_tiny
    assert hub_id_of(local) == DEFAULT_MODEL_HUB_ID
    assert hub_id_of(local + "/") == DEFAULT_MODEL_HUB_ID
    assert hub_id_of(DEFAULT_MODEL) == DEFAULT_MODEL_HUB_ID
    assert hub_id_of(tiny_model_path) is None  # another local folder: no Hub id to record
    assert hub_id_of("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert resolve_model_path(DEFAULT_MODEL_HUB_ID) == local
    assert resolve_model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"


def _run_default_model(tmp_path, extra=()):
    defaults = offline_defaults("demo", max_steps=2, per_device_train_batch_size=4, max_completion_length=8)
    argv = [
        "--model_name_or_path", DEFAULT_MODEL,
        "--output_dir", str(tmp_path / "out"),
        "--arithmetic_num_train", "8",
        "--arithmetic_num_test", "4",
        "--lora_target_modules", "q_proj", "v_proj",
        "--use_cpu", "true",
        *extra,
    ]
    return main(CardTrainer, GRPOConfig, defaults, argv=argv)


def test_saved_adapter_records_hub_base_and_reloads_offline(offline_default_is_tiny, tmp_path):
    trainer = _run_default_model(tmp_path)
    out = tmp_path / "out"
    # A few random steps on a tiny model may leave LoRA's B at zero (no reward variance): give the adapter weights
    # so that reloading it can be told apart from the bare base model, and save again through the trainer.
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    trainer.save_model(str(out))

    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == DEFAULT_MODEL_HUB_ID

    # Reload by the recorded id, resolved offline to the local copy; same outputs as the trained model.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(config["base_model_name_or_path"]))
    reloaded = PeftModel.from_pretrained(base, str(out)).eval()
    ids = torch.tensor([[5, 17, 42, 9, 3]])
    trainer.model.eval()
    with torch.no_grad():
        expected = trainer.model(input_ids=ids).logits
        got = reloaded(input_ids=ids).logits
    torch.testing.assert_close(got, expected)
    # the adapter moved the model: the check above would pass trivially with an untrained adapter otherwise
    with torch.no_grad(), reloaded.disable_adapter():
        assert not torch.allclose(reloaded(input_ids=ids).logits, expected)

    card = (out / "README.md").read_text()
    assert f"base_model: {DEFAULT_MODEL_HUB_ID}" in card
    assert f"[{DEFAULT_MODEL_HUB_ID}](https://huggingface.co/{DEFAULT_MODEL_HUB_ID})" in card
    assert "huggingface.co/datasets/arithmetic" not in card and "built-in arithmetic task" in card
    assert "None" not in card.split("## Training procedure")[0]
    assert "library_name: peft" in card and "A demo paper" in card
    assert "| `num_generations` | `4` |" in card
    first_question = trainer.train_dataset[0]["prompt"][-1]["content"]
    assert f"question = {json.dumps(first_question)}" in card

    # The quick start runs as written once the Hub id is served by the local copy.
    code = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    assert "PeftModel.from_pretrained" in code and f'"{DEFAULT_MODEL_HUB_ID}"' in code
    # Offline, as the card says: its commented line loads trl_credit's local copy of the Hub id (the tiny model here).
    offline = "# from trl_credit.models import resolve_model_path; base_model = resolve_model_path(base_model)\n"
    assert offline in code
    exec(compile(code.replace(offline, offline[2:]), "quick_start_offline", "exec"), {})
    code = code.replace(f'"{DEFAULT_MODEL_HUB_ID}"', repr(offline_default_is_tiny))
    exec(compile(code, "quick_start", "exec"), {})  # raises if the card's code does not run

    # Closing summary: steps, reward first -> last, the method's metric, the adapter and the eval command.
    summary = training_summary(
        trainer, CreditScriptArguments(arithmetic_num_test=4), ModelConfig(model_name_or_path=DEFAULT_MODEL, use_peft=True)
    )
    rewards = [e["reward"] for e in trainer.state.log_history if "reward" in e]
    assert "2 optimizer steps" in summary
    assert re.search(rf"reward\s+{rewards[0]:.4g} -> {rewards[-1]:.4g}\s+\(step 1 -> step 2\)", summary)
    assert re.search(r"demo/credit\s+0 -> 1\b", summary)
    assert f"Adapter saved to {out} (base model {DEFAULT_MODEL_HUB_ID})" in summary
    assert f"trl-credit-eval --adapter {out} --digits 1 --num_operands 2 --data_seed 0 --num_problems 4" in summary


def test_the_card_states_what_the_run_did(offline_default_is_tiny, tmp_path):
    trainer = _run_default_model(tmp_path, extra=["--dataset_train_split", "train"])
    card = (tmp_path / "out" / "README.md").read_text()
    history = [e for e in trainer.state.log_history if "reward" in e]
    assert len(history) == 2  # logging_steps 1: steps 1 and 2
    # 2 steps over 8 problems x 4 generations in batches of 4 rows: 2 x 4 / 32 rows = 0.25 epochs
    assert "2 optimizer steps (0.25 epochs) on the built-in arithmetic task" in card
    assert "split `train`" in card
    # the closing summary's rows: reward and frac_reward_zero_std first -> last, and the method's metric (0 then 1)
    assert f"| `reward` | {history[0]['reward']:.4g} | {history[-1]['reward']:.4g} |" in card
    zero_std = [e["frac_reward_zero_std"] for e in history]
    assert f"| `frac_reward_zero_std` | {zero_std[0]:.4g} | {zero_std[-1]:.4g} |" in card
    assert "| `demo/credit` | 0 | 1 |" in card
    assert "The base model's license: `apache-2.0`" in card  # SmolLM2-135M-Instruct's (the offline default)
    assert "Cite GRPO as:" in card and "@article{shao2024deepseekmath" in card and "arXiv:2402.03300" in card


def test_card_names_a_hub_dataset_with_its_split_and_a_license_from_the_base_models_readme(tmp_path):
    from trl_credit.model_card import _dataset_line, base_model_license

    assert _dataset_line("openai/gsm8k", False, "main", "train") == (
        "the [openai/gsm8k](https://huggingface.co/datasets/openai/gsm8k) dataset (config `main`, split `train`)")
    assert _dataset_line("chain", False) == "the `chain` dataset"  # a built-in task: no Hub link
    (tmp_path / "README.md").write_text("---\nlicense: mit\n---\n# a local model\n")
    assert base_model_license(str(tmp_path), None) == "mit"
    assert base_model_license(str(tmp_path / "missing"), None) is None
    assert base_model_license(None, "surely-not/a-cached-model-xyz") is None  # nothing downloaded, nothing known


def test_an_untrained_card_says_so(tiny_model_path, tiny_dataset, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, num_generations=4,
                      per_device_train_batch_size=4, max_completion_length=4)
    trainer = CardTrainer(model=tiny_model_path, reward_funcs=final_number_reward, args=args,
                          train_dataset=tiny_dataset)
    trainer.create_model_card()
    card = (tmp_path / "README.md").read_text()
    assert "Not trained yet when this card was written." in card and "| metric |" not in card


def test_main_prints_summary(offline_default_is_tiny, tmp_path, capsys):
    _run_default_model(tmp_path, extra=["--max_steps", "1"])
    printed = capsys.readouterr().out
    assert "== Demo run finished: 1 optimizer step ==" in printed and "trl-credit-eval" in printed


def test_method_metric_names_skip_trl_groups():
    history = [
        {"step": 1, "reward": 0.5, "rewards/acc/mean": 0.5, "completions/mean_length": 3.0, "clip_ratio/low_mean": 0.0,
         "srpo/reset_rate": 0.25, "kl": 0.0},
        {"step": 2, "reward": 0.7, "srpo/reset_rate": 0.5, "srpo/seed_rounds": 1.0, "sampling/x": 1.0},
    ]
    assert method_metric_names(history) == ["srpo/reset_rate", "srpo/seed_rounds"]


def _parse_recording_warnings(argv):
    parser = make_parser(GRPOConfig, offline_defaults("demo"), argv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, args, _ = parser.parse_args_and_config(args=argv)
    return args, [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]


def test_runner_defaults_raise_no_deprecation_warning(tmp_path):
    args, caught = _parse_recording_warnings(["--output_dir", str(tmp_path)])
    assert not [m for m in caught if "checkpointing" in m], caught
    assert args.gradient_checkpointing is True  # TRL's GRPO default is kept, under whichever name
    args, _ = _parse_recording_warnings(["--output_dir", str(tmp_path), "--activation_checkpointing", "false"])
    assert args.gradient_checkpointing is False


def test_user_old_checkpointing_name_still_applies(tmp_path):
    args, _ = _parse_recording_warnings(["--output_dir", str(tmp_path), "--gradient_checkpointing", "false"])
    assert args.gradient_checkpointing is False
    recipe = tmp_path / "r.yaml"
    recipe.write_text("gradient_checkpointing: false\n")
    args, _ = _parse_recording_warnings(["--config", str(recipe), "--output_dir", str(tmp_path)])
    assert args.gradient_checkpointing is False


@pytest.mark.parametrize("reset, tagged_rrpo", [("self", False), ("random", True), ("oracle", False)])
def test_srpo_card_is_tagged_rrpo_only_with_random_resets(reset, tagged_rrpo, tiny_model_path, tiny_dataset, tmp_path):
    # RRPO is SRPO's random-reset variant (paper §4.2): a self- or oracle-reset run is not RRPO. The tags reach the
    # card twice: the card's own, and the model's tags (TRL's add_model_tags), which push_to_hub passes on.
    from huggingface_hub import ModelCard

    from trl_credit import SRPOConfig, SRPOTrainer

    args = SRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=8, max_steps=1,
                      reset=reset, use_cpu=True, report_to="none", save_strategy="no")
    trainer = SRPOTrainer(model=tiny_model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=tiny_dataset, step_checker=lambda question, thoughts: 1)
    trainer.create_model_card(tags=list(trainer.model.model_tags))
    tags = ModelCard.load(tmp_path / "README.md").data.tags
    assert "srpo" in tags and "trl_credit" in tags
    assert ("rrpo" in tags) is tagged_rrpo
    assert ("rrpo" in trainer.model.model_tags) is tagged_rrpo


def test_card_of_a_resets_run_prompts_with_the_rollout_template(tiny_model_path, tiny_dataset, tmp_path):
    # SRPO trains on the question wrapped in its rollout template: the card's quick start must ask the same prompt.
    from peft import LoraConfig

    from trl_credit import CreditConfig, CreditTrainer, SRPOConfig, SRPOTrainer

    question = tiny_dataset[0]["prompt"][-1]["content"]
    lines = ("Solve the problem one reasoning step at a time. Write each step on its own line: one observation, "
             "calculation, or deduction per line. Put the final answer in \\boxed{answer}.\n\nQ: " + question)
    common = dict(use_cpu=True, report_to="none", per_device_train_batch_size=8, num_generations=8)
    for name, build in (
        ("srpo", lambda out: SRPOTrainer(model=tiny_model_path, reward_funcs=final_number_reward,
                                         train_dataset=tiny_dataset, peft_config=LoraConfig(r=4),
                                         args=SRPOConfig(output_dir=out, rollout_template="lines", **common))),
        ("credit", lambda out: CreditTrainer(model=tiny_model_path, reward_funcs=final_number_reward,
                                             train_dataset=tiny_dataset, peft_config=LoraConfig(r=4),
                                             args=CreditConfig(output_dir=out, rollout="resets",
                                                               rollout_template="lines", **common))),
    ):
        trainer = build(str(tmp_path / name))
        trainer.create_model_card()
        code = re.search(r"```python\n(.*?)```", (tmp_path / name / "README.md").read_text(), re.S).group(1)
        assert f"question = {json.dumps(lines)}" in code
        assert 'rollout template ("lines")' in code
    # A run on the dataset prompts (rollout groups) asks the bare question.
    plain = CreditTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=tiny_dataset,
                          peft_config=LoraConfig(r=4), args=CreditConfig(output_dir=str(tmp_path / "plain"), **common))
    plain.create_model_card()
    card = (tmp_path / "plain" / "README.md").read_text()
    assert f"question = {json.dumps(question)}" in card and "rollout template" not in card
