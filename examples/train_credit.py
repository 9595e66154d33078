"""A composed method: one rollout, one credit and any modifiers, chosen on the command line (docs/composition.md).

After `pip install`, `trl-credit credit [the same flags]` runs this script from the wheel (README: The trl-credit
command), e.g. `trl-credit credit --config <recipe.yaml> --config_file <accelerate config> --num_processes <GPUs>`.

    --rollout   groups (GRPO) | resets (SRPO / RRPO) | trees (DATPO)
    --credit    outcome (GRPO's group-normalized outcome) | oppo (OPPO's value recursion) | blocks (DATPO, with trees)
                | process (per-step rewards, DeepSeekMath; e.g. --process_step_reward chain --dataset_name chain)
    --modifiers cue (Cue-GRPO's rarity weights)

Each part takes its method's fields (`--reset random`, `--oracle self`, `--cue_partition cue`, ...); a field of a part
not selected is refused. Offline CPU run on SmolLM2-135M-Instruct and the built-in arithmetic task (LoRA r64/α64, a
short run), e.g. SRPO's resets with OPPO's token credit and Cue-GRPO's rarity weights:

    accelerate launch --config_file examples/accelerate_configs/cpu.yaml --num_cpu_threads_per_process 2 \
        examples/train_credit.py --rollout resets --credit oppo --modifiers cue --rollout_template lines

Without arguments it is GRPO (rollout groups, credit outcome). Any launcher, model and dataset the method scripts
take work here too (`--config <recipe.yaml>`, `--model_name_or_path`, `--dataset_name`, `--reward_funcs`, ...).
"""

# The script is trl_credit.train (in the wheel), which `trl-credit credit` launches: the same flags, recipes, summary.
from trl_credit.train import method_defaults, train

DEFAULTS = method_defaults("credit")  # the offline run's settings: trl_credit.train.METHODS["credit"]

if __name__ == "__main__":
    train("credit")
