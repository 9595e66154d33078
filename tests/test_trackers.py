"""The experiment trackers users already pass to ``report_to`` (wandb offline, trackio local): one real SRPO step on
the tiny model logs TRL's metrics, the method's metrics and the credit HTML (``log_credit_rows``), read back here from
each tracker's own run files, with no network access."""

import glob
import ipaddress
import json
import os
import socket

import pytest

import trl_credit
from tests.trainers.test_all_trainers import CASES, parity_reward, short_reward

RUN_NAME = "credit-test"


@pytest.fixture
def no_network(monkeypatch):
    """Any connection from this process to a non-loopback address fails the test (local sockets stay allowed: the
    wandb service runs on this machine)."""
    real_connect = socket.socket.connect

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
                raise AssertionError(f"network access to {address}")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


def _train_one_step(tiny_model_path, tiny_dataset, tmp_path, report_to, **extra):
    _, _, settings, _ = CASES["srpo"]

    class Recorded(trl_credit.SRPOTrainer):  # keeps the page the credit hook rendered
        def _log_credit(self, output, block_ids=None):
            page = super()._log_credit(output, block_ids)
            if page is not None:
                self.pages = getattr(self, "pages", []) + [page]
            return page

    args = trl_credit.SRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_completion_length=8, max_steps=1,
        logging_steps=1, report_to=report_to, run_name=RUN_NAME, save_strategy="no", use_cpu=True, bf16=False,
        seed=0, log_credit_rows=2, **settings, **extra)
    trainer = Recorded(model=tiny_model_path, reward_funcs=[parity_reward, short_reward], args=args,
                       train_dataset=tiny_dataset)
    trainer.train()
    assert len(trainer.pages) == 1
    return trainer, trainer.state.log_history[0]


def _check_step(row: dict, logged: dict):
    """``row``: the tracker's step-1 metrics row (keys as the Trainer's callbacks write them, ``train/<metric>``)."""
    assert row["train/reward"] == pytest.approx(logged["reward"])
    srpo = sorted(key for key in logged if key.startswith("srpo/"))
    assert srpo, "the step logged no srpo/ metric"
    for key in srpo:
        assert row[f"train/{key}"] == pytest.approx(logged[key]), key


def _wandb_records(path: str) -> list:
    """The records of a ``.wandb`` run file: a LevelDB-style log (32 KiB blocks of chunks with a 7-byte header:
    CRC32, length, type FULL/FIRST/MIDDLE/LAST) after a 7-byte ``:W&B`` file header, each record a protobuf
    ``Record``. wandb >= 0.2x has no Python reader of its own (the Go service writes and syncs these files)."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:7]
    block, header = 32768, 7
    position, payloads, pending = header, [], b""
    while position + header <= len(data):
        if block - position % block < header:  # the rest of a block too short for a chunk header is padding
            position += block - position % block
            continue
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        chunk = data[position + header : position + header + length]
        position += header + length
        if kind == 1:
            payloads.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            payloads.append(pending + chunk)
    return [wandb_internal_pb2.Record.FromString(payload) for payload in payloads]


def test_wandb_offline_run_holds_metrics_and_credit(tiny_model_path, tiny_dataset, tmp_path, monkeypatch, no_network):
    wandb = pytest.importorskip("wandb")
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    try:
        trainer, logged = _train_one_step(tiny_model_path, tiny_dataset, tmp_path, ["wandb"])
        wandb.finish()
    finally:
        wandb.teardown()
    (run_file,) = glob.glob(str(tmp_path / "wandb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    rows = []
    for record in _wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            rows.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                         for item in record.history.item})
    (metrics,) = [row for row in rows if "train/reward" in row]
    assert metrics["train/global_step"] == 1
    _check_step(metrics, logged)
    # The credit page, on the step whose rollouts it shows (wandb plots against train/global_step).
    (credit,) = [row for row in rows if "credit/_type" in row]
    assert credit["credit/_type"] == "html-file"
    assert credit["train/global_step"] == 1
    with open(os.path.join(os.path.dirname(run_file), "files", credit["credit/path"]), encoding="utf-8") as f:
        assert trainer.pages[0] in f.read()


def test_trackio_local_run_holds_metrics_and_credit(tiny_model_path, tiny_dataset, tmp_path, no_network):
    pytest.importorskip("trackio")
    from trackio.sqlite_storage import SQLiteStorage
    from trackio.utils import MEDIA_DIR, TRACKIO_DIR

    # conftest points TRACKIO_DIR at a temporary folder before anything imports trackio (it reads it at import)
    assert str(TRACKIO_DIR) == os.environ["TRACKIO_DIR"]
    project = f"trl-credit-test-{os.getpid()}-{tmp_path.name}"
    trainer, logged = _train_one_step(tiny_model_path, tiny_dataset, tmp_path, ["trackio"], project=project)
    rows = SQLiteStorage.get_logs(project, run=RUN_NAME)
    (metrics,) = [row for row in rows if "train/reward" in row]
    assert metrics["train/global_step"] == 1
    _check_step(metrics, logged)
    (credit,) = [row for row in rows if "credit" in row]
    assert credit["credit"]["_type"] == "trackio.html"
    assert credit["train/global_step"] == 1
    with open(os.path.join(MEDIA_DIR, credit["credit"]["file_path"]), encoding="utf-8") as f:
        assert trainer.pages[0] in f.read()
