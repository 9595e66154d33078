"""Memory on the CPU (docs/design.md#memory-on-the-cpu): the two mechanisms that cut the README's SRPO job's peak
memory, each on the tiny model, and (slow) the job's own peak."""

import os
import platform
import subprocess
import sys

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

import trl_credit.trl_bridge.compat as trl_compat
from trl_credit import CueGRPOConfig, CueGRPOTrainer
from trl_credit.tasks.rewards import final_number_reward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
trl_utils = pytest.importorskip("trl.trainer.utils")
needs_cpu_fused_head = pytest.mark.skipif(
    getattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", None) is None or trl_compat._trl_use_triton is None,
    reason="TRL without a CPU fused log-prob head (trl<1.16)",
)


def _args(cls, tmp_path, **kw):
    return cls(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
               max_steps=1, report_to="none", use_cpu=True, bf16=False, **kw)


def _record_chunks(monkeypatch) -> list:
    chunks = []
    real = trl_utils._ChunkedLogProbFunction

    class Recording:  # TRL's fused head passes its vocabulary chunk as the 6th argument
        @staticmethod
        def apply(*args):
            chunks.append(args[5])
            return real.apply(*args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Recording)
    return chunks


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@needs_cpu_fused_head
def test_a_training_step_uses_small_vocab_tiles_where_grpo_uses_trls(tiny_model_path, tiny_dataset, tmp_path,
                                                                     monkeypatch):
    chunks = _record_chunks(monkeypatch)
    ours = CueGRPOTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=tiny_dataset,
                          args=_args(CueGRPOConfig, tmp_path / "ours", beta=0.04))
    ours.train()
    assert chunks and set(chunks) == {4096}  # old/ref log-prob passes and the loss (TRL's own: 32768)
    assert trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE == 32768  # restored after the step
    chunks.clear()
    grpo = GRPOTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=tiny_dataset,
                       args=_args(GRPOConfig, tmp_path / "grpo", beta=0.04))
    grpo.train()
    assert chunks and set(chunks) == {32768}  # a plain GRPOTrainer in the same process is left as it is


@needs_cpu_fused_head
def test_small_tiles_give_trls_log_probs_entropies_and_gradients(tiny_model_path, tiny_dataset, tmp_path,
                                                                 monkeypatch):
    trainer = GRPOTrainer(model=tiny_model_path, reward_funcs=final_number_reward, train_dataset=tiny_dataset,
                          args=_args(GRPOConfig, tmp_path))
    chunks = _record_chunks(monkeypatch)
    monkeypatch.setattr(trl_compat, "CPU_LOGPROB_VOCAB_CHUNK", 64)  # the 400-token vocabulary in 7 tiles
    model = trainer.model
    torch.manual_seed(0)
    input_ids = torch.randint(3, model.config.vocab_size, (4, 12))
    mask = torch.ones_like(input_ids)

    def run(small: bool):
        model.zero_grad()
        context = trl_compat.small_logprob_tiles(torch.device("cpu")) if small else torch.enable_grad()
        with context:
            logps, entropies, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, mask, 5,
                                                                            compute_entropy=True)
        (logps.sum() + entropies.sum()).backward()
        return logps.detach(), entropies.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    small, full = run(True), run(False)
    assert chunks == [64, 32768]
    torch.testing.assert_close(small[0], full[0])
    torch.testing.assert_close(small[1], full[1])
    assert len(small[2]) == len(full[2]) > 0
    for mine, theirs in zip(small[2], full[2]):
        torch.testing.assert_close(mine, theirs)
    # A Triton device keeps TRL's chunk.
    monkeypatch.setattr(trl_compat, "_trl_use_triton", lambda device: True)
    with trl_compat.small_logprob_tiles(torch.device("cpu")):
        assert trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE == 32768


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
@pytest.mark.skipif("MALLOC_MMAP_THRESHOLD_" in os.environ, reason="the user's own malloc setting is kept")
@pytest.mark.skipif(trl_compat.TRL_LOGPS_NEED_TRITON, reason="no trainer can be built with this TRL without Triton")
def test_cpu_trainer_returns_freed_buffers_to_the_os(tiny_model_path, tmp_path):
    # Each case in a fresh process: the setting is process-wide, and a block freed on the heap would be reused.
    probe = f"""
import torch
from datasets import Dataset
from tests.test_cpu_memory import _mapping_of, _rss
from trl_credit import CueGRPOConfig, CueGRPOTrainer
from trl_credit.tasks.rewards import final_number_reward
if BUILD:
    args = CueGRPOConfig(output_dir={str(tmp_path)!r}, per_device_train_batch_size=4, num_generations=4,
                         max_completion_length=6, report_to="none", use_cpu=True, bf16=False)
    CueGRPOTrainer(model={tiny_model_path!r}, reward_funcs=final_number_reward, args=args,
                   train_dataset=Dataset.from_dict({{"prompt": ["1+1="] * 4}}))
big = torch.ones(5 * 2**20)  # glibc raises its mmap threshold to the size of a freed mapping (20 MB here)
del big
block = torch.ones(4 * 2**20)  # 16 MB: below that threshold, so from the brk heap unless the setting is made
on_heap = _mapping_of(block.data_ptr()) == "[heap]"
before = _rss()
del block
print(on_heap, before - _rss())
"""
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}

    def run(build: bool) -> tuple[bool, int]:
        result = subprocess.run([sys.executable, "-c", f"BUILD = {build}\n" + probe], cwd=ROOT, env=env,
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-3000:]
        on_heap, returned = result.stdout.split()[-2:]
        return on_heap == "True", int(returned)

    on_heap, _ = run(build=False)
    assert on_heap, "glibc's default did not put the block on the heap: the test would show nothing"
    on_heap, returned = run(build=True)
    assert not on_heap, "a 16 MB buffer was allocated on the brk heap"
    assert returned >= 15 * 2**20, returned  # unmapped when freed


def _mapping_of(address: int) -> str:
    """The name of the /proc/self/maps region holding ``address`` ("" for an anonymous mapping)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high:
                return fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"address {address:#x} not mapped")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_main_job_peak_memory_under_2_5_gb(tmp_path):
    """The README's main job, as the README runs it on a fresh machine (the GGUF file converted in the job, into an
    empty cache), peaks under 2.5 GB of RSS (it peaked at 5.9-6.3 GB before)."""
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "2", "TRL_CREDIT_CACHE": str(tmp_path / "cache")}
    command = ["accelerate", "launch", "--config_file", "examples/accelerate_configs/cpu.yaml",
               "--num_cpu_threads_per_process", "2", "examples/train_srpo.py", "--output_dir", str(tmp_path / "out")]
    # A wrapper process whose children are only the job: its RUSAGE_CHILDREN peak is the job's largest process.
    wrapper = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", wrapper, *command], cwd=ROOT, env=env, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    peak_kb = int(result.stdout.strip().splitlines()[-1])
    assert peak_kb * 1024 < 2.5e9, f"peak RSS {peak_kb / 2**20:.2f} GiB"
    assert os.path.exists(tmp_path / "out" / "adapter_model.safetensors")
