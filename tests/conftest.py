import os
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tests.tiny import build_tiny_model  # noqa: E402

#: Environment variables naming where a run's temporary files go, pointed under pytest's own temporary folder.
TEMPORARY_FOLDER_VARIABLES = ("TMPDIR", "TEMP", "TMP", "WANDB_DIR", "TRACKIO_DIR")


@pytest.hookimpl(trylast=True)  # after pytest's tmp_path plugin has set up its factory
def pytest_configure(config):
    """Every temporary file of the run goes under pytest's temporary folder (``<basetemp>/tmp``), which pytest
    itself keeps and prunes: ``tempfile.mkdtemp`` in the library and the benchmarks (tiny_testbed_*, learning_*,
    gpu_check_*), torch's caches, wandb's and trackio's folders, and the subprocesses the tests start (torchrun's
    torchelastic_* folders), which inherit TMPDIR. A run with a fresh TMPDIR leaves only pytest's own folder there
    (tests/test_temporary_files.py checks it). trackio reads its folder once, when imported (TRL imports it with
    GRPOTrainer), so it is set here, before any test module is collected: never the user's
    ~/.cache/huggingface/trackio."""
    folder = config._tmp_path_factory.getbasetemp() / "tmp"
    (folder / "trackio").mkdir(parents=True, exist_ok=True)
    config._saved_temporary_folders = ({name: os.environ.get(name) for name in TEMPORARY_FOLDER_VARIABLES},
                                       tempfile.tempdir)
    for name in ("TMPDIR", "TEMP", "TMP", "WANDB_DIR"):
        os.environ[name] = str(folder)
    os.environ["TRACKIO_DIR"] = str(folder / "trackio")
    tempfile.tempdir = str(folder)


def pytest_unconfigure(config):
    saved = getattr(config, "_saved_temporary_folders", None)
    if saved is None:
        return
    environment, tempfile.tempdir = saved
    for name, value in environment.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """Path of a tiny random Llama + BPE tokenizer with a chat template (built once per test session)."""
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny_model")))


@pytest.fixture(scope="session")
def tiny_tool_model_path(tmp_path_factory):
    """Path of the tiny tool-calling model: a random Qwen3 and a Qwen-format tokenizer with TRL's qwen3 chat template
    (tests/tiny_tools.py; built once per test session)."""
    from tests.tiny_tools import build_tiny_tool_model

    return build_tiny_tool_model(str(tmp_path_factory.mktemp("tiny_tool_model")))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture
def tiny_dataset():
    """8 chat prompts with an `answer` column (the built-in arithmetic task)."""
    from trl_credit.tasks.data import make_arithmetic_dataset

    return make_arithmetic_dataset(num_train=8, num_test=4, seed=0)["train"]
