import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# trackio reads its storage folder once, when imported (TRL imports it with GRPOTrainer): tests log to a temporary one,
# never to the user's ~/.cache/huggingface/trackio.
os.environ["TRACKIO_DIR"] = tempfile.mkdtemp(prefix="trl_credit_trackio_")
atexit.register(shutil.rmtree, os.environ["TRACKIO_DIR"], ignore_errors=True)

from tests.tiny import build_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """Path of a tiny random Llama + BPE tokenizer with a chat template (built once per test session)."""
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny_model")))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture
def tiny_dataset():
    """8 chat prompts with an `answer` column (the built-in arithmetic task)."""
    from trl_credit.tasks.data import make_arithmetic_dataset

    return make_arithmetic_dataset(num_train=8, num_test=4, seed=0)["train"]
