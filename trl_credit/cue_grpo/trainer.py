"""CueGRPOTrainer: GRPOTrainer whose positive advantages are multiplied by rarity weights (docs/cue_grpo.md#positive-set).

A preset of the credit core (:class:`trl_credit.core.trainer.CreditTrainer`): GRPO's rollouts, GRPO's group-normalized
outcome (TRL's advantages), then the :class:`~trl_credit.cue_grpo.parts.RarityWeights` modifier. The loss, KL,
clipping, importance sampling, ... are GRPO's, untouched.
"""

from __future__ import annotations

from trl_credit.core.setup import resolve_method_args
from trl_credit.core.trainer import CreditTrainer, GroupOutcome
from .config import CueGRPOConfig
from .parts import (  # noqa: F401 - positive_sets, checked_partition_labels: importable from here as before
    PartitionFn,
    RarityWeights,
    _check_partition_arguments,
    checked_partition_labels,
    positive_sets,
)

__all__ = ["CueGRPOTrainer"]


class CueGRPOTrainer(CreditTrainer):
    """Drop-in GRPOTrainer with Cue-GRPO's rarity-aware credit redistribution.

    Args (beyond GRPOTrainer's):
        args: a :class:`CueGRPOConfig`.
        partition_fn: with ``cue_partition="callable"``: ``fn(completions: list[str], prompt) -> cluster labels``,
            called once per group with the texts of its positive completions (correct and A_i > 0) and the
            group's prompt as in the dataset; must return one hashable label per completion (a clear ValueError
            naming the function otherwise).
        judge_model: with ``cue_partition="judge"``: a causal LM instance used as judge (overrides
            ``args.cue_judge_model``). A separate judge runs HF ``generate`` on the training device (not vLLM and
            not sharded by DeepSpeed: every process holds a full copy); ``cue_judge_model="policy"`` asks the policy
            itself through TRL's generation path instead (vLLM when ``use_vllm``).
        judge_tokenizer: the judge's tokenizer (default: loaded from the judge's name or path).

    Judged and callable partitions are computed once per group, by one process (groups are dealt round-robin to
    processes), then shared; cue and random partitions are cheap and computed identically on every process.

    Metrics (docs/cue_grpo.md#metrics, next to GRPO's): ``cue/clusters_per_group`` (mean over redistributed groups),
    ``cue/frac_groups_nonuniform`` and ``cue/frac_groups_redistributed`` (over all groups of the step),
    ``cue/weight_spread`` (mean max - min of w' over P), ``cue/single_cluster_rate`` (groups with |P| >= 2 whose P
    is one cluster; warned once above 0.5), ``cue/mass_slope`` (log-log slope of the pre-floor cluster
    mass n_C·w̄_C against n_C over the step's clusters, Fig. 2c; logged when two cluster sizes occur) and, for judges,
    ``cue/judge_parse_failure_rate``. Redistributed groups: rewards vary and P is not empty, where P = {correct_i and A_i > 0, loss not masked}
    (correct = ``success_reward`` >= ``success_threshold``); ``cue/frac_positive_advantage_excluded`` is the fraction
    of A_i > 0 completions left out of P.
    """

    _tag_names = ["trl", "grpo", "cue-grpo", "trl_credit"]
    _name = "Cue-GRPO"
    _paper = {
        "title": "When Correct Solutions Repeat: Rarity-Aware Credit Redistribution for GRPO",
        "id": None,  # no arXiv id known to us: no Hub paper link in the model card
        "citation": "@misc{cuegrpo, title = {When Correct Solutions Repeat: Rarity-Aware Credit Redistribution for "
        "GRPO}, note = {https://github.com/CzZ12/When-Correct-Solutions-Repeat-Rarity-Aware-Credit-Redistribution-for-GRPO}}",
    }

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: CueGRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
        *,
        partition_fn: PartitionFn | None = None,
        judge_model=None,
        judge_tokenizer=None,
    ):
        args = resolve_method_args(args, CueGRPOConfig, model, "CueGRPOTrainer", "Cue-GRPO")
        _check_partition_arguments(args, partition_fn, judge_model, judge_tokenizer)
        self.rarity_weights = RarityWeights(partition_fn, judge_model, judge_tokenizer)
        super().__init__(
            model,
            reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            quantization_config=quantization_config,
            peft_config=peft_config,
            tools=tools,
            rollout_func=rollout_func,
            environment_factory=environment_factory,
            credit=GroupOutcome(nonfinite_metric="cue/nonfinite_reward_rate"),
            modifiers=[self.rarity_weights],
        )

    # What the trainer exposed before its parts existed (tests, benchmarks, user code).
    @property
    def partition_fn(self):
        return self.rarity_weights.partition_fn

    @property
    def judge_model(self):
        return self.rarity_weights.judge_model

    @property
    def judge_tokenizer(self):
        return self.rarity_weights.judge_tokenizer

    @property
    def cue_overhead_seconds(self) -> list[float]:
        return self.rarity_weights.overhead_seconds
