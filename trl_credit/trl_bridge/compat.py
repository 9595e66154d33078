"""The one place where trl_credit meets TRL's (and transformers' ``Trainer``'s) private API. Supported: trl 1.14.2 to
1.16.x (``SUPPORTED_TRL``).

trl_credit's trainers subclass ``GRPOTrainer`` and hook into methods and attributes TRL does not promise to keep.
Everything of that kind trl_credit uses is listed here, so a TRL release that changes one fails a test instead of a
training run:

- private functions trl_credit imports come from this module only (with a shim where versions differ);
- :data:`OVERRIDDEN`: the methods the credit core (``CreditTrainer``) and its mixins override, with the parameters
  they receive (the trainers are presets of the core and override none);
- :data:`CALLED`: the methods they call (``self._tokenize_prompts(...)``, ``super()._generate_single_turn(...)``)
  beyond those, with the parameters they pass;
- :data:`ATTRIBUTES` / :data:`VLLM_ATTRIBUTES` / :data:`CONFIG_FIELDS`: what they read or set on the trainer, on
  ``trainer.vllm_generation`` and on ``GRPOConfig``.

``tests/test_trl_contract.py`` checks the installed TRL against these lists (names, signatures, static methods,
return arities, config fields) without training, and scans ``trl_credit/`` for private TRL names that are not
listed here. A new hook or private call must be added to the lists.

Version differences (shimmed below):

- ``trl.trainer.utils.add_fused_lm_head`` exists from 1.15 (TRL's log-prob passes run a fused LM head patched into
  the model's forward). On 1.14.2 they run ``model(...).logits`` and ``selective_log_softmax``; OPPO gets its
  float32 head there by swapping the head module's forward instead (``trl_credit.oppo.oracle``).
- trl 1.15.x has only a Triton implementation of that fused head: without Triton (CPU-only PyTorch) GRPOTrainer
  cannot compute log-probs, and :func:`check_trl_can_train` refuses at construction.
- ``trl.chat_template_utils.parse_response(tools=)`` exists from 1.16: :func:`parse_response` passes ``tools`` only
  where accepted (trl_credit passes ``tools=None``, TRL's default).
- ``trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE`` (the vocabulary chunk of the fused head, 1.15+) and
  ``trl.kernels.chunked_logprob._use_triton`` (whether a device runs its Triton kernel, 1.16+):
  :func:`small_logprob_tiles` lowers the chunk on the CPU (:data:`TRL_GLOBALS`), and does nothing where either is
  missing.
- ``GRPOTrainer._get_per_token_logps_and_entropies`` is ``(model, *args, batch_size=None, compute_aux_loss=False,
  **kwargs)`` on 1.14.2, dispatching to ``_full_logits_logps`` (or ``_chunked_logps`` with ``use_liger_kernel``)
  with the parameters of the later signature; trl_credit calls it the same way on every version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings
from collections.abc import Iterator

import trl
from packaging.version import Version
from trl.chat_template_utils import parse_response as _trl_parse_response
from trl.data_utils import is_conversational
from trl.models import prepare_deepspeed, prepare_fsdp
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer import utils as _trl_utils
from trl.trainer.utils import (
    create_model_from_path,
    disable_dropout_in_model,
    get_config_model_id,
    pad,
    shuffle_sequence_dict,
    use_adapter,
)

__all__ = [
    "SUPPORTED_TRL",
    "TRL_VERSION",
    "HAS_FUSED_LM_HEAD",
    "Hook",
    "OVERRIDDEN",
    "CALLED",
    "ATTRIBUTES",
    "CLASS_ATTRIBUTES",
    "VLLM_ATTRIBUTES",
    "COLOCATE_PUSH_CALL",
    "CONFIG_FIELDS",
    "TRL_FUNCTIONS",
    "TRL_LOGPS_NEED_TRITON",
    "add_fused_lm_head",
    "adopt_activation_checkpointing",
    "hidden_library_deprecations",
    "check_trl_can_train",
    "create_model_from_path",
    "disable_dropout_in_model",
    "disable_gradient_checkpointing",
    "get_config_model_id",
    "is_conversational",
    "pad",
    "parse_response",
    "prepare_deepspeed",
    "prepare_fsdp",
    "require_trl",
    "shuffle_sequence_dict",
    "small_logprob_tiles",
    "TRL_GLOBALS",
    "use_adapter",
]

SUPPORTED_TRL = (Version("1.14.2"), Version("1.17"))  # [min, max)
TRL_VERSION = Version(trl.__version__)

if not SUPPORTED_TRL[0] <= Version(TRL_VERSION.base_version) < SUPPORTED_TRL[1]:
    # pip enforces the range for installs; this catches a TRL installed around it (e.g. from source).
    warnings.warn(
        f"trl_credit supports trl>={SUPPORTED_TRL[0]},<{SUPPORTED_TRL[1]} but trl {trl.__version__} is installed: "
        "its trainers hook into GRPOTrainer internals that change between TRL releases. Run "
        "`pytest tests/test_trl_contract.py` to see which of them this version breaks.",
        UserWarning,
        stacklevel=2,
    )


def require_trl(minimum: str, what: str) -> None:
    """Refuse ``what`` (a feature or option, named in the error) on a TRL older than ``minimum``."""
    if TRL_VERSION < Version(minimum):
        raise ValueError(f"{what} needs trl>={minimum}; trl {trl.__version__} is installed. Upgrade TRL.")


# ------------------------------------------------------------------------------------------------ shims
HAS_FUSED_LM_HEAD = hasattr(_trl_utils, "add_fused_lm_head")  # trl>=1.15
add_fused_lm_head = getattr(_trl_utils, "add_fused_lm_head", None)  # None before 1.15: see HAS_FUSED_LM_HEAD

# trl 1.15.x computes every log-prob with its fused LM head, whose only implementation is a Triton kernel
# (`_ChunkedLogProbFunction` is None without Triton, e.g. with a CPU-only PyTorch build): GRPOTrainer itself then
# fails at its first log-prob pass with an AttributeError. 1.14.2 and 1.16 fall back to plain PyTorch.
TRL_LOGPS_NEED_TRITON = HAS_FUSED_LM_HEAD and getattr(_trl_utils, "_ChunkedLogProbFunction", True) is None


def check_trl_can_train(trainer_name: str) -> None:
    """Refuse, before any model is loaded, a TRL that cannot compute log-probs in this environment."""
    if TRL_LOGPS_NEED_TRITON:
        raise ImportError(
            f"{trainer_name} cannot train with trl {trl.__version__} here: its fused LM head (every log-prob pass of "
            "GRPOTrainer) needs Triton, which is not installed (e.g. a CPU-only PyTorch build). Install trl>=1.16 or "
            "trl==1.14.2, which fall back to plain PyTorch, or Triton with a GPU."
        )


# TRL's fused log-prob head (`_ChunkedLogProbFunction`) walks the vocabulary in chunks of
# `_CHUNKED_LOGPROB_CHUNK_SIZE` = 32768 columns. Without Triton (the CPU) it runs in torch on tiles of every position
# of the micro-batch, prompts included (up to 4096 rows), times the chunk, in fp32, and each tile spawns about six
# temporaries of its size: the README's SRPO job (16 rows of 156 tokens) made 325 MB tiles and ~2.5 GB of transient
# memory in the loss forward and backward. 4096 columns do the same arithmetic in tiles of at most 64 MB.
CPU_LOGPROB_VOCAB_CHUNK = 4096
try:  # trl>=1.16
    from trl.kernels.chunked_logprob import _use_triton as _trl_use_triton
except ImportError:
    _trl_use_triton = None


@contextlib.contextmanager
def small_logprob_tiles(device) -> Iterator[None]:
    """Inside: TRL's fused log-prob head uses :data:`CPU_LOGPROB_VOCAB_CHUNK` vocabulary columns per tile, unless
    ``device`` runs TRL's Triton kernel (CUDA/XPU), which keeps TRL's chunk; restored on exit. Same results: the chunk
    only decides how the vocabulary is walked. Does nothing on a TRL without the fused head or without ``_use_triton``
    (1.14.2; 1.15, which trains only with Triton)."""
    chunk = getattr(_trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", None)
    if _trl_use_triton is None or chunk is None or _trl_use_triton(device) or chunk <= CPU_LOGPROB_VOCAB_CHUNK:
        yield
        return
    _trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = CPU_LOGPROB_VOCAB_CHUNK
    try:
        yield
    finally:
        _trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = chunk


_PARSE_RESPONSE_TAKES_TOOLS = "tools" in inspect.signature(_trl_parse_response).parameters  # trl>=1.16


def parse_response(tokenizer, ids, prefix=None, tools=None) -> dict:
    """TRL's ``parse_response``; ``tools`` (1.16+) can only be passed where accepted, and only ``None`` before."""
    if _PARSE_RESPONSE_TAKES_TOOLS:
        return _trl_parse_response(tokenizer, ids, prefix=prefix, tools=tools)
    if tools is not None:
        raise ValueError(f"parse_response(tools=...) needs trl>=1.16; trl {trl.__version__} is installed.")
    return _trl_parse_response(tokenizer, ids, prefix=prefix)


# ------------------------------------------------------------------------------------------------ registry
@dataclasses.dataclass(frozen=True)
class Hook:
    """A method of ``owner`` trl_credit overrides or calls. ``params``: the parameters (after ``self``) it receives or
    is passed, by name; ``static``: TRL declares it a staticmethod (an override must stay one); ``returns``: the
    tuple length its ``return`` statements have (None: not a tuple we unpack); ``dispatch``: on TRL versions whose
    method takes ``*args, **kwargs``, the methods it forwards them to, which must take ``params``."""

    owner: str = "GRPOTrainer"  # "GRPOTrainer" or "Trainer" (transformers)
    params: tuple[str, ...] = ()
    static: bool = False
    returns: int | None = None
    dispatch: tuple[str, ...] = ()
    users: str = ""


# Methods whose definitions in trl_credit replace TRL's (each calls TRL's through super()).
OVERRIDDEN: dict[str, Hook] = {
    "_generate_and_score_completions": Hook(
        params=("inputs",), users="CreditTrainer (rollout -> credit -> modifiers, inside one vLLM weight push and a rollout capture)"
    ),
    "_generate": Hook(
        params=("prompts",),
        returns=8,  # prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images
        users="CreditTrainer (the batch's rollouts captured for the parts; empty completions refused)",
    ),
    "_generate_single_turn": Hook(
        params=("prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"),
        returns=2,  # completion_ids, logprobs
        users="CreditTrainer -> parts' generate_single_turn: OPPO (float32 head + generation record), DATPO (entropy record) (its empty completions refused by _generate's check, around whatever the instance calls)",
    ),
    "_calculate_rewards": Hook(
        params=("inputs", "prompts", "completions", "completion_ids_list"), users="CreditTrainer (the global rewards of the batch captured for the parts)"
    ),
    "_tool_call_loop": Hook(
        params=("prompts", "prompt_ids", "completion_ids", "completions", "logprobs", "images", "multimodal_fields"),
        returns=7,  # tool_mask, completions, completion_ids, logprobs, tool_call_count, tool_failure_count, tool_images
        users="CreditTrainer (a rollout's finished multi-turn rows handed to TRL's _generate: SRPO's resets); "
              "core.tool_loop calls GRPOTrainer's own to resume rollouts from a prefix",
    ),
    "_prepare_inputs": Hook(params=("generation_batch",), users="CreditTrainer -> parts' prepare_inputs: DATPO (variable row count)"),
    "_compute_loss": Hook(params=("model", "inputs"), users="CreditTrainer (sequence anchors: OPPO, process) -> parts' loss: DATPO (alpha, renormalization)"),
    "compute_loss": Hook(
        params=("model", "inputs", "return_outputs", "num_items_in_batch"), users="CreditTrainer -> parts' micro_batch_loss: DATPO (rows_per_forward)"
    ),
    "get_off_policy_mask": Hook(
        params=("advantages", "per_token_logps", "sampling_per_token_logps", "mask", "off_policy_threshold"),
        static=True,
        users="CreditTrainer (decided per sequence where a credit sets anchors: OPPO, process)",
    ),
    "get_gamma_weights": Hook(
        params=(
            "advantages", "log_ratio_per_token", "mask", "importance_sampling_ratio",
            "k_pos", "lambda_pos", "k_neg", "lambda_neg",
        ),
        static=True,
        users="CreditTrainer (decided per sequence where a credit sets anchors: OPPO, process)",
    ),
    "training_step": Hook(
        params=("model", "inputs", "num_items_in_batch"), users="CPUMemoryMixin (small log-prob tiles on the CPU)"
    ),
    "create_model_card": Hook(params=("model_name", "dataset_name", "tags"), users="MethodModelCardMixin"),
    "_save": Hook(owner="Trainer", params=("output_dir", "state_dict"), users="MethodModelCardMixin"),
    "_save_rng_state": Hook(owner="Trainer", params=("output_dir",), users="MethodRNGStateMixin"),
    "_load_rng_state": Hook(owner="Trainer", params=("checkpoint",), users="MethodRNGStateMixin"),
}

# TRL methods trl_credit calls that it does not override.
CALLED: dict[str, Hook] = {
    "_tokenize_prompts": Hook(
        params=("prompts",), returns=3, users="OPPO (oracle prompts), SRPO (seeds, localization)"
    ),  # prompt_ids, images, multimodal_fields
    "_get_per_token_logps_and_entropies": Hook(
        params=("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy"),
        returns=3,  # logps, entropies, aux_loss
        dispatch=("_full_logits_logps", "_chunked_logps"),  # trl 1.14.2
        users="scoring.score_completions (OPPO's evidence, DATPO's scoring)",
    ),
}

# How GRPOTrainer calls ``rollout_func`` (trl 1.14.2 to 1.16): the method and the call, which the core's adapter
# (CreditTrainer._rollout_func_of_parts, behind a rollout's Rollout.rollout_rows: SRPO's resets) takes as it is.
ROLLOUT_FUNC_CALL: tuple[str, str] = ("_generate", "self.rollout_func(prompts, self)")

# Instance attributes GRPOTrainer sets (in __init__ or on the way) that trl_credit reads or sets.
ATTRIBUTES: tuple[str, ...] = (
    # private
    "_buffered_inputs", "_entropy_bonus_enabled", "_is_vlm", "_last_loaded_step", "_logs", "_metrics",
    "_pending_extra_logs", "_pending_metrics", "_step", "_tokenizer",
    # the tool loop's (core.tool_loop: per-row tool dicts, environment names, TRL's round budget)
    "_async_tool_dicts", "_batch_environments", "_env_tools", "_multi_environment", "_standalone_tools",
    "_sync_tool_dicts", "max_tool_calling_iterations",
    # public but undocumented
    "aux_loss_enabled", "environment_factories", "environments", "eos_token_ids", "generation_config", "generation_kwargs", "loss_type",
    "mask_truncated_completions", "max_completion_length", "min_p", "multi_objective_aggregation",
    "num_generations", "num_generations_eval", "num_iterations", "pad_to_multiple_of", "ref_model",
    "repetition_penalty", "reward_func_names", "reward_funcs", "reward_weights", "rollout_func", "scale_rewards",
    "temperature", "tools", "top_k", "top_p", "use_transformers_continuous_batching", "use_vllm", "vllm_generation",
    "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_mode",
)
CLASS_ATTRIBUTES: tuple[str, ...] = ("_name", "_paper", "_tag_names")  # read by the model card

# Attributes of ``trainer.vllm_generation`` (trl.generation.vllm_generation.VLLMGeneration) set or read by
# ``generation.sampling_overrides``, ``generation.one_weight_push``, ``generation.vllm_hooks`` and
# ``trl_bridge.vllm_push`` (which streams ``_iter_named_params`` into vLLM's ``reload_weights``).
VLLM_ATTRIBUTES: tuple[str, ...] = (
    "_iter_named_params", "_llm_weights_sleeping", "enable_sleep_mode", "generation_kwargs", "llm",
    "max_completion_length", "mode", "sync_weights", "temperature", "tensor_parallel_size", "top_p",
)
# What ``trl_bridge.vllm_push.reload_push`` replaces: TRL's colocate push loads through the engine model's
# ``load_weights`` (tests/test_trl_contract.py checks the source still does).
COLOCATE_PUSH_CALL: str = "model_runner.model.load_weights("

# GRPOConfig (TrainingArguments) fields trl_credit reads, plus the class attribute its configs extend.
CONFIG_FIELDS: tuple[str, ...] = (
    "cast_lm_head_to_fp32", "data_seed", "disable_dropout", "gradient_checkpointing_kwargs", "logging_steps",
    "max_completion_length", "max_steps", "multi_objective_aggregation", "output_dir", "per_device_eval_batch_size",
    "per_device_train_batch_size", "push_to_hub", "report_to", "seed", "steps_per_generation", "temperature",
    "top_p", "trust_remote_code", "use_liger_kernel",
)
CONFIG_CLASS_ATTRIBUTES: tuple[str, ...] = ("_VALID_DICT_FIELDS",)

# Module globals of TRL's non-public modules trl_credit reads or sets: module -> (name, first TRL version with it).
TRL_GLOBALS: dict[str, tuple[str, str]] = {
    "_CHUNKED_LOGPROB_CHUNK_SIZE": ("trl.trainer.utils", "1.15"),  # set by small_logprob_tiles
    "_use_triton": ("trl.kernels.chunked_logprob", "1.16"),  # read by small_logprob_tiles
    "_ChunkedLogProbFunction": ("trl.trainer.utils", "1.14.2"),  # None on 1.15 without Triton: TRL_LOGPS_NEED_TRITON
}

# Functions imported from TRL's non-public modules (re-exported above), with the parameters trl_credit passes.
TRL_FUNCTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "add_fused_lm_head": ("trl.trainer.utils", ("model", "temperature", "cast_lm_head_to_fp32")),  # trl>=1.15
    "create_model_from_path": ("trl.trainer.utils", ("model_id",)),
    "disable_dropout_in_model": ("trl.trainer.utils", ("model",)),
    "disable_gradient_checkpointing": ("trl.models.utils", ("model", "gradient_checkpointing_kwargs")),
    "get_config_model_id": ("trl.trainer.utils", ("config",)),
    "is_conversational": ("trl.data_utils", ("example",)),
    "pad": ("trl.trainer.utils", ("tensors", "padding_value", "padding_side", "pad_to_multiple_of")),
    "parse_response": ("trl.chat_template_utils", ("tokenizer", "ids", "prefix")),  # + tools on trl>=1.16
    "prepare_deepspeed": ("trl.models", ("model", "accelerator")),
    "prepare_fsdp": ("trl.models", ("model", "accelerator")),
    "shuffle_sequence_dict": ("trl.trainer.utils", ("seq_dict",)),
    "use_adapter": ("trl.trainer.utils", ("model", "adapter_name")),
}


# transformers >= 5.2x renamed `gradient_checkpointing*` to `activation_checkpointing*`. TRL's configs still default
# the old name to True, so every config built with defaults warned (FutureWarning) about a name the user never set.
def adopt_activation_checkpointing(config) -> None:
    """Before ``TrainingArguments.__post_init__``: TRL's default ``gradient_checkpointing`` passed on under the new
    name, so a config built with defaults does not warn about the old one. A value the user set under the old name
    (anything but TRL's default) keeps it, and the warning about it, which is theirs."""
    names = {f.name: f for f in dataclasses.fields(config)}
    if "activation_checkpointing" not in names or config.activation_checkpointing is not None:
        return  # older transformers (nothing renamed), or the new name is set
    if config.gradient_checkpointing == names["gradient_checkpointing"].default:
        config.activation_checkpointing, config.gradient_checkpointing = config.gradient_checkpointing, None
        kwargs = names["gradient_checkpointing_kwargs"]
        if "activation_checkpointing_kwargs" in names and config.gradient_checkpointing_kwargs == kwargs.default:
            config.activation_checkpointing_kwargs = config.gradient_checkpointing_kwargs
            config.gradient_checkpointing_kwargs = None


# PEFT 0.21 (building the adapter) and TRL 1.16 (its generation context) call the models' renamed
# `gradient_checkpointing*` methods whatever the arguments; no argument of ours avoids it. These exact messages are
# hidden while our trainers build and generate (and while the example scripts run); every other warning is shown.
LIBRARY_INTERNAL_DEPRECATIONS = (
    r"`is_gradient_checkpointing` is deprecated",
    r"`gradient_checkpointing_enable` is deprecated",
    r"`gradient_checkpointing_disable` is deprecated",
)


@contextlib.contextmanager
def hidden_library_deprecations() -> Iterator[None]:
    with warnings.catch_warnings():
        for message in LIBRARY_INTERNAL_DEPRECATIONS:
            warnings.filterwarnings("ignore", message=message, category=FutureWarning)
        yield
