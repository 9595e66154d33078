"""The shared example-script runner and the model card mixin, driven with GRPOTrainer and the tiny model."""

import os

import pytest
from trl import GRPOConfig, GRPOTrainer

from trl_credit.core.success import resolve_success_index
from trl_credit.model_card import MethodModelCardMixin, method_hyperparameters
from trl_credit.scripts import load_reward_funcs, main, offline_defaults
from trl_credit.tasks.chain import chain_format_reward
from trl_credit.tasks.rewards import accuracy_reward, final_number_reward


def test_reward_registry_defaults_and_errors():
    assert load_reward_funcs(None, "arithmetic") == [final_number_reward]
    assert load_reward_funcs(None, "openai/gsm8k") == [accuracy_reward]
    assert load_reward_funcs(["trl_credit.tasks.rewards.accuracy_reward"], None) == [accuracy_reward]
    with pytest.raises(ValueError, match="--reward_funcs"):
        load_reward_funcs(["nope"], None)


def test_chain_dataset_name_builds_the_chain_task_with_accuracy_and_format_rewards(tiny_model_path, tmp_path):
    # accuracy first: the verifier (success_reward None = the first function), as on any user's [accuracy, format]
    assert load_reward_funcs(None, "chain") == [accuracy_reward, chain_format_reward]
    assert load_reward_funcs(["chain_format"], "chain") == [chain_format_reward]
    defaults = offline_defaults("grpo", max_steps=1, per_device_train_batch_size=4, max_completion_length=4)
    argv = [
        "--model_name_or_path", tiny_model_path,
        "--output_dir", str(tmp_path / "out"),
        "--dataset_name", "chain",
        "--chain_num_train", "8",
        "--chain_num_test", "4",
        "--lora_target_modules", "q_proj", "v_proj",
        "--use_cpu", "true",
    ]
    trainer = main(GRPOTrainer, GRPOConfig, defaults, argv=argv)
    questions = trainer.train_dataset["question"]
    assert len(questions) == 8 and all(", then " in q for q in questions)
    assert trainer.reward_funcs == [accuracy_reward, chain_format_reward]
    assert resolve_success_index(None, trainer.reward_func_names) == 0  # the methods' verifier is accuracy


def test_main_trains_with_lora_and_saves_adapter(tiny_model_path, tmp_path):
    defaults = offline_defaults("grpo", max_steps=1, per_device_train_batch_size=4, max_completion_length=4)
    argv = [
        "--model_name_or_path", tiny_model_path,
        "--output_dir", str(tmp_path / "out"),
        "--arithmetic_num_train", "8",
        "--arithmetic_num_test", "4",
        "--lora_target_modules", "q_proj", "v_proj",
        "--use_cpu", "true",
    ]
    trainer = main(GRPOTrainer, GRPOConfig, defaults, argv=argv)
    assert trainer.state.global_step == 1
    assert trainer.args.learning_rate == 5e-5 and trainer.args.num_generations == 4  # defaults reached the config
    saved = os.listdir(tmp_path / "out")
    assert "adapter_config.json" in saved and "adapter_model.safetensors" in saved


def test_model_card_names_method_hyperparameters_and_base_model(tiny_model_path, tiny_dataset, tmp_path):
    class CardTrainer(MethodModelCardMixin, GRPOTrainer):
        _name = "Demo"
        _paper = {"title": "A demo paper"}

    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, num_generations=4,
                      per_device_train_batch_size=4, max_completion_length=4)
    trainer = CardTrainer(model=tiny_model_path, reward_funcs=final_number_reward, args=args, train_dataset=tiny_dataset)
    trainer.create_model_card()
    card = open(tmp_path / "README.md").read()
    assert "## Demo hyperparameters" in card and "A demo paper" in card
    assert tiny_model_path in card
    assert "| `num_generations` | `4` |" in card
    assert method_hyperparameters(args)["max_completion_length"] == 4


# ---------------------------------------------------------------------------------- examples and recipes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHOD_CONFIGS = {"srpo": "SRPOConfig", "cue_grpo": "CueGRPOConfig", "oppo": "OPPOConfig", "datpo": "DATPOConfig"}


def _example_config(method):
    """The config an offline example script runs with no arguments (its DEFAULTS through the script's parser)."""
    import importlib.util

    import trl_credit
    from trl_credit.scripts import make_parser

    spec = importlib.util.spec_from_file_location(f"train_{method}", os.path.join(ROOT, "examples", f"train_{method}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config_class = getattr(trl_credit, METHOD_CONFIGS[method])
    _, config, _ = make_parser(config_class, dict(module.DEFAULTS, use_cpu=True, bf16=False), argv=[]).parse_args_and_config(args=[])
    return config


@pytest.mark.parametrize(
    "method, expected",
    [
        # the README's main job: the settings it ran with when they were SRPOConfig's defaults (paper Table 5)
        ("srpo", dict(num_generations=8, temperature=0.7, top_p=0.95, loss_type="grpo", weight_decay=0.01, beta=0.0,
                      num_iterations=1, num_base_generations=4)),
        ("oppo", dict(num_generations=4, temperature=0.7, loss_type="grpo")),  # the paper's Eq. 22 loss
        ("datpo", dict(num_generations=4, temperature=1.0, loss_type="dapo")),
        ("cue_grpo", dict(num_generations=8, temperature=1.0, loss_type="dapo")),
    ],
)
def test_offline_examples_keep_their_settings(method, expected):
    config = _example_config(method)
    assert {name: getattr(config, name) for name in expected} == expected


def _recipe(method):
    import yaml

    with open(os.path.join(ROOT, "examples", "recipes", f"{method}.yaml")) as f:
        return yaml.safe_load(f)


def test_recipes_set_what_the_configs_no_longer_default_to():
    # The papers' values of GRPOConfig fields that the method configs used to default to.
    assert {k: _recipe("srpo")[k] for k in ("temperature", "top_p", "loss_type", "weight_decay", "beta",
                                            "num_iterations", "num_generations")} == dict(
        temperature=0.7, top_p=0.95, loss_type="grpo", weight_decay=0.01, beta=0.0, num_iterations=1,
        num_generations=8)
    assert _recipe("oppo")["loss_type"] == "grpo"
    assert (_recipe("datpo")["num_generations"], _recipe("datpo")["loss_type"]) == (4, "dapo")


def _recipe_config(method, extra=()):
    """The config a recipe runs with: its script's own defaults (the example's DEFAULTS) and parser, exactly as
    `examples/train_<method>.py --config examples/recipes/<method>.yaml` parses them."""
    import importlib.util

    import trl_credit
    from trl_credit.scripts import make_parser

    spec = importlib.util.spec_from_file_location(f"train_{method}", os.path.join(ROOT, "examples", f"train_{method}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--config", os.path.join(ROOT, "examples", "recipes", f"{method}.yaml"), *extra]
    parser = make_parser(getattr(trl_credit, METHOD_CONFIGS[method]), module.DEFAULTS, argv=argv)
    return parser.parse_args_and_config(args=argv)



# What each recipe's header and its paper state: run length (epochs, no max_steps), checkpoints, evaluation, and
# the paper's learning rate, G, temperature, completion length, KL beta and loss.
PAPER_RUNS = {
    # Cue-GRPO App. B: one epoch (8,000 steps), checkpoints every 500 steps (20 kept), evaluated at the end; K = 64,
    # T = 1.0, 1,024 tokens, lr 5e-7, beta 0.001; the paper names no loss aggregation (GRPOConfig's "dapo").
    "cue_grpo": dict(num_train_epochs=1, max_steps=-1, save_strategy="steps", save_steps=500, save_total_limit=20,
                     eval_strategy="no", learning_rate=5e-7, num_generations=64, temperature=1.0,
                     max_completion_length=1024, beta=0.001, loss_type="dapo"),
    # OPPO Table 13: one epoch, G = 8, T = 1.0, 8,192 tokens, lr 1e-6, no KL, Eq. 22's loss.
    "oppo": dict(num_train_epochs=1, max_steps=-1, save_strategy="steps", save_steps=200, eval_strategy="no",
                 learning_rate=1e-6, num_generations=8, temperature=1.0, max_completion_length=8192, beta=0.0,
                 loss_type="grpo"),
    # DATPO §4.1 / App. F.2: N = 4, T = 1.0, 1,024 tokens, lr 5e-6 constant, no KL, token-level loss (Eq. 9).
    "datpo": dict(num_train_epochs=1, max_steps=-1, save_strategy="steps", save_steps=100, eval_strategy="no",
                  learning_rate=5e-6, num_generations=4, temperature=1.0, max_completion_length=1024, beta=0.0,
                  loss_type="dapo"),
    # SRPO Table 5: 2 epochs, 8 rollouts per prompt, T = 0.7, 4,096 tokens, lr 5e-5, no KL, suffix-mean loss.
    "srpo": dict(num_train_epochs=2, max_steps=-1, save_strategy="steps", save_steps=5, eval_strategy="no",
                 learning_rate=5e-5, num_generations=8, temperature=0.7, max_completion_length=4096, beta=0.0,
                 loss_type="grpo", weight_decay=0.01),
}


@pytest.mark.parametrize("method", sorted(PAPER_RUNS))
def test_a_recipe_parsed_through_its_script_trains_as_its_paper_ran(method):
    _, config, _ = _recipe_config(method)
    got = {name: getattr(config, name) for name in PAPER_RUNS[method]}
    got = {name: getattr(value, "value", value) for name, value in got.items()}  # enums: "steps", "no"
    assert got == PAPER_RUNS[method]


def test_the_offline_run_length_yields_to_epochs_and_checkpoints_given_on_the_command_line():
    # the offline defaults' max_steps (3) and save_strategy ("no" on a CPU) must not override what a user asks for
    _, config, _ = _recipe_config("srpo", ["--max_steps", "7"])
    assert config.max_steps == 7  # an explicit max_steps still wins over the recipe's epochs
    from trl_credit import SRPOConfig
    from trl_credit.scripts import make_parser
    from trl_credit.train import method_defaults

    argv = ["--num_train_epochs", "3", "--save_steps", "10"]
    _, config, _ = make_parser(SRPOConfig, method_defaults("srpo"), argv=argv).parse_args_and_config(args=argv)
    assert (config.max_steps, config.num_train_epochs, config.save_strategy.value, config.save_steps) == (-1, 3, "steps", 10)
    _, config, _ = make_parser(SRPOConfig, method_defaults("srpo"), argv=[]).parse_args_and_config(args=[])
    assert config.max_steps == 3  # the offline run itself is unchanged


def test_every_recipe_key_is_an_argument_of_its_script():
    import dataclasses

    import trl_credit
    from trl import ModelConfig

    from trl_credit.scripts import CreditScriptArguments

    for method, config_name in METHOD_CONFIGS.items():
        known = {f.name for cls in (CreditScriptArguments, getattr(trl_credit, config_name), ModelConfig)
                 for f in dataclasses.fields(cls)}
        assert set(_recipe(method)) - known == set(), method


def test_readme_recipe_table_matches_the_recipes():
    import dataclasses

    import yaml
    from trl import GRPOConfig

    with open(os.path.join(ROOT, "README.md")) as f:
        lines = [line for line in f.read().splitlines() if line.startswith("| `") or line.startswith("| setting |")]
    header = next(line for line in lines if line.startswith("| setting |"))
    columns = [cell.strip().replace("`", "") for cell in header.strip("|").split("|")][1:]
    assert columns == ["GRPOConfig default", "srpo.yaml", "cue_grpo.yaml", "oppo.yaml", "datpo.yaml"]
    recipes = {column: _recipe(column[: -len(".yaml")]) for column in columns[1:]}
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    checked = 0
    for line in lines[lines.index(header) + 1:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != len(columns) + 1:
            break  # the end of the table
        name = cells[0].split("`")[1]
        for column, cell in zip(columns, cells[1:]):
            value = None if cell in ("", "—") else yaml.safe_load(cell.split("`")[1])
            if column == "GRPOConfig default":
                assert value is None or value == defaults[name], (name, cell)
            else:
                assert value == recipes[column].get(name), (name, column, cell)
        checked += 1
    assert checked >= 15


def test_the_composed_script_trains_the_parts_named_on_the_command_line(tiny_model_path, tmp_path, capsys):
    # examples/train_credit.py: main(CreditTrainer, CreditConfig, ...) with the parts chosen by flags, as a user runs it
    from trl_credit import CreditConfig, CreditTrainer

    defaults = offline_defaults("credit", max_steps=1, per_device_train_batch_size=8, num_generations=8,
                                max_completion_length=8)
    argv = [
        "--model_name_or_path", tiny_model_path, "--output_dir", str(tmp_path / "out"),
        "--arithmetic_num_train", "8", "--arithmetic_num_test", "4", "--lora_target_modules", "q_proj", "v_proj",
        "--use_cpu", "true", "--rollout", "resets", "--credit", "oppo", "--modifiers", "cue",
        "--rollout_template", "lines", "--reset", "random", "--cue_partition", "random",
    ]
    trainer = main(CreditTrainer, CreditConfig, defaults, argv=argv)
    assert trainer.state.global_step == 1
    assert [part.name for part in trainer.parts] == ["resets", "oppo", "cue"]
    assert trainer.args.thought_delimiter == "\n"  # the lines template's: one thought per line
    printed = capsys.readouterr().out
    command = next(line for line in printed.splitlines() if "trl-credit-eval" in line)
    assert "--rollout_template lines" in command  # evaluated on the prompt it trained on
    logged = trainer.state.log_history[0]
    assert {"srpo/fallback_rate", "oppo/value_mean", "cue/frac_groups_redistributed"} <= set(logged)
    with pytest.raises(ValueError, match="cue_alpha is a field of the 'cue' modifier"):
        main(CreditTrainer, CreditConfig, defaults, argv=argv[:-8] + ["--cue_alpha", "0.5"])


def _finished_run(tmp_path, history, rollout=None, rollout_template="thought_mdp", name="resets x oppo x cue"):
    """What training_summary reads of a finished trainer: its args, state, model config, parts and name."""
    from types import SimpleNamespace

    args = SimpleNamespace(output_dir=str(tmp_path / "run"), max_completion_length=64, push_to_hub=False,
                           rollout_template=rollout_template)
    return SimpleNamespace(
        args=args, state=SimpleNamespace(log_history=history, global_step=len(history)), _name=name,
        model=SimpleNamespace(config=SimpleNamespace(_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct")),
        rollout=SimpleNamespace(name=rollout) if rollout else None,
    )


def test_summary_marks_metrics_outside_their_healthy_range_and_evaluates_on_the_training_prompt(tmp_path):
    from trl import ModelConfig

    from trl_credit.scripts import CreditScriptArguments, training_summary

    history = [
        {"step": 1, "reward": 0.25, "frac_reward_zero_std": 0.5, "srpo/single_thought_rate": 1.0,
         "srpo/fallback_rate": 0.0, "srpo/seed_rounds": 1.0},
        {"step": 2, "reward": 0.5, "frac_reward_zero_std": 0.0, "srpo/single_thought_rate": 1.0,
         "srpo/fallback_rate": 0.0, "srpo/seed_rounds": 2.0},
    ]
    summary = training_summary(_finished_run(tmp_path, history, rollout="resets", rollout_template="lines"),
                               CreditScriptArguments(), ModelConfig(model_name_or_path="smollm2-135m-instruct-offline",
                                                                    use_peft=True))
    lines = summary.splitlines()
    row = next(line for line in lines if line.strip().startswith("srpo/single_thought_rate"))
    assert "1 -> 1" in row and row.endswith("<< healthy <= 0.5")  # seeds of one thought: degenerate
    row = next(line for line in lines if line.strip().startswith("srpo/fallback_rate"))
    assert row.endswith("healthy < 1") and "<<" not in row
    row = next(line for line in lines if line.strip().startswith("srpo/seed_rounds"))
    assert "healthy" not in row  # no range for it
    assert "Is it working? 1 of 3 checked metrics ended outside their healthy range (<<):" in summary
    assert "srpo/single_thought_rate = 1: seeds with one thought" in summary and "docs/srpo.md#is-it-working" in summary
    out = str(tmp_path / "run")
    command = next(line for line in lines if "trl-credit-eval" in line)
    # the prompt it trained on, next to (not inside) the adapter folder, and its base model with the same settings
    assert "--rollout_template lines" in command
    assert f"--output_dir {out}-eval" in command and f"{out}/eval" not in command
    assert command.endswith("--compare_base")


def test_summary_of_other_rollouts_and_tasks(tmp_path):
    from trl import ModelConfig

    from trl_credit.scripts import CreditScriptArguments, training_summary

    history = [{"step": 1, "reward": 0.5, "frac_reward_zero_std": 1.0}]
    # A CreditConfig keeps rollout_template at its default with rollout="groups": the prompts were not wrapped.
    summary = training_summary(_finished_run(tmp_path, history, rollout="groups"),
                               CreditScriptArguments(dataset_name="chain", chain_num_test=4),
                               ModelConfig(model_name_or_path="m", use_peft=False))
    assert "--rollout_template" not in summary and "does not build the chain task" not in summary
    # every group had equal rewards; one metric reads as one ("1 checked metric", "its")
    assert "Is it working? 1 of 1 checked metric ended outside its healthy range (<<):" in summary
    commands = [line.strip() for line in summary.splitlines() if "trl-credit-eval" in line]
    out = str(tmp_path / "run")
    assert commands == [
        f"trl-credit-eval --model {out} --dataset chain --data_seed 0 --num_problems 4 --max_new_tokens 64 "
        f"--output_dir {out}-eval",
        f"trl-credit-eval --model m --dataset chain --data_seed 0 --num_problems 4 --max_new_tokens 64 "
        f"--output_dir {out}-eval-base",
    ]
    healthy = training_summary(_finished_run(tmp_path, [{"step": 1, "reward": 0.5, "frac_reward_zero_std": 0.5}]),
                               CreditScriptArguments(), ModelConfig(model_name_or_path="m", use_peft=True))
    assert "Is it working? The 1 checked metric ended inside its healthy range." in healthy
    assert "== resets x oppo x cue run finished: 1 optimizer step ==" in healthy
