"""``--push_to_hub`` end to end against a local Hub (tests/local_hub.py, on 127.0.0.1): the example runner pushes
the adapter and its card in one commit and says where; the pushed card's quick start, run as written by someone
else (fresh process, empty Hugging Face cache), loads base and adapter by repo id and gives the trained model's
logits.

The runs are subprocesses: the Hub is reached with ``HF_ENDPOINT`` and without ``HF_HUB_OFFLINE``, which
huggingface_hub reads once, when imported; the test process itself stays offline.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from trl_credit.tasks.rewards import completion_text

from tests.local_hub import LocalHub, repo_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE, ADAPTER = "tiny-org/tiny-llama", "local-user/srpo-tiny"


def parity_reward(completions, **kwargs):
    # Correct (1.0) when the text length is odd: about half the random rollouts fail (SRPO has seeds to reset) and
    # the rewards vary within each group, so one step moves LoRA's B away from zero.
    return [float(len(completion_text(c)) % 2) for c in completions]


# The user's job: examples/train_srpo.py's defaults and runner, then the trained model's logits on the prompt the
# card's quick start builds (its first training question in the rollout template, chat template, generation prompt).
TRAIN = """
import runpy, sys, torch
from trl_credit import SRPOConfig, SRPOTrainer
from trl_credit.model_card import trained_rollout_template, training_question
from trl_credit.scripts import main
from trl_credit.srpo.prompts import resolve_rollout_template, wrap_prompt
defaults = runpy.run_path("examples/train_srpo.py")["DEFAULTS"]
trainer = main(SRPOTrainer, SRPOConfig, defaults, argv=sys.argv[2:])
# the prompt it trained on: SRPO's "lines" rollout template around the question, as the card's quick start asks
template = resolve_rollout_template(trained_rollout_template(trainer))
question = wrap_prompt(training_question(trainer.train_dataset), template)
inputs = trainer.processing_class.apply_chat_template(
    [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
)
model = trainer.model.eval()
with torch.no_grad():
    torch.save({"input_ids": inputs["input_ids"], "logits": model(**inputs).logits}, sys.argv[1])
"""

# Someone else: the card's quick start as pushed, then the logits of the model it loaded (and of its base alone).
RELOAD = """
import re, sys, torch
from huggingface_hub import hf_hub_download
card = open(hf_hub_download(sys.argv[2], "README.md")).read()
code = re.search(r"```python\\n(.*?)```", card, re.S).group(1)
scope = {}
exec(compile(code, "quick_start", "exec"), scope)
model, inputs = scope["model"].eval(), scope["inputs"]
with torch.no_grad():
    logits = model(**inputs).logits
    with model.disable_adapter():
        base_logits = model(**inputs).logits
torch.save({"input_ids": inputs["input_ids"], "logits": logits, "base_logits": base_logits}, sys.argv[1])
"""


@pytest.fixture
def local_hub(tmp_path):
    try:
        import olah  # noqa: F401
    except ImportError:  # a dev dependency: missing it is a failure to report, not a reason to skip
        pytest.fail('the local Hub needs olah: pip install -e ".[dev]"')
    with LocalHub(str(tmp_path / "hub"), max_seconds=600) as hub:  # outlives both runs' timeouts
        yield hub


def _online_env(hub, hf_home):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    pythonpath = [ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(hf_home), HF_TOKEN="hf_local_test_token",
               HF_DATASETS_OFFLINE="1", PYTHONPATH=os.pathsep.join(pythonpath), OMP_NUM_THREADS="1",
               HF_HUB_DISABLE_TELEMETRY="1")
    return env


def _run(code, args, env, cwd, timeout=240):
    result = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result.stdout


def test_push_to_hub_round_trip(local_hub, tiny_model_path, tmp_path):
    local_hub.seed(BASE, tiny_model_path)  # the base model is on the Hub, so the card can name it
    out = tmp_path / "out"
    train_argv = [
        "--model_name_or_path", BASE,
        "--output_dir", str(out),
        "--push_to_hub", "--hub_model_id", ADAPTER,
        "--reward_funcs", "tests.test_push_to_hub.parity_reward",
        "--max_steps", "1",
        "--per_device_train_batch_size", "8", "--num_generations", "8",
        "--max_completion_length", "8", "--localization_max_tokens", "8",
        "--learning_rate", "0.05",
        "--arithmetic_num_train", "8", "--arithmetic_num_test", "4",
        "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj",
        "--use_cpu", "true",
    ]
    printed = _run(TRAIN, [str(tmp_path / "trained.pt"), *train_argv], _online_env(local_hub, tmp_path / "hf1"),
                   cwd=ROOT)

    # One push per run: the Hub's initial commit, then the end-of-training commit with adapter and card.
    assert local_hub.commit_messages(ADAPTER) == ["initial commit", "End of training"]
    files = local_hub.files(ADAPTER)
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= set(files)
    assert not any(name.startswith(("checkpoint-", "_")) for name in files)
    assert json.loads(local_hub.read(ADAPTER, "adapter_config.json"))["base_model_name_or_path"] == BASE
    card = local_hub.read(ADAPTER, "README.md")
    assert f"base_model: {BASE}" in card
    tags = yaml.safe_load(card.split("---")[1])["tags"]
    assert "srpo" in tags and "rrpo" not in tags  # the runner's default reset="self": SRPO, not RRPO
    assert f'base_model = "{BASE}"' in card and f'.from_pretrained(base_model), "{ADAPTER}")' in card

    # The closing summary names the Hub the push went to (HF_ENDPOINT here), not huggingface.co.
    assert f"Pushed to {local_hub.endpoint}/{ADAPTER}\n" in printed
    assert "huggingface.co" not in printed

    # Someone else runs the pushed quick start: by repo id, from an empty cache, in another folder.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _run(RELOAD, [str(tmp_path / "reloaded.pt"), ADAPTER], _online_env(local_hub, tmp_path / "hf2"), cwd=elsewhere)
    trained = torch.load(tmp_path / "trained.pt")
    reloaded = torch.load(tmp_path / "reloaded.pt")
    assert torch.equal(reloaded["input_ids"], trained["input_ids"])
    torch.testing.assert_close(reloaded["logits"], trained["logits"])
    # the adapter moved the model, so the match above needs the pushed adapter, not just the base model
    assert (reloaded["base_logits"] - trained["logits"]).abs().max() > 1e-3
    assert local_hub.commit_messages(ADAPTER) == ["initial commit", "End of training"]  # reading pushed nothing


# The local Hub itself answers as the Hub does where the round trip above relies on it.
HUB_CALLS = """
import json, sys
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError
api, seeded, new = HfApi(), sys.argv[1], "local-user/new-repo"
out = {"sha": api.model_info(seeded).sha, "config": json.load(open(hf_hub_download(seeded, "config.json")))}
try:
    hf_hub_download(seeded, "absent.json")
except EntryNotFoundError:
    out["absent"] = "EntryNotFound"
try:
    api.model_info("local-user/nothing-here")
except RepositoryNotFoundError:
    out["no_repo"] = "RepositoryNotFound"
out["url"] = api.create_repo(new)
out["url_again"] = api.create_repo(new, exist_ok=True)
api.upload_file(path_or_fileobj=b"hello", path_in_repo="a/b.txt", repo_id=new, commit_message="add b")
out["files"] = sorted(api.list_repo_files(new))
print(json.dumps(out))
"""


def test_local_hub_answers_as_the_hub(local_hub, tiny_model_path, tmp_path):
    local_hub.seed(BASE, tiny_model_path)
    printed = _run(HUB_CALLS, [BASE], _online_env(local_hub, tmp_path / "hf"), cwd=tmp_path, timeout=120)
    out = json.loads(printed.strip().splitlines()[-1])
    head = subprocess.run(["git", "-C", repo_dir(local_hub.root, BASE), "rev-parse", "main"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert out["sha"] == head
    with open(os.path.join(tiny_model_path, "config.json")) as f:
        assert out["config"] == json.load(f)
    assert out["absent"] == "EntryNotFound" and out["no_repo"] == "RepositoryNotFound"
    assert out["url"] == out["url_again"] == f"{local_hub.endpoint}/local-user/new-repo"
    assert out["files"] == [".gitattributes", "a/b.txt"]
    assert local_hub.commit_messages("local-user/new-repo") == ["initial commit", "add b"]
    assert local_hub.read("local-user/new-repo", "a/b.txt") == "hello"
