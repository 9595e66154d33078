"""What a part reads and does in one generation batch, instead of the trainer (docs/design.md#the-batch-context).

The credit core builds one :class:`BatchContext` per generation batch (training and evaluation) and hands it to every
batch-time hook of every part: ``Rollout.generate_and_score`` / ``rollout_rows`` (inside TRL's ``rollout_func``) /
``training_batch``, ``Credit.advantages``, ``Modifier.apply``. Hooks outside a generation batch (the middlewares around TRL's ``_generate_single_turn``,
``_prepare_inputs``, ``compute_loss``, ``_compute_loss``) get a context of the same class without a batch
(``inputs`` empty, no capture, no record). Only ``Part.setup(trainer)``, at construction, keeps the trainer.

A context holds plain values (``args``, ``mode``, ``step``, the process layout, the reward settings TRL's advantages
use) and a few verbs. Over a trainer (:meth:`BatchContext.for_trainer`) each verb is implemented here, in one place,
through the shared modules (:mod:`trl_credit.core.collectives`, :mod:`trl_credit.core.generation`,
:mod:`trl_credit.core.logs`) and :mod:`trl_credit.trl_bridge.privates` for TRL's privates; each docstring says what of the
trainer it reads. Without a trainer (``BatchContext(args=..., ...)``, one process) the plain values and the verbs
``metric``, ``warn``, ``gather``, ``gather_rows``, ``gather_counts``, ``cut``, ``rng``, ``scratch``,
``collective_forward`` and ``refuse_empty_completions`` work, so a credit or a modifier runs on a record and its args
alone (tests/test_context.py); the verbs that need a model (``generate``, ``score``,
``tokenize``, ``policy``, ...) raise a clear error there.

Part state that lives for one batch lives in :meth:`BatchContext.scratch` (a dict per part, gone with the batch);
state that lives across batches (random generators, round counters) stays on the part and is checkpointed through
``Part.rng_state``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from types import SimpleNamespace

import torch

__all__ = ["BatchContext", "hook_context"]


class BatchContext:
    """One generation batch as the parts see it (module docstring).

    Plain values: ``args`` (the trainer's config), ``mode`` (``"train"`` / ``"eval"``), ``step`` (the global
    optimizer step), ``process_index``, ``num_processes``, ``device``, ``is_main_process``, ``inputs`` (this
    process's rows of the generation batch), ``capture`` (what TRL generated and the reward matrix:
    :class:`~trl_credit.core.mixins.RolloutCapture`), ``record`` (the batch's :class:`~trl_credit.core.batch.RowBatch`, set by
    the core once the rollout built it), ``reward_weights``, ``reward_func_names``, ``scale_rewards``,
    ``multi_objective_aggregation`` and ``group_size`` (TRL's ``num_generations`` of the mode), ``success_index``
    (the verifier's column, None without a verifier setting), ``sampling`` (TRL's generation settings:
    ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``, ``use_vllm``,
    ``use_transformers_continuous_batching``, ``pad_to_multiple_of``, ``custom_rollout``: a ``rollout_func``
    generates the rows, and ``tool_loop``: TRL's tool loop runs), ``metrics`` (name -> logged values of this mode).
    """

    def __init__(self, *, args, mode: str = "train", step: int = 0, process_index: int = 0, num_processes: int = 1,
                 device="cpu", is_main_process: bool = True, inputs: Sequence = (), capture=None,
                 reward_weights: torch.Tensor | None = None, reward_func_names: Sequence[str] = (),
                 scale_rewards="group", multi_objective_aggregation: str = "sum_then_normalize",
                 group_size: int | None = None, success_index: int | None = None, sampling=None, metrics=None,
                 warned: set | None = None, owner: str = "CreditTrainer", trainer=None):
        if mode not in ("train", "eval"):
            raise ValueError(f"BatchContext: mode must be 'train' or 'eval', got {mode!r}")
        self.args = args
        self.mode = mode
        self.step = int(step)
        self.process_index = int(process_index)
        self.num_processes = int(num_processes)
        self.device = torch.device(device)
        self.is_main_process = bool(is_main_process)
        self.inputs = inputs
        self.capture = capture
        self.record = None
        self.reward_weights = (torch.ones(len(reward_func_names), dtype=torch.float32) if reward_weights is None
                               else reward_weights)
        self.reward_func_names = list(reward_func_names)
        self.scale_rewards = scale_rewards
        self.multi_objective_aggregation = multi_objective_aggregation
        self.group_size = group_size
        self.success_index = success_index
        self.sampling = sampling if sampling is not None else _sampling(args)
        self.metrics = defaultdict(list) if metrics is None else metrics
        self._warned = set() if warned is None else warned
        self._owner = owner
        self._scratch: dict[int, dict] = {}
        self._trainer = trainer

    # ------------------------------------------------------------------------------------------------ construction
    @classmethod
    def for_trainer(cls, trainer, inputs: Sequence = (), capture=None) -> BatchContext:
        """The context of a ``CreditTrainer`` (built by the core). Reads ``trainer.args``, ``trainer.model.training``
        (the mode), ``trainer.state.global_step``, ``trainer.accelerator`` (process layout), TRL's reward settings
        (``reward_weights``, ``reward_func_names``, ``scale_rewards``, ``multi_objective_aggregation``,
        ``num_generations`` / ``num_generations_eval``), the core's ``_success_index`` (bridge), TRL's ``_metrics``
        buffer of the mode and the core's set of warnings given."""
        from trl_credit.core.logs import warned_keys
        from trl_credit.core.setup import trainer_mode
        from trl_credit.trl_bridge import privates as bridge

        mode = trainer_mode(trainer)
        accelerator = trainer.accelerator
        return cls(
            args=trainer.args, mode=mode, step=trainer.state.global_step, process_index=accelerator.process_index,
            num_processes=accelerator.num_processes, device=accelerator.device,
            is_main_process=accelerator.is_main_process, inputs=inputs, capture=capture,
            reward_weights=trainer.reward_weights, reward_func_names=trainer.reward_func_names,
            scale_rewards=trainer.scale_rewards, multi_objective_aggregation=trainer.multi_objective_aggregation,
            group_size=trainer.num_generations if mode == "train" else trainer.num_generations_eval,
            success_index=bridge.success_index(trainer) if hasattr(trainer, "_success_index") else None,
            sampling=_sampling(trainer, custom_rollout=getattr(trainer, "rollout_func", None) is not None,
                               tool_loop=bool(getattr(trainer, "tools", None))),
            metrics=bridge.metrics(trainer)[mode], warned=warned_keys(trainer),
            owner=type(trainer).__name__, trainer=trainer,
        )

    def _one_process(self, verb: str) -> None:
        if self.num_processes != 1:
            raise RuntimeError(f"BatchContext.{verb}: {self.num_processes} processes need a trainer's accelerator to "
                               "gather; this context was built without one.")

    def _needs_trainer(self, verb: str):
        if self._trainer is None:
            raise RuntimeError(f"BatchContext.{verb} needs the trainer's model; this context was built without one "
                               "(BatchContext.for_trainer builds one that has it).")
        return self._trainer

    # ------------------------------------------------------------------------------------------------ one-batch state
    def scratch(self, part) -> dict:
        """A dict for ``part``'s state of this batch (one per part object; a new batch starts empty)."""
        return self._scratch.setdefault(id(part), {})

    def rng(self, *key) -> random.Random:
        """A generator seeded by the run's seed (``args.seed``), this batch's step and ``key`` (the caller's: a
        round, a group), ``random.Random("seed:step:key...")``: the same draws on every process and in a resumed
        run, none shared between keys. A part whose draws continue across batches keeps its own generator
        (``Part.rng_state``)."""
        return random.Random(":".join(str(part) for part in (self.args.seed, self.step, *key)))

    # ------------------------------------------------------------------------------------------------ reporting
    def speaker(self, part=None) -> str:
        """Who a message speaks as (``trainer_setup.speaker``: the class the user built, and the part in a composed
        trainer); without a trainer, the owner name given and the part's name."""
        if self._trainer is not None:
            from trl_credit.core.setup import speaker

            return speaker(self._trainer, part)
        return self._owner if part is None else f"{self._owner} ({getattr(part, 'name', part)})"

    def metric(self, name: str, value: float) -> None:
        """Append a scalar to TRL's metric buffer of the mode (``GRPOTrainer._metrics[mode]``; without a trainer,
        ``self.metrics``). TRL averages it over the logging window; pass values already reduced over processes."""
        self.metrics[name].append(float(value))

    def warn(self, key: str, message: str) -> None:
        """Warn once per trainer and ``key`` (on the main process) that a part could not do its job on some input;
        the caller also logs the matching rate metric every step."""
        from trl_credit.core.logs import warn_once_among

        warn_once_among(self._warned, key, message, self.is_main_process, stacklevel=2)

    @property
    def success_reward_name(self) -> str:
        """The verifier's name (``reward_func_names[success_index]``), for messages."""
        return self.reward_func_names[self.success_index]

    # ------------------------------------------------------------------------------------------------ processes
    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``accelerator.gather(tensor)``: every process's tensor concatenated on dim 0 in process order (a
        collective call); one process: the tensor itself."""
        if self._trainer is None:
            self._one_process("gather")
            return tensor
        return self._trainer.accelerator.gather(tensor)

    def gather_rows(self, rows: list) -> list:
        """Per-process Python lists concatenated in process order (``collectives.gather_rows``; a collective call)."""
        if self._trainer is None:
            self._one_process("gather_rows")
            return list(rows)
        from trl_credit.core.collectives import gather_rows

        return gather_rows(self._trainer, rows)

    def gather_counts(self, count: int) -> list[int]:
        """``count`` of every process, in process order (``collectives.gather_counts``; a collective call)."""
        if self._trainer is None:
            self._one_process("gather_counts")
            return [int(count)]
        from trl_credit.core.collectives import gather_counts

        return gather_counts(self._trainer, count)

    def cut(self, values, num_local: int):
        """A global tensor or list (rows of every process, ``num_local`` each, in process order) cut to this
        process's rows (TRL's ``process_slice``: ``collectives.process_rows``, as ``RowBatch.local_rows``)."""
        from trl_credit.core.collectives import process_rows

        return values[process_rows(self.process_index, num_local)]

    # ------------------------------------------------------------------------------------------------ the models
    @property
    def has_model(self) -> bool:
        """Whether the verbs that need the trainer's model and tokenizer work (a context built over a trainer)."""
        return self._trainer is not None

    @property
    def tokenizer(self):
        """The processing class's tokenizer (``GRPOTrainer._tokenizer``, through the bridge)."""
        from trl_credit.trl_bridge import privates as bridge

        return bridge.tokenizer(self._needs_trainer("tokenizer"))

    @property
    def processing_class(self):
        """``trainer.processing_class`` (the tokenizer or processor TRL decodes with)."""
        return self._needs_trainer("processing_class").processing_class

    @property
    def environments(self) -> list | None:
        """This process's rows' environment instances (``environment_factory``; TRL's ``environments``, bridge), one
        per row of ``inputs`` in order; None without environments (or without a trainer)."""
        from trl_credit.trl_bridge import privates as bridge

        return None if self._trainer is None else bridge.environments(self._trainer)

    def tokenize(self, prompts, tools: bool = True):
        """``GRPOTrainer._tokenize_prompts(prompts)`` (bridge): ``(prompt_ids, images, multimodal_fields)``.
        ``tools=False``: rendered without the tools' schema (a prompt of the method's own, e.g. SRPO's localization,
        any number of rows)."""
        from trl_credit.trl_bridge import privates as bridge

        trainer = self._needs_trainer("tokenize")
        return bridge.tokenize_prompts(trainer, prompts) if tools else bridge.tokenize_without_tools(trainer, prompts)

    def continue_tool_loop(self, resumes) -> list:
        """Multi-turn rollouts continued through TRL's tool loop (``core.tool_loop.continue_tool_loop``: each
        :class:`~trl_credit.core.tool_loop.Resume` to its whole :class:`~trl_credit.core.tool_loop.Episode`)."""
        from trl_credit.core.tool_loop import continue_tool_loop

        return continue_tool_loop(self._needs_trainer("continue_tool_loop"), resumes)

    def fresh_environments(self, rows) -> list:
        """An environment instance per dataset row of an extra rollout, reset with its columns
        (``core.tool_loop.fresh_environments``); None per row without an ``environment_factory``."""
        from trl_credit.core.tool_loop import fresh_environments

        return fresh_environments(self._needs_trainer("fresh_environments"), rows)

    def replay_environment(self, environment, row, messages) -> bool:
        """``environment`` reset with ``row`` and the tool calls of ``messages`` replayed; True when every result
        equals the recorded one (``core.tool_loop.replay_environment``)."""
        from trl_credit.core.tool_loop import replay_environment

        return replay_environment(self._needs_trainer("replay_environment"), environment, row, messages)

    def generate(self, prefix_ids, **overrides) -> tuple[list[list[int]], list[list[float]] | None]:
        """Extra generation calls from token prefixes through TRL's generation path and every part's
        ``generate_single_turn`` hook (``generation.generate_from_prefixes``: ``chunk_size``, ``max_new_tokens``,
        ``greedy``, ``temperature``, ``top_p``, ``stop_strings``). A collective call."""
        from trl_credit.core import generation

        return generation.generate_from_prefixes(self._needs_trainer("generate"), prefix_ids, **overrides)

    def trl_batch(self, inputs) -> dict:
        """TRL's own generate-and-score of ``inputs`` (the core's ``_trl_generate_and_score_completions``, bridge:
        ``GRPOTrainer._generate_and_score_completions`` with the rollouts and the reward matrix captured into
        ``self.capture``, no part's credit applied): TRL's batch dict of this process's rows."""
        from trl_credit.trl_bridge import privates as bridge

        return bridge.trl_generate_and_score(self._needs_trainer("trl_batch"), inputs)

    def score(self, inputs, prompts, prompt_ids, completion_ids, filler, counts=None, completions=None,
              environments=None) -> list[torch.Tensor]:
        """Reward matrices of rows outside TRL's batch through TRL's own ``_calculate_rewards``
        (``collectives.rewards_of_extra_rows``, which saves and restores TRL's ``_pending_*`` log buffers; multi-turn
        rows pass their ``completions`` (messages) and ``environments``). A collective call."""
        from trl_credit.core.collectives import rewards_of_extra_rows

        return rewards_of_extra_rows(self._needs_trainer("score"), inputs, prompts, prompt_ids, completion_ids,
                                     filler, counts, completions=completions, environments=environments)

    def logprobs(self, prompt_ids, prompt_mask, completion_ids, completion_mask, *, model=None,
                 compute_entropy: bool = False, batch_size: int | None = None):
        """A no-grad scoring pass: per-token log-probs (and entropies) ``(B, T)`` of ``completion_ids`` after
        ``prompt_ids`` under ``model`` (default: the policy), in TRL's layout and batching
        (``scoring.score_completions``: ``GRPOTrainer._get_per_token_logps_and_entropies``, gradient checkpointing
        off for the pass)."""
        from trl_credit.core.scoring import score_completions

        trainer = self._needs_trainer("logprobs")
        return score_completions(trainer, trainer.model if model is None else model, prompt_ids, prompt_mask,
                                 completion_ids, completion_mask, compute_entropy=compute_entropy,
                                 batch_size=batch_size)

    @property
    def policy(self):
        """The policy being trained (``trainer.model``, wrapped as the accelerator prepared it), for no-grad
        scoring passes (OPPO's oracle, SRPO's localization)."""
        return self._needs_trainer("policy").model

    @property
    def causal_lm(self):
        """The policy's causal LM that ``generate`` and the log-prob passes run: ``accelerator.unwrap_model(model)``,
        its PEFT base model when it has one (to hook its forward: OPPO's ``GenerationRecorder``, float32 heads)."""
        trainer = self._needs_trainer("causal_lm")
        model = trainer.accelerator.unwrap_model(trainer.model)
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    @property
    def mixed_precision(self) -> str:
        """``accelerator.mixed_precision`` (``"no"``, ``"bf16"``, ``"fp16"``, ...); ``"no"`` without a trainer."""
        return "no" if self._trainer is None else self._trainer.accelerator.mixed_precision

    @property
    def reference(self):
        """The reference model (``trainer.ref_model``; None when TRL keeps none)."""
        return getattr(self._needs_trainer("reference"), "ref_model", None)

    # ---- rows a rollout builds / training loop verbs
    # What a rollout that builds its own training rows (``Rollout.builds_rows``: DATPO's trees) needs of TRL's row
    # settings, scoring and loss, beyond the verbs above (trl_credit/core/built_rows.py holds the generic moves).
    @property
    def max_steps(self) -> int:
        """The run's optimizer steps (``trainer.state.max_steps``: the Trainer's, from ``max_steps`` or the epochs);
        without a trainer ``args.max_steps``. Schedules over the run read it (DATPO's α_t)."""
        if self._trainer is None:
            return int(getattr(self.args, "max_steps", 0) or 0)
        return int(self._trainer.state.max_steps or 0)

    @property
    def rows(self) -> SimpleNamespace:
        """TRL's settings of the rows it trains on, as ``GRPOTrainer.__init__`` copies them onto itself:
        ``mask_truncated_completions``, ``eos_token_ids``, ``max_completion_length``, ``pad_to_multiple_of`` (also in
        ``sampling``), ``vllm_importance_sampling_mode`` / ``_clip_min`` / ``_clip_max``, and ``pad_token_id`` (the
        tokenizer's, ``GRPOTrainer._tokenizer`` through the bridge). Without a trainer the args' values, and None
        for the tokenizer's ids."""
        source = self.args if self._trainer is None else self._trainer
        values = {name: getattr(source, name, None) for name in _ROWS}
        if self._trainer is None:
            values["eos_token_ids"] = values["pad_token_id"] = None
        else:
            values["eos_token_ids"], values["pad_token_id"] = self.eos_token_ids, self.pad_token_id
        return SimpleNamespace(**values)

    def pad_built_rows(self, prompt_rows, completion_rows):
        """This process's built rows in TRL's layout with filler rows up to the largest row count of any process
        (``built_rows.pad_built_rows``; reads ``rows``). A collective call."""
        from trl_credit.core.built_rows import pad_built_rows

        return pad_built_rows(self, prompt_rows, completion_rows)

    def score_rows(self, model_kind: str, prompt_rows, completion_rows):
        """No-grad log-probs of built rows, as TRL's old (``model_kind="policy"``: ``trainer.model``) or ref
        (``"reference"``: ``trainer.ref_model``, or without one the policy with its PEFT ``"ref"`` adapter when it
        has one, else with the adapters off, as TRL's ref pass) log-probs, with the same number of forwards on every
        process (``built_rows.score_collectively``); None when no process has rows. A collective call."""
        if model_kind not in ("policy", "reference"):
            raise ValueError(f"BatchContext.score_rows: model_kind must be 'policy' or 'reference', got {model_kind!r}")
        from trl_credit.core.built_rows import score_collectively

        trainer = self._needs_trainer("score_rows")
        if model_kind == "policy" or trainer.ref_model is not None:
            model = trainer.model if model_kind == "policy" else trainer.ref_model
            return score_collectively(self, model, prompt_rows, completion_rows)
        from trl_credit.trl_bridge.compat import use_adapter

        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
            return score_collectively(self, trainer.model, prompt_rows, completion_rows)

    def importance_sampling_ratio(self, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """TRL's vLLM importance-sampling ratio of rows TRL did not score (``built_rows.importance_sampling_ratio``
        with the mode and bounds of ``rows``)."""
        from trl_credit.core.built_rows import importance_sampling_ratio

        return importance_sampling_ratio(self.rows, old, sampling, mask)

    def decode_completions(self, prompts, prompt_ids, completion_ids) -> list:
        """Completions decoded as TRL decodes them for the reward functions (``collectives.decode_completions``:
        the processing class, and the tokenizer's response parsing)."""
        from trl_credit.core.collectives import decode_completions

        return decode_completions(self._needs_trainer("decode_completions"), prompts, prompt_ids, completion_ids)

    def generate_call(self, prompt_rows, num_generations: int, *, max_new_tokens: int, row_budgets=None,
                      compact_rows: bool = False):
        """One call of TRL's generation (``GRPOTrainer._generate_single_turn``, bridge, through every part's
        ``generate_single_turn`` hook) of ``num_generations`` consecutive rows per prompt of ``prompt_rows`` (token
        ids, already repeated), with ``max_new_tokens`` for the call (``generation.sampling_overrides``), each row
        stopped at its ``row_budgets`` entry by HF ``generate`` (with shared prefills and, with ``compact_rows``,
        finished rows dropped from the call: ``generation.hooks.hf_generate_hooks``) and by a colocated vLLM
        (``generation.vllm_hooks.vllm_row_budgets``). Returns ``(completion_ids,
        sampling log-probs or None)``. A collective call: the caller makes the same calls with the same row count
        on every process (``generate`` does that for one row per prefix)."""
        from trl_credit.core.generation import sampling_overrides
        from trl_credit.generation.hooks import hf_generate_hooks
        from trl_credit.generation.vllm_hooks import vllm_row_budgets
        from trl_credit.trl_bridge import privates as bridge

        trainer = self._needs_trainer("generate_call")
        with (
            sampling_overrides(trainer, max_new_tokens=max_new_tokens),
            hf_generate_hooks(trainer, row_budgets, compact_rows=compact_rows),
            vllm_row_budgets(trainer, row_budgets),
        ):
            return bridge.generate_single_turn(trainer, prompt_rows, None, {}, num_generations)

    @property
    def deepspeed(self) -> bool:
        """Whether DeepSpeed runs the model (``trainer.is_deepspeed_enabled``); its engine counts the backward calls
        of its own gradient accumulation. False without a trainer."""
        return self._trainer is not None and bool(self._trainer.is_deepspeed_enabled)

    def no_sync(self, model):
        """``accelerator.no_sync(model)``: the backward passes inside do not synchronize gradients across processes
        (a micro-batch back-propagated in pieces syncs once, with its last piece)."""
        return self._needs_trainer("no_sync").accelerator.no_sync(model)

    def backward(self, loss: torch.Tensor) -> None:
        """``accelerator.backward(loss)`` (mixed-precision scaling and the process layout's backward)."""
        self._needs_trainer("backward").accelerator.backward(loss)

    # ---- rollouts inside TRL's rollout_func
    # What a rollout that builds its rows (``Rollout.rollout_rows``: SRPO's resets) needs beyond the verbs above.
    def generate_groups(self, prompt_ids, num_generations: int | None = None):
        """TRL's generation of ``num_generations`` completions per prompt row (default: the mode's ``group_size``)
        for rows already duplicated as TRL's sampler lays them out, no images:
        ``trainer._generate_single_turn(prompt_ids, None, {}, num_generations)`` (bridge: the core's override, so
        every part's ``generate_single_turn`` hook runs, then TRL's). Returns ``(completion_ids, sampling
        log-probs or None)``. A collective call."""
        from trl_credit.trl_bridge import privates as bridge

        size = self.group_size if num_generations is None else num_generations
        return bridge.generate_single_turn(self._needs_trainer("generate_groups"), prompt_ids, None, {}, size)

    def autocast(self):
        """``trainer.accelerator.autocast()``: the mixed precision TRL's own forward passes run under, for a part's
        forward of the policy outside TRL's log-prob pass (SRPO's shared-prefix scoring)."""
        return self._needs_trainer("autocast").accelerator.autocast()

    @property
    def unwrapped_policy(self):
        """``accelerator.unwrap_model(trainer.model)``: the policy without DDP / DeepSpeed wrappers, PEFT wrapper
        kept (to read its config, its adapters and its forward's parameters)."""
        trainer = self._needs_trainer("unwrapped_policy")
        return trainer.accelerator.unwrap_model(trainer.model)

    @property
    def collective_forward(self) -> bool:
        """Whether a forward of the policy is a collective call: several processes and sharded parameters (FSDP:
        ``trainer.is_fsdp_enabled``; DeepSpeed ZeRO-3: ``accelerator.state.deepspeed_plugin.zero_stage``), so every
        process must run the same forwards. False without a trainer (one process)."""
        from trl_credit.generation.hooks import forward_is_collective

        return self._trainer is not None and forward_is_collective(self._trainer)

    @property
    def eos_token_ids(self) -> list[int]:
        """``trainer.eos_token_ids`` (TRL's): the token ids that end a completion."""
        return self._needs_trainer("eos_token_ids").eos_token_ids

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's padding id as TRL pads with it (``bridge.pad_token_id``)."""
        from trl_credit.trl_bridge import privates as bridge

        return bridge.pad_token_id(self._needs_trainer("pad_token_id"))

    def refuse_empty_completions(self, completion_ids, source: str, part=None) -> None:
        """Raise a clear error, speaking as ``part`` (:meth:`speaker`), for completions of 0 tokens among rows a part
        hands TRL to train on (``mixins.refuse_empty_rows``: TRL 1.16 reads each completion's last token)."""
        from trl_credit.core.mixins import refuse_empty_rows

        refuse_empty_rows(self.speaker(part), completion_ids, source)

    def __repr__(self) -> str:
        return (f"BatchContext(mode={self.mode!r}, step={self.step}, process={self.process_index}/"
                f"{self.num_processes}, rows={len(self.inputs)}, trainer={self._trainer is not None})")


def hook_context(trainer) -> BatchContext:
    """The context of a hook outside a generation batch (no inputs, capture or record): one per trainer, optimizer
    step (``state.global_step``) and mode, kept on the trainer, since the loss middlewares run once per micro-batch
    and a context holds nothing that changes within a step and mode (its ``scratch`` lives as long)."""
    from trl_credit.core.setup import trainer_mode

    key = (trainer.state.global_step, trainer_mode(trainer))
    cached = getattr(trainer, "_hook_context", None)
    if cached is None or cached[0] != key:
        cached = trainer._hook_context = (key, BatchContext.for_trainer(trainer))
    return cached[1]


_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "use_vllm",
             "use_transformers_continuous_batching", "pad_to_multiple_of")


_ROWS = ("mask_truncated_completions", "eos_token_ids", "pad_token_id", "max_completion_length", "pad_to_multiple_of",
         "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max")


def _sampling(source, custom_rollout: bool = False, tool_loop: bool = False) -> SimpleNamespace:
    """TRL's generation settings, as ``GRPOTrainer.__init__`` copies them from its args onto itself (``source``: the
    trainer, or the args of a context without one; a setting the source lacks is None), with ``custom_rollout`` (a
    ``rollout_func`` generates the rows) and ``tool_loop`` (TRL's tool loop runs: ``tools`` or an
    ``environment_factory``; a completion is then several generation calls with tool results between them)."""
    values = {name: getattr(source, name, None) for name in _SAMPLING}
    return SimpleNamespace(**values, custom_rollout=custom_rollout, tool_loop=tool_loop)
