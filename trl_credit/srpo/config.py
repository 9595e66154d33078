"""Configuration of SRPOTrainer (SRPO / RRPO, docs/srpo.md, paper §4 and Appendix C)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from trl_credit.core.success import SuccessArguments
from trl_credit.core.viz import CreditLoggingArguments
from trl_credit.trl_bridge.compat import adopt_activation_checkpointing

from trl_credit.srpo.localization import STEP_CHECKERS
from trl_credit.srpo.prompts import LOCALIZATION_TEMPLATE, ROLLOUT_TEMPLATES, resolve_rollout_template

__all__ = ["SRPOConfig", "SRPOFields", "default_suffixes", "implied_thought_delimiter"]


@dataclass
class SRPOFields:
    """The SRPO / RRPO fields and their checks, mixed into :class:`SRPOConfig` and
    :class:`~trl_credit.config.CreditConfig` (rollout ``resets``)."""

    # ---- SRPO / RRPO ----
    reset: str = field(
        default="self",
        metadata={
            "help": "How the reset thought h* is chosen: 'self' = SRPO (the policy localizes the first erroneous "
            "thought of its failed seed), 'random' = RRPO (uniform over the seed's thoughts)."
        },
    )
    reset_groups: int | None = field(
        default=None,
        metadata={
            "help": "Shared-prefix groups per prompt, each from its own incorrect seed (paper splits at 8 rollouts: "
            "1x4, 2x4, 1x8). None (with suffixes_per_reset None): one reset group holding half of num_generations "
            "(G // 2 suffixes, ceil(G / 2) base rollouts; G = 2 or 3: 1 x G, no base group). Set alone: "
            "suffixes_per_reset defaults to 4."
        },
    )
    suffixes_per_reset: int | None = field(
        default=None,
        metadata={
            "help": "Suffixes resampled from each reset state (the shared-prefix group size). None: derived from "
            "num_generations (see reset_groups); set alone: reset_groups defaults to 1."
        },
    )
    seed_source: str = field(
        default="fresh",
        metadata={
            "help": "Where seeds come from. 'fresh' (paper §4.2): extra iid rollouts, never part of the base group. "
            "'base' (paper Appendix D): the first failed base rollouts; no seed generation, and a prompt whose base "
            "group has no failure falls back to GRPO. 'base' needs a base group."
        },
    )
    seed_candidates_per_round: int = field(
        default=1,
        metadata={
            "help": "Fresh iid rollouts per prompt sampled in each seed round (seed_source='fresh'); the seed is the "
            "first incorrect one (it is never part of the base group)."
        },
    )
    max_seed_rounds: int = field(
        default=4,
        metadata={
            "help": "Seed rounds before giving up on a prompt; a reset group with no incorrect seed falls back to "
            "GRPO on the base group (its rows are masked). Every process runs the same number of rounds."
        },
    )
    thought_delimiter: str | None = field(
        default=None,
        metadata={
            "help": "Text ending a thought. None: the one the rollout template asks for ('\\n' with "
            "rollout_template='lines', else '</thought>', the paper's). A response without the delimiter is one "
            "thought."
        },
    )
    rollout_template: str | None = field(
        default="thought_mdp",
        metadata={
            "help": "Instruction wrapped around each question (last user message, or the text prompt): "
            f"one of {sorted(ROLLOUT_TEMPLATES)} ('thought_mdp' = paper Appendix D, 'lines' = one step per line, "
            "'none' = prompts unchanged) or a custom template containing '{question}'."
        },
    )
    localization_template: str = field(
        default=LOCALIZATION_TEMPLATE,
        metadata={
            "help": "Self-localization prompt (paper Appendix D) with placeholders '{question}', '{steps}' "
            "(rendered 'Step 1: ...' one per line) and '{num_steps}'."
        },
    )
    localization_max_tokens: int = field(
        default=64,
        metadata={
            "help": "Max new tokens of the greedy localization call (the paper's answers are ~9 tokens: "
            "'\\boxed{N}'). The call also stops right after '\\boxed{N}'."
        },
    )
    localization: str = field(
        default="scored",
        metadata={
            "help": "How SRPO asks the policy for h*: 'scored' = one forward pass scoring every answer "
            "\\boxed{1}..\\boxed{H_s} after the localization prompt, best one wins (always a valid index); "
            "'generate' = the paper's greedy decoded answer, unparsed answers fall back per localization_fallback."
        },
    )
    localization_scoring: str = field(
        default="calibrated",
        metadata={
            "help": "Scores of the scored choice: 'plain' (log-probabilities of the answers) or 'calibrated' "
            "(divided by the same scores on a content-free chain of the same length: contextual calibration)."
        },
    )
    localization_fallback: str = field(
        default="scored",
        metadata={
            "help": "With localization='generate': the reset of an unparsed answer, 'scored' (the policy's scored "
            "choice) or 'random' (uniform, RRPO's draw)."
        },
    )
    localization_temperature: float = field(
        default=0.0,
        metadata={"help": "0: argmax of the answer scores; > 0: sample from softmax(scores / temperature)."},
    )
    step_checker: str | None = field(
        default=None,
        metadata={
            "help": "A named step checker ('chain', 'sums', 'keychain'): question + thoughts -> first wrong thought. "
            "Needed by reset='oracle'; with any reset it logs localization quality. A callable goes to "
            "SRPOTrainer(step_checker=...)."
        },
    )
    reset_seed: int | None = field(
        default=None,
        metadata={"help": "Seed of the reset-index generator (RRPO draws, SRPO's random fallback); `seed` if None."},
    )

    def _check_srpo_fields(self) -> None:
        """Validate the SRPO fields and fill the default split (run before GRPOConfig's ``__post_init__``)."""
        if self.reset not in ("self", "random", "oracle"):
            raise ValueError(
                f"reset must be 'self' (SRPO), 'random' (RRPO) or 'oracle' (step checker), got {self.reset!r}."
            )
        choices = {"localization": ("scored", "generate"), "localization_scoring": ("plain", "calibrated"),
                   "localization_fallback": ("scored", "random")}
        for name, accepted in choices.items():
            if getattr(self, name) not in accepted:
                raise ValueError(f"{name} must be one of {list(accepted)}, got {getattr(self, name)!r}.")
        if not isinstance(self.localization_temperature, (int, float)) or not self.localization_temperature >= 0:
            raise ValueError(f"localization_temperature must be a number >= 0, got {self.localization_temperature!r}.")
        if self.step_checker is not None and self.step_checker not in STEP_CHECKERS:
            passed = ("CreditTrainer(rollout=Resets(step_checker=...))" if hasattr(self, "rollout")
                      else "SRPOTrainer(step_checker=...)")
            raise ValueError(
                f"step_checker must be one of {sorted(STEP_CHECKERS)} (or pass a callable to {passed}), got "
                f"{self.step_checker!r}."
            )
        if self.seed_source not in ("fresh", "base"):
            raise ValueError(f"seed_source must be 'fresh' or 'base', got {self.seed_source!r}.")
        if self.num_generations is None:
            raise ValueError("num_generations must be set: it is the whole per-prompt rollout budget of SRPO.")
        if self.reset_groups is None and self.suffixes_per_reset is None:
            self.reset_groups, self.suffixes_per_reset = 1, default_suffixes(self.num_generations)
        elif self.reset_groups is None:
            self.reset_groups = 1
        elif self.suffixes_per_reset is None:
            self.suffixes_per_reset = 4
        for name in ("reset_groups", "seed_candidates_per_round", "max_seed_rounds", "localization_max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        if not isinstance(self.suffixes_per_reset, int) or self.suffixes_per_reset < 2:
            raise ValueError(
                f"suffixes_per_reset must be an integer >= 2 (a group of one has no group-relative advantage), "
                f"got {self.suffixes_per_reset!r}."
            )
        if isinstance(self.rollout_template, str) and self.rollout_template.lower() in ("none", "null", ""):
            self.rollout_template = "none"
        resolve_rollout_template(self.rollout_template)  # raises with the accepted values
        self.thought_delimiter = implied_thought_delimiter(self.rollout_template, self.thought_delimiter)
        missing = [p for p in ("{question}", "{steps}", "{num_steps}") if p not in self.localization_template]
        if missing:
            raise ValueError(f"localization_template must contain the placeholders {missing}.")
        base = self.num_generations - self.reset_groups * self.suffixes_per_reset
        if base < 0 or base == 1:
            raise ValueError(
                f"num_generations ({self.num_generations}) must equal reset_groups * suffixes_per_reset "
                f"({self.reset_groups} * {self.suffixes_per_reset} = {self.reset_groups * self.suffixes_per_reset}, "
                "no base group) or exceed it by at least 2 (the base group size); a base group of one has no "
                "group-relative advantage."
            )
        if self.seed_source == "base" and base == 0:
            raise ValueError(
                "seed_source='base' draws seeds from the base group, but this split has none (num_generations = "
                "reset_groups * suffixes_per_reset); use seed_source='fresh' or a split with a base group."
            )

    def _check_srpo_after_grpo(self) -> None:
        """The checks that need GRPOConfig's derived sizes (run after its ``__post_init__``)."""
        # Whole prompt groups must sit on one process: seeds, resets and suffixes are built per prompt.
        per_process = self.generation_batch_size // max(1, self.world_size)
        if per_process % self.num_generations != 0:
            who = f"{type(self).__name__} (resets rollout)" if hasattr(self, "rollout") else type(self).__name__
            raise ValueError(
                f"{who}: SRPO's resets need whole prompt groups on each process: the per-process generation batch "
                f"(per_device_train_batch_size * steps_per_generation = {per_process}) must be a multiple of "
                f"num_generations ({self.num_generations})."
            )

    @property
    def num_base_generations(self) -> int:
        """Size of the base group: `num_generations - reset_groups * suffixes_per_reset`."""
        if self.reset_groups is None or self.suffixes_per_reset is None:  # a CreditConfig without rollout="resets"
            raise ValueError("num_base_generations is defined for rollout='resets' only (the SRPO split is unset).")
        return self.num_generations - self.reset_groups * self.suffixes_per_reset


# Mixins before GRPOConfig: dataclass fields follow the reversed MRO, so GRPOConfig's fields keep their positions
# (`SRPOConfig("my_run")` is the output dir) and the mixins' and the method's fields come after them.
@dataclass
class SRPOConfig(SRPOFields, CreditLoggingArguments, SuccessArguments, GRPOConfig):
    r"""
    Configuration class for [`SRPOTrainer`]: GRPOConfig plus the reset-and-resample rollout of SRPO/RRPO.

    Rows per prompt: TRL's `num_generations` (G) is the whole per-prompt budget (paper: 8, compute-matched), split
    into a base group of iid rollouts and `reset_groups` shared-prefix groups of `suffixes_per_reset` suffixes.
    Default split (neither `reset_groups` nor `suffixes_per_reset` given): half base, half shared-prefix, i.e. one
    reset group of `G // 2` suffixes and a base group of `ceil(G / 2)` (odd G gives the extra row to the base group:
    5 -> 3 + 1x2, 7 -> 4 + 1x3, 16 -> 8 + 1x8); G = 8 is the paper's default 1x4 (4 base + 4 suffixes). G = 2 or 3
    cannot hold two groups of two: the whole budget is one shared-prefix group (1x2, 1x3, no base group, like the
    paper's 1x8). Explicit splits are used as given (an unset one of the two then defaults to `reset_groups=1`,
    `suffixes_per_reset=4`): the paper's splits at budget 8 are 1x4, 2x4 and 1x8 (no base group:
    `reset_groups=2`, or `suffixes_per_reset=8`).

    Success (which rollouts are incorrect seeds, `srpo/base_pass_rate`, `srpo/correction_rate`) is what the
    verifier says: a rollout is correct when the raw reward of the `success_reward` function (default the first
    reward function) is >= `success_threshold`. With `reward_funcs=[accuracy_reward, format_reward]`, a wrong but
    well-formatted answer (accuracy 0, format 1, weighted total 1.0) is incorrect and can be a seed. A seed needs the
    verifier to return a number below the threshold (a rollout it returns None for is never a seed). Advantages
    keep TRL's weighted total of all reward functions, normalized within each sub-group (base group, each
    shared-prefix group); unscorable rows (every reward function returned None) get advantage 0 and are left out
    of every group statistic and pass rate. With `multi_objective_aggregation="normalize_then_sum"` each reward
    function is normalized within each sub-group instead, then the weighted sum is rescaled over the batch (TRL's
    formula with SRPO's sub-groups as the groups; `scale_rewards` is then unused, as in TRL).

    Every GRPOConfig field keeps GRPOConfig's default (G = 8, temperature 1.0, `loss_type="dapo"`, ...): switching
    the config class changes nothing else. The paper's settings (Appendix C Table 5: `temperature=0.7`,
    `top_p=0.95`, `beta=0.0`, `num_iterations=1`, `loss_type="grpo"` (per-sequence token mean, then batch mean: the
    paper's "suffix-mean → batch-mean" L_SP), `weight_decay=0.01`, ...) are set by `examples/recipes/srpo.yaml`.
    With `num_iterations=1` and `steps_per_generation == gradient_accumulation_steps` (TRL's defaults) every update
    is on-policy, so PPO clipping is never active, as in the paper ("no clipped surrogate").

    Cost (generated tokens): one seed candidate per round (`seed_candidates_per_round=1`), suffixes get the budget
    `max_completion_length` minus their reset prefix, the greedy localization stops right after `\boxed{N}` (HF
    generate: a stopping criterion; vLLM: `stop` strings; continuous batching: its `localization_max_tokens` cap).
    `seed_source="base"` takes the seed from the failed base rollouts instead of sampling fresh ones.

    Parameters:
        reset (`str`, defaults to `"self"`): `"self"` = SRPO (the policy localizes the first erroneous thought),
            `"random"` = RRPO (uniform thought index), `"oracle"` = just before the first wrong thought a step
            checker finds (needs `step_checker`).
        localization (`str`, defaults to `"scored"`): how SRPO asks the policy: `"scored"` = score every answer
            `\boxed{1}`..`\boxed{H_s}` in one forward pass and take the best; `"generate"` = the paper's greedy
            decoded answer (an unparsed answer falls back per `localization_fallback`).
        localization_scoring (`str`, defaults to `"calibrated"`): `"plain"` log-probabilities or `"calibrated"` (divided
            by those on a content-free chain of the same length).
        localization_fallback (`str`, defaults to `"scored"`): with `localization="generate"`, where an unparsed
            answer's reset comes from: `"scored"` or `"random"` (uniform, as before this option existed).
        localization_temperature (`float`, defaults to `0.0`): 0 = argmax of the scores; > 0 samples from
            `softmax(scores / temperature)`.
        step_checker (`str` or `None`, defaults to `None`): a named step checker (`"chain"`, `"sums"`, `"keychain"`: the
            tool regime's, one step per model turn); a callable can be passed to `SRPOTrainer(step_checker=...)`
            instead. Needed by `reset="oracle"`; with any reset it adds the localization quality metrics.
        reset_groups (`int` or `None`, defaults to `None`): shared-prefix groups per prompt (distinct seeds). None:
            derived from `num_generations` (see above).
        suffixes_per_reset (`int` or `None`, defaults to `None`): suffixes resampled from each reset state. None:
            derived from `num_generations`.
        seed_source (`str`, defaults to `"fresh"`): `"fresh"` = seeds are extra iid rollouts, never in the base
            group (paper §4.2, keeps the base group iid); `"base"` = the first failed base rollouts are the seeds
            (paper Appendix D, "after a failed Group 1 rollout"): no seed generation at all, and a prompt whose base
            group has no failure falls back to GRPO. Needs a base group.
        seed_candidates_per_round (`int`, defaults to `1`): fresh iid rollouts sampled per prompt and round while
            looking for incorrect seeds.
        max_seed_rounds (`int`, defaults to `4`): rounds before giving up (fallback to GRPO on the base group).
        success_reward (`str`, `int` or `None`, defaults to `None`): the verifier reward function (name or index;
            None = the first).
        success_threshold (`float`, defaults to `1.0`): a rollout is correct when the verifier's raw reward is
            `>= success_threshold`.
        thought_delimiter (`str` or `None`, defaults to `None`): text that ends a thought; None = the one the
            rollout template asks for (`"\\n"` for `"lines"`, else `"</thought>"`). `"lines"` with another one is
            refused.
        rollout_template (`str`, defaults to `"thought_mdp"`): the instruction wrapped around every question.
        localization_template (`str`): the self-localization prompt (Appendix D).
        localization_max_tokens (`int`, defaults to `64`): new-token cap of the (greedy) localization call.
        reset_seed (`int` or `None`, defaults to `None`): seed of the reset-index generator (`seed` when None).
    """

    def __post_init__(self):
        self._validate_success_arguments()
        adopt_activation_checkpointing(self)  # TRL's default under transformers' new name: no FutureWarning
        self._check_srpo_fields()
        super().__post_init__()
        self._check_srpo_after_grpo()


def implied_thought_delimiter(rollout_template: str | None, thought_delimiter: str | None) -> str:
    """The thought delimiter of a run: ``thought_delimiter`` when given (a literal ``\\n`` from YAML or the command
    line means a newline), else the one ``rollout_template`` asks the model to write: ``"\\n"`` for ``"lines"`` (one
    step per line), ``"</thought>"`` (the paper's) for any other. ``"lines"`` with another delimiter is refused: the
    model writes no such text, so every seed would be one thought and every reset would go to the question."""
    if thought_delimiter is None or thought_delimiter in ("none", "null"):  # YAML null / CLI "None"
        return "\n" if rollout_template == "lines" else "</thought>"
    if not isinstance(thought_delimiter, str) or not thought_delimiter:
        raise ValueError(f"thought_delimiter must be a non-empty string or None, got {thought_delimiter!r}.")
    thought_delimiter = thought_delimiter.replace("\\n", "\n")
    if rollout_template == "lines" and thought_delimiter != "\n":
        raise ValueError(
            f"rollout_template='lines' asks for one step per line, so thoughts end at '\\n', but "
            f"thought_delimiter={thought_delimiter!r}: every seed would be one thought and every reset would go to "
            "the question (SRPO as GRPO on two groups). Leave thought_delimiter unset (it follows the template) or "
            "set thought_delimiter='\\n'."
        )
    return thought_delimiter


def default_suffixes(num_generations: int) -> int:
    """Suffixes of the single reset group of the default split: half the budget, rounded down (the base group
    gets the odd row); the whole budget when it cannot hold two groups of two (num_generations < 4)."""
    if num_generations < 2:
        raise ValueError(
            f"num_generations must be >= 2 (a group of one has no group-relative advantage), got {num_generations}."
        )
    return num_generations if num_generations < 4 else num_generations // 2
