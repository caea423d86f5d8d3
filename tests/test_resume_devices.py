"""A checkpoint loaded onto a GPU still resumes: its random-number states go back to the CPU first.

Found on the first GPU run (NVIDIA H200, torch 2.11): `load_checkpoint(path, map_location="cuda")` moves
every tensor of the file to the GPU, the saved CUDA generator states included, and
`torch.cuda.set_rng_state_all` accepts CPU byte tensors only ("RNG state must be a torch.ByteTensor").
The GPU tier checks the real thing (tests/test_gpu.py); this test checks on any machine that `train`
hands the states to PyTorch on the CPU, whatever device they were loaded onto.
"""

import torch

from transformer_course import training
from transformer_course.checkpoint import load_checkpoint
from transformer_course.config import TrainConfig
from transformer_course.model import GPT
from transformer_course.training import train


class LoadedElsewhere:
    """A generator state as `map_location` left it: on another device until `.cpu()` brings it back."""

    def __init__(self, state: torch.Tensor):
        self.state, self.brought_back = state, False

    def cpu(self) -> torch.Tensor:
        self.brought_back = True
        return self.state


def test_cuda_generator_states_are_set_from_the_cpu(tmp_path, monkeypatch):
    data = torch.randint(0, 65, (4_000,), generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(max_iters=2, batch_size=2, eval_interval=2, eval_iters=1, device="cpu", progress=False)
    path = tmp_path / "checkpoint.pt"
    train(GPT.from_preset("tiny", vocab_size=65), data, data, cfg, checkpoint_path=path)
    resumed = load_checkpoint(path)
    saved = [LoadedElsewhere(torch.get_rng_state()) for _ in range(2)]  # two GPUs' states
    resumed.rng["cuda"] = saved
    received, real_restore = [], training._restore

    def restore_as_if_on_a_gpu(*args):  # only here: the optimizer of a CUDA build asks is_available() too
        with monkeypatch.context() as gpu:
            gpu.setattr(torch.cuda, "is_available", lambda: True)
            gpu.setattr(torch.cuda, "set_rng_state_all", received.extend)
            real_restore(*args)

    monkeypatch.setattr(training, "_restore", restore_as_if_on_a_gpu)
    history = train(resumed.model, data, data, TrainConfig(**{**cfg.to_dict(), "max_iters": 3}), resume=resumed)
    assert len(history.step) == 3  # the two steps before the checkpoint, and one more
    assert all(s.brought_back for s in saved)
    assert len(received) == 2 and all(s.device.type == "cpu" and s.dtype == torch.uint8 for s in received)
