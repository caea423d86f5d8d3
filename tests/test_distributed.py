"""Data-parallel training (issue 25): `transformer_course.parallel` (appendix 90) under torchrun.

Two CPU processes (gloo) on this machine must give the same losses as one process with gradient
accumulation over the same batches; checkpoints come from rank 0 and resume exactly with the same
number of processes and correctly with another; a failing or killed rank ends the job (or, with
`--max-restarts`, the job resumes from its checkpoint); bad input gets a message that names the fix.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fault_injection.course_faults import FAULT_ENV, environment

from transformer_course import cli, parallel
from transformer_course.checkpoint import load_checkpoint, save_checkpoint
from transformer_course.model import GPT
from transformer_course.parallel import World
from transformer_course.training import accumulated_step, estimate_loss, train, train_step

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]  # a free port each
# unbuffered: what a rank printed reaches the pipe even when torchrun ends that rank
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

sys.path.insert(0, str(Path(__file__).parent))
import ddp_worker  # noqa: E402  (the same runs, in this one process)


def _close(a, b, tol=1e-5):
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------ one process: the identity world
def test_a_world_of_one_changes_nothing():
    world, model = World(), torch.nn.Linear(2, 2)
    assert world.is_main and world.wrap(model) is model
    x = torch.arange(6).reshape(3, 2)
    assert world.shard(x)[0] is x
    assert world.mean(2.5) == 2.5 and world.sum(2.5) == 2.5 and world.any(True) and not world.any(False)
    assert world.gather("state") == ["state"]
    assert parallel.current_world() == World()  # no process group in the test process


def test_shard_takes_this_ranks_rows_and_refuses_an_uneven_batch():
    x = torch.arange(8)
    assert World(rank=1, size=2).shard(x)[0].tolist() == [4, 5, 6, 7]
    assert [World(rank=r, size=4).shard(x)[0].tolist() for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ValueError, match="9 rows does not split over 2 processes"):
        World(rank=0, size=2).shard(torch.arange(9))


def test_accumulated_step_is_one_big_step():
    big, small = ddp_worker.model(0.0), ddp_worker.model(0.0)
    x = torch.randint(65, (8, 32), generator=torch.Generator().manual_seed(0))
    y = torch.randint(65, (8, 32), generator=torch.Generator().manual_seed(1))
    one = train_step(big, torch.optim.SGD(big.parameters(), lr=0.5), x, y, grad_clip=0.5)  # SGD: shows every gradient
    four = accumulated_step(small, torch.optim.SGD(small.parameters(), lr=0.5), x, y, 4, grad_clip=0.5)
    assert abs(one - four) < 1e-5
    for a, b in zip(big.parameters(), small.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="8 rows does not split into 3 equal micro-batches"):
        accumulated_step(small, torch.optim.SGD(small.parameters(), lr=0.1), x, y, 3)


def test_evaluation_shards_add_up_to_the_mean():
    net = ddp_worker.model(0.0)
    whole = estimate_loss(net, ddp_worker.VAL, 32, 4, 5, seed=3)
    shares = [estimate_loss(net, ddp_worker.VAL, 32, 4, 5, seed=3, shard=(r, 2)) for r in range(2)]
    assert abs(sum(shares) - whole) < 1e-6


def test_in_one_process_parallel_train_is_chapter_06s_train(tmp_path):
    """Outside torchrun the `train` command runs `parallel.train`, a job of one: it must draw the same
    random numbers as chapter 06's `training.train`, with dropout on and across a resume."""
    settings = dict(eval_interval=2, eval_iters=2)
    runs = []
    for loop in (train, parallel.train):
        path = tmp_path / f"{loop.__module__}.pt"
        loop(ddp_worker.model(0.1), ddp_worker.TRAIN, ddp_worker.VAL, ddp_worker.config(max_iters=2, **settings),
             checkpoint_path=path)
        net = ddp_worker.model(0.1)
        runs.append(loop(net, ddp_worker.TRAIN, ddp_worker.VAL, ddp_worker.config(max_iters=4, **settings),
                         resume=load_checkpoint(path, net)).to_dict())
    assert "ranks" not in torch.load(tmp_path / "transformer_course.parallel.pt", weights_only=True)["rng"]
    for key in ("tokens_per_step", "step", "loss", "lr", "eval_step", "train_loss", "val_loss"):
        assert runs[0][key] == runs[1][key], key


def test_nproc_per_node_larger_than_the_machine_is_refused(monkeypatch):
    cores = parallel.usable_cpus()
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores + 1))
    with pytest.raises(ValueError,
                       match=rf"--nproc-per-node {cores + 1} .* has {cores}; use --nproc-per-node {cores} or fewer"):
        parallel.start_from_environment("cpu")
    if not torch.cuda.is_available():
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        with pytest.raises(ValueError, match="not on 'mps'"):
            parallel.start_from_environment("mps")
        with pytest.raises(ValueError, match="no CUDA GPU .* pass --device cpu .* gloo"):
            parallel.start_from_environment("cuda")


def test_some_of_torchruns_variables_without_torchrun_are_refused_naming_them(monkeypatch):
    for name in parallel.TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert parallel.launched_by_torchrun() is False  # none: a job of one
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match=r"RANK, WORLD_SIZE set but LOCAL_RANK, .*TORCHELASTIC_RUN_ID not: this "
                                         r"process was not started by torchrun; .*\(unset RANK WORLD_SIZE\)"):
        parallel.launched_by_torchrun()
    for name in parallel.TORCHRUN_VARIABLES:  # all of them, as torchrun sets them
        monkeypatch.setenv(name, "1")
    assert parallel.launched_by_torchrun() is True


@pytest.mark.system
def test_the_train_command_with_a_leftover_world_size_stops_at_once_with_one_line(tmp_path):
    """WORLD_SIZE=2 left in a shell used to make `train` wait ten minutes for a peer that never came."""
    env = {k: v for k, v in ENV.items() if k not in parallel.TORCHRUN_VARIABLES}
    env |= {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29599"}
    done = subprocess.run([sys.executable, "-m", "transformer_course", "train", "--preset", "tiny", "--max-iters",
                           "1", "--out", str(tmp_path / "run")], env=env, capture_output=True, text=True,
                          timeout=300)  # a hang guard only: the refusal comes before any process group
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        "transformer-course train (rank 0): error: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, "
        "MASTER_PORT set but TORCHELASTIC_RUN_ID not")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ two processes under torchrun
def _end(job: subprocess.Popen) -> None:
    """Kill a torchrun job that is still running, its workers first (killing torchrun alone orphans them)."""
    if job.poll() is None:
        subprocess.run(["pkill", "-KILL", "-P", str(job.pid)], check=False)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)


def _job(command: list[str], timeout: float = 300, env: dict | None = None) -> tuple[int, str, str]:
    """Run a torchrun job (`env`: variables added to ENV); on timeout end it with all its workers (a hung
    job fails the test, not CI)."""
    job = subprocess.Popen(command, cwd=ROOT, env={**ENV, **(env or {})}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end(job)
        stdout, stderr = job.communicate()
        pytest.fail(f"the job hung for {timeout} s: {stderr[-2000:]}")
    return job.returncode, stdout, stderr


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    returncode, _, stderr = _job([*TORCHRUN, str(Path(__file__).parent / "ddp_worker.py"), str(out)])
    assert returncode == 0, stderr[-3000:]
    return out


def _history(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.system
def test_two_processes_equal_one_process_with_gradient_accumulation(two_process_runs):
    two = _history(two_process_runs / "fixed.json")
    one = train(ddp_worker.model(0.0), ddp_worker.TRAIN, ddp_worker.VAL, ddp_worker.config(grad_accum=2)).to_dict()
    assert two["tokens_per_step"] == one["tokens_per_step"] == 8 * 32
    assert two["step"] == one["step"] and two["eval_step"] == one["eval_step"] == [0, 4, 8]
    for key in ("loss", "lr", "train_loss", "val_loss"):
        assert _close(two[key], one[key]), (key, two[key], one[key])
    assert one["loss"][0] != one["loss"][-1]  # it trained


@pytest.mark.system
def test_a_resumed_run_with_the_same_world_size_is_exact(two_process_runs):
    straight, resumed = (_history(two_process_runs / name) for name in ("straight.json", "resumed.json"))
    for key in ("step", "loss", "lr", "eval_step", "train_loss", "val_loss"):
        assert straight[key] == resumed[key], key  # dropout 0.1: each rank's random state is in the checkpoint
    saved = torch.load(two_process_runs / "part.pt", weights_only=True)
    assert len(saved["rng"]["ranks"]) == 2 and not torch.equal(*saved["rng"]["ranks"])


@pytest.mark.system
def test_a_run_resumes_with_another_world_size(two_process_runs):
    """Two processes to step 6, then one process with gradient accumulation (the same global batch) to
    step 8: step, optimizer state, schedule and batch stream continue, so the losses equal the
    uninterrupted two-process run's."""
    half = load_checkpoint(two_process_runs / "half.pt", ddp_worker.model(0.0))
    assert half.step == 6 and half.optimizer_state["state"][0]["step"].item() == 6
    net = ddp_worker.model(0.0)
    resumed = train(net, ddp_worker.TRAIN, ddp_worker.VAL, ddp_worker.config(grad_accum=2),
                    resume=load_checkpoint(two_process_runs / "half.pt", net)).to_dict()
    fixed = _history(two_process_runs / "fixed.json")
    assert resumed["step"] == fixed["step"]
    for key in ("loss", "lr"):
        assert _close(resumed[key], fixed[key]), key
    assert _close(resumed["val_loss"][-1:], fixed["val_loss"][-1:])


@pytest.mark.system
def test_a_time_limit_stops_every_rank_at_the_same_step(two_process_runs):
    timed = _history(two_process_runs / "timed.json")  # the job ended: no rank waited for a step the other skipped
    assert 0 < len(timed["step"]) < 100_000 and timed["eval_step"][-1] == len(timed["step"])


def _cli_train(out: Path, *extra: str) -> list[str]:
    return ["-m", "transformer_course", "train", "--preset", "tiny", "--out", str(out), "--device", "cpu", *extra]


@pytest.mark.system
def test_a_failing_rank_ends_the_job_and_its_error_is_shown(tmp_path):
    """Rank 1 raises in its third step while rank 0 waits there (TRANSFORMER_COURSE_FAULT, see
    tests/fault_injection): the job ends (`_job` fails the test if it hangs), torchrun names rank 1,
    whose error is shown, and rank 0 never got past that step."""
    fault = "raise:step=3:rank=1:others=wait"
    returncode, _, stderr = _job([*TORCHRUN, *_cli_train(tmp_path / "run", "--max-iters", "50", "--eval-iters", "2")],
                                 env=environment(fault, ENV))
    assert returncode != 0
    assert f"transformer-course train (rank 1): error: fault injected by {FAULT_ENV}={fault}" in stderr, stderr[-3000:]
    assert re.search(r"failed \(exitcode: 2\) local_rank: 1 ", stderr), stderr[-3000:]  # the first failure seen
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt").step == 0  # the step-0 checkpoint, no later one
    assert not (tmp_path / "run" / "history.json").exists()  # rank 0 did not finish either


def killed_rank_run(out: Path, steps: int = 10, interval: int = 5) -> None:
    """Rank 1 of a 2-process run kills itself (SIGKILL) right after the second checkpoint (step
    `interval`) is on disk, in torchrun's first round only, while rank 0 waits at the same point; with
    `--max-restarts` torchrun restarts both ranks, which resume from exactly that checkpoint and end where
    an uninterrupted run ends. The kill is counted in evaluations, not timed, so a faster or slower
    machine changes nothing. (Before the store got a prefix per restart round, a restarted rank on a
    loaded machine could read the address a dead rank had published and fail to connect; this test
    caught it twice under `make test`.)"""
    assert steps > interval
    returncode, stdout, stderr = _job([*TORCHRUN, "--max-restarts", "3", *_cli_train(
        out, "--max-iters", str(steps), "--eval-interval", str(interval), "--eval-iters", "2")],
        env=environment("kill:after_checkpoint=2:rank=1:round=0:others=wait", ENV))
    assert returncode == 0, stderr[-3000:]
    assert re.search(r"failed \(exitcode: -9\) local_rank: 1 ", stderr), stderr[-3000:]  # torchrun saw the kill
    assert re.findall(r"resuming from step (\d+)", stdout) == [str(interval)], stdout  # once, from that checkpoint
    assert load_checkpoint(out / "checkpoint.pt").step == steps
    history = _history(out / "history.json")
    assert history["eval_step"] == list(range(0, steps, interval)) + [steps]
    assert history["step"] == list(range(steps))  # every step once: the killed round's lost steps were redone
    assert stdout.count("training 'tiny'") == 2  # rank 0 alone prints, once per round


@pytest.mark.system
def test_a_killed_rank_is_restarted_from_the_last_checkpoint(tmp_path):
    killed_rank_run(tmp_path / "run")


def test_global_batch_that_does_not_split_is_refused(tmp_path, capsys):
    assert cli.main(_cli_train(tmp_path / "run", "--global-batch", "30")[2:]) == 2
    assert ("--global-batch 30 does not split over 1 process(es) of batch 12: choose a multiple of 12"
            in capsys.readouterr().err)


def test_a_checkpoint_of_another_model_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    save_checkpoint(out / "checkpoint.pt", GPT.from_preset("tiny"))  # what `train --preset tiny` writes first
    assert cli.main(["train", "--preset", "small", "--out", str(out), "--device", "cpu", "--max-iters", "1"]) == 2
    err = capsys.readouterr().err
    assert "does not match" in err and f"--out {out} holds another run" in err
