"""Every user mistake: one line naming the key or file, exit code 2, no traceback, nothing
written. Most cases are checked in this process; a few run the real CLI as a user would."""

from __future__ import annotations

import socket
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from hogwild.files import RunDirLock
from tests.conftest import clean_env, compose_cfg, free_port, run_cli

Setup = Callable[[Path], tuple[list[str], dict[str, str]]]


def _args(*a: str) -> Setup:
    return lambda d: (list(a), {})


def _npz(**arrays: np.ndarray) -> Setup:
    def setup(d: Path) -> tuple[list[str], dict[str, str]]:
        np.savez(d / "d.npz", **arrays)
        return ["data=npz", f"data.path={d / 'd.npz'}"], {}
    return setup


def _empty_npz(d: Path) -> tuple[list[str], dict[str, str]]:
    (d / "empty.npz").write_bytes(b"")
    return ["data=npz", f"data.path={d / 'empty.npz'}"], {}


def _foreign_checkpoint(d: Path) -> tuple[list[str], dict[str, str]]:
    torch.save({"format": 1, "model": "convnet", "shapes": [[3, 3]], "flat": torch.zeros(9)}, d / "c.pt")
    return [f"resume={d / 'c.pt'}"], {}


def _corrupt_checkpoint(d: Path) -> tuple[list[str], dict[str, str]]:
    (d / "c.pt").write_bytes(b"not a checkpoint")
    return [f"resume={d / 'c.pt'}"], {}


def _unwritable_run_dir(d: Path) -> tuple[list[str], dict[str, str]]:
    (d / "afile").write_text("x")
    return [f"run_dir={d / 'afile' / 'run'}"], {}


_HELD: list[socket.socket] = []
_LOCKS: list[RunDirLock] = []


def _checkpoint_with(**fields: object) -> Setup:
    def setup(d: Path) -> tuple[list[str], dict[str, str]]:
        ckpt = {"format": 1, "model": "mlp", "shapes": [[64, 64], [64]], "flat": torch.zeros(64 * 64 + 64)}
        torch.save({**ckpt, **fields}, d / "c.pt")
        return [f"resume={d / 'c.pt'}"], {}
    return setup


def _live_run_dir(d: Path) -> tuple[list[str], dict[str, str]]:
    lock = RunDirLock(d / "run")  # a second open file holds its own flock, even in one process
    lock.acquire()
    _LOCKS.append(lock)
    return [], {}


def _env(**env: str) -> Setup:
    return lambda d: ([], env)


X = np.random.rand(20, 4).astype(np.float32)
Y = np.arange(20) % 2

# Mistakes caught before any process starts: composing the config, loading the data,
# building the model or reading the checkpoint. Checked in this process (fast tier).
IN_PROCESS: list[tuple[str, Setup, str]] = [
    ("workers zero", _args("workers=0"), "workers"),
    ("workers not a number", _args("workers=many"), "workers"),
    ("negative lr", _args("optim.lr=-0.1"), "optim.lr"),
    ("lr wrong type", _args("optim.lr=fast"), "optim.lr"),
    ("momentum out of range", _args("optim.momentum=1.5"), "optim.momentum"),
    ("batch size zero", _args("train.batch_size=0"), "train.batch_size"),
    ("epochs wrong type", _args("train.epochs=abc"), "train.epochs"),
    ("bool wrong type", _args("data.download=maybe"), "data.download"),
    ("test fraction out of range", _args("data.test_fraction=1.5"), "data.test_fraction"),
    ("eval interval zero", _args("eval.every_s=0"), "eval.every_s"),
    ("checkpoint keep zero", _args("checkpoint.keep=0"), "checkpoint.keep"),
    ("unknown model", _args("model=resnet"), "model"),
    ("unknown data", _args("data=imagenet"), "data"),
    ("unknown optim", _args("optim=lbfgs"), "optim"),
    ("misspelled key", _args("trian.epochs=3"), "trian"),
    ("sync interval zero", _args("sync.interval=0"), "sync.interval"),
    ("negative max lag", _args("sync.max_lag=-1"), "sync.max_lag"),
    ("unknown sync mode", _args("sync.mode=gossip"), "sync.mode"),
    ("unknown wire type", _args("sync.dtype=int4"), "sync.dtype"),
    ("zero fragments", _args("sync.fragments=0"), "sync.fragments"),
    ("more fragments than the model has values", _args("sync.fragments=100000"), "sync.fragments"),
    ("row-sparse rounds for a model without a sparse table", _args("sync.row_sparse=true"), "sync.row_sparse"),
    ("row-sparse rounds under an optimizer that moves every row",
     _args("model=sparse_linear", "data=sparse_synthetic", "data.num_samples=500", "data.num_features=1000",
           "sync.row_sparse=true",
           "optim.name=adam"), "sync.row_sparse"),
    ("row-sparse rounds under weight decay",
     _args("model=sparse_linear", "data=sparse_synthetic", "data.num_samples=500", "data.num_features=1000",
           "sync.row_sparse=true",
           "optim.name=adagrad", "optim.weight_decay=0.01"), "sync.row_sparse"),
    ("row-wise state for a model without a table", _args("optim=adagrad", "optim.rowwise=true"), "optim.rowwise"),
    ("row-wise state for SGD", _args("optim=sgd", "optim.rowwise=true"), "optim.rowwise"),
    ("row-sparse rounds under a torch optimizer with momentum",
     _args("model=sparse_linear", "data=sparse_synthetic", "data.num_samples=500", "data.num_features=1000",
           "sync.row_sparse=true",
           "optim._target_=torch.optim.SGD", "optim.momentum=0.9"), "sync.row_sparse"),
    ("row-sparse rounds in fragments", _args("sync.row_sparse=true", "sync.fragments=2"), "sync.fragments"),
    ("weighting by steps under a rule that takes no weights", _args("sync.mode=broadcast", "sync.weighting=steps"),
     "sync.weighting"),
    ("coordinator without port", _args("elastic.coordinator=node0", "elastic.replicas=2", "elastic.slot=0"),
     "elastic.coordinator"),
    ("elastic without a slot", _args("elastic.coordinator=node0:29400", "elastic.replicas=2"), "elastic.slot"),
    ("elastic slot out of range", _args("elastic.coordinator=node0:29400", "elastic.replicas=2", "elastic.slot=2"),
     "elastic.slot"),
    ("elastic with one slot", _args("elastic.coordinator=node0:29400", "elastic.slot=0"), "elastic.replicas"),
    ("quorum above the slots",
     _args("elastic.coordinator=h:1", "elastic.replicas=2", "elastic.slot=0", "elastic.min_replicas=3"),
     "elastic.min_replicas"),
    ("nccl without cuda", _args("sync.backend=nccl"), "sync.backend"),
    ("cuda without gpu", _args("device=cuda"), "device"),
    ("model/data mismatch", _args("model=sparse_linear"), "model"),
    ("npz path missing", _args("data=npz"), "data.path"),
    ("npz file missing", _args("data=npz", "data.path=/nonexistent/x.npz"), "data.path"),
    ("npz empty file", _empty_npz, "data.path"),
    ("npz lacks y", _npz(X=X), "data.path"),
    ("npz X/y length mismatch", _npz(X=X, y=Y[:10]), "data.path"),
    ("npz NaN in X", _npz(X=np.where(X > 0.5, np.nan, X), y=Y), "data.path"),
    ("npz float labels", _npz(X=X, y=Y + 0.5), "data.path"),
    ("mnist files missing", _args("data=mnist", "data.root=/nonexistent/mnist"), "data.root"),
    ("checkpoint of another model", _foreign_checkpoint, "checkpoint"),
    ("corrupt checkpoint", _corrupt_checkpoint, "checkpoint"),
    ("resume=true without checkpoint", _args("resume=true"), "resume"),
    ("run dir not writable", _unwritable_run_dir, "run_dir"),
    ("bad value in the second job of a sweep", _args("-m", "optim.lr=0.1,-1"), "optim.lr"),
    ("unknown option in the second job of a sweep", _args("-m", "model=mlp,resnet"), "model"),
    ("+key adding a misspelled key", _args("+train.epoch=1"), "train.epoch"),
    ("+key adding an unknown top-level key", _args("+fast=true"), "fast"),
    ("checkpoint flat tensor of the wrong size", _checkpoint_with(flat=torch.zeros(10)), "checkpoint"),
    ("checkpoint shapes that are not shapes", _checkpoint_with(shapes="64x64"), "checkpoint"),
    ("checkpoint counters that are not a record", _checkpoint_with(counters=[1]), "checkpoint"),
    ("checkpoint flat that is not a tensor", _checkpoint_with(flat=[0.0] * 4160), "checkpoint"),
    ("a second job on a live run_dir", _live_run_dir, "run_dir"),
    ("workers that cannot fit in memory", _args("workers=100000"), "workers"),
    ("zero start-up timeout", _args("fault.startup_timeout_s=0"), "fault.startup_timeout_s"),
    ("WORLD_SIZE not a number", _env(WORLD_SIZE="two"), "environment variable WORLD_SIZE"),
    ("RANK outside WORLD_SIZE", _env(RANK="3", WORLD_SIZE="2"), "environment variable RANK"),
    ("MASTER_PORT not a number", _env(MASTER_PORT="http"), "environment variable MASTER_PORT"),
    ("MASTER_PORT past 65535", _env(MASTER_PORT="99999"), "environment variable MASTER_PORT"),
    ("LOCAL_WORLD_SIZE of zero", _env(LOCAL_WORLD_SIZE="0"), "environment variable LOCAL_WORLD_SIZE"),
    ("seed past what torch accepts", _args("train.seed=1180591620717411303424"), "train.seed"),
    ("model _target_ that does not import", _args("model._target_=nowhere.Net"), "model._target_"),
    ("model _target_ attribute missing", _args("model._target_=tests.user_models.Nope"), "model._target_"),
    ("model factory that raises", _args("model._target_=tests.user_models.broken"), "model._target_"),
    ("model factory that calls sys.exit(0)", _args("model._target_=tests.user_models.exits"), "model._target_"),
    ("a bare ~ in an override (Hydra's grammar)", _args("data.root=~/data"), "data.root"),
    ("model factory returning no module", _args("model._target_=tests.user_models.not_a_module"), "model._target_"),
    ("model argument the factory does not take", _args("model._target_=torchvision.models.resnet18",
                                                       "+model.depth=3"), "model.depth"),
    ("float64 model", _args("model._target_=tests.user_models.Doubles"), "model"),
    ("a forward pass that calls sys.exit(0)", _args("model._target_=tests.user_models.ExitsInForward"), "model"),
    ("a scheduler that needs a metric", _args("sched._target_=torch.optim.lr_scheduler.ReduceLROnPlateau"),
     "sched._target_"),
    ("a scheduler shorter than the run", _args("sched._target_=torch.optim.lr_scheduler.OneCycleLR",
                                               "+sched.max_lr=0.1", "+sched.total_steps=10"), "sched._target_"),
    ("a scheduler that divides by zero", _args("sched._target_=torch.optim.lr_scheduler.CosineAnnealingLR",
                                               "+sched.T_max=0"), "sched._target_"),
    ("an optimizer that needs a closure", _args("optim._target_=torch.optim.LBFGS"), "optim._target_"),
    ("a dataset whose item 20 raises", _args("data._target_=tests.user_models.bad_items",
                                              "+data.how='item 20 raises'"), "data._target_"),
    # Item 10 is none of the three the checks read: the leader meets it reading every label.
    ("a dataset whose item 10 raises where only its label is read", _args("data._target_=tests.user_models.bad_items",
                                                                         "+data.how='item 10 raises'"), "data"),
    ("a dataset whose items vary in shape", _args("data._target_=tests.user_models.bad_items",
                                                  "+data.how='shapes vary'"), "data._target_"),
    ("a dataset of negative length", _args("data._target_=tests.user_models.bad_items",
                                           "+data.how='negative length'"), "data._target_"),
    ("a dataset that cannot be pickled", _args("data._target_=tests.user_models.bad_items",
                                               "+data.how=unpicklable"), "data._target_"),
    ("a model on the meta device", _args("model._target_=tests.user_models.MetaNet"), "model"),
    ("a built-in model too large to allocate", _args("model.hidden=100000000000"), "model"),
    ("a language model task on one label per sample", _args("task=language_model"), "task"),
    ("an optimizer that needs sparse gradients", _args("optim._target_=torch.optim.SparseAdam"), "optim._target_"),
    ("a loss that raises KeyboardInterrupt", _args("loss._target_=tests.user_models.interrupting_loss"), "loss"),
    ("dataset items that call sys.exit", _args("data._target_=tests.user_models.exiting_items"), "data"),
    ("+model key without a _target_", _args("+model.width=3"), "model.width"),
    ("digits with 2 channels", _args("data.channels=2"), "data.channels"),
    ("data _target_ that does not import", _args("data._target_=nowhere.load"), "data._target_"),
    ("a stream without max_steps or max_time", _args("data._target_=tests.stream_helpers.numbered",
                                                     "model._target_=tests.stream_helpers.Net"), "train.max_steps"),
    ("a stream shorter than one batch per worker",
     _args("data._target_=tests.stream_helpers.numbered", "+data.n=40", "model._target_=tests.stream_helpers.Net",
           "workers=2", "train.batch_size=32", "train.max_steps=10"), "data"),
    ("DataLoader processes under a stream",
     _args("data._target_=tests.stream_helpers.numbered", "model._target_=tests.stream_helpers.Net",
           "data.loader_workers=2", "train.max_steps=10"), "data.loader_workers"),
    ("a DatasetDict where a split was meant", _args("data._target_=tests.stream_helpers.dataset_dict"),
     "data._target_"),
    ("one dataset as train and test", _args("data._target_=tests.stream_helpers.same_twice"), "data._target_"),
    ("a + on a schema field of data", _args("data._target_=tests.stream_helpers.by_path", "+data.path=x"),
     "data.path"),
    ("a changed schema field the data factory does not take",
     _args("data._target_=tests.stream_helpers.numbered", "data.root=elsewhere"), "data.root"),
    ("data factory returning no pair", _args("data._target_=tests.user_models.no_pair"), "data._target_"),
    ("data items of the wrong structure", _args("data._target_=tests.user_models.wrong_items"), "data._target_"),
    # Float labels are a regression (task=auto); declared a classification, they are refused.
    ("float labels for task=classification", _args("data._target_=tests.user_models.float_labels",
                                                   "task=classification"), "task"),
    ("integer labels for task=regression", _args("task=regression"), "task"),
    ("train.target on a metric the task does not report", _args("train.target.metric=r2",
                                                                "train.target.value=0.5"), "train.target.metric"),
    ("train.target without its value", _args("train.target.metric=accuracy"), "train.target"),
    ("loss _target_ that does not import", _args("loss._target_=nowhere.loss"), "loss._target_"),
    ("loss returning a non-scalar", _args("loss._target_=tests.user_models.per_sample_loss"), "loss._target_"),
    ("loss that does not fit the output", _args("loss._target_=torch.nn.functional.mse_loss"), "loss"),
    ("loss argument the loss class does not take", _args("loss._target_=torch.nn.CrossEntropyLoss",
                                                         "+loss.beta=2"), "loss.beta"),
    ("optim _target_ that is not an optimizer", _args("optim._target_=torch.nn.Linear"), "optim._target_"),
    ("optim argument the optimizer does not take", _args("optim._target_=torch.optim.SGD", "+optim.alpha=0.9"),
     "optim.alpha"),
    ("sched _target_ that does not import", _args("sched._target_=nowhere.Sched"), "sched._target_"),
    ("sched _target_ missing its arguments", _args("sched._target_=torch.optim.lr_scheduler.StepLR"),
     "sched._target_"),
    ("unknown schedule", _args("sched.name=linear"), "sched.name"),
    ("unknown precision", _args("train.precision=fp8"), "train.precision"),
    ("negative clipping norm", _args("optim.clip_grad_norm=-1"), "optim.clip_grad_norm"),
    ("no batches to accumulate", _args("train.accumulate=0"), "train.accumulate"),
    ("accumulating a fraction of a batch", _args("train.accumulate=1.5"), "train.accumulate"),
    ("unknown update path", _args("optim.update=async"), "optim.update"),
    ("a negative bound on waiting", _args("pace.max_wait=-1"), "pace.max_wait"),
    ("a least wait over the most", _args("pace.min_wait=3", "pace.max_wait=2"), "pace.min_wait"),
    ("balance that is not a boolean", _args("pace.balance=maybe"), "pace.balance"),
    ("no chunks", _args("pace.chunks=0"), "pace.chunks"),
    ("too many chunks", _args("pace.chunks=17"), "pace.chunks"),
    ("chunks that are not a number", _args("pace.chunks=half"), "pace.chunks"),
    ("a bad value under a key that moved", _args("optim.chunks=0"), "pace.chunks"),
    ("unknown pacing policy", _args("pace.policy=fastest"), "pace.policy"),
    ("no backup workers", _args("pace.policy=backup", "pace.backup=0"), "pace.backup"),
    ("per-worker state at the barrier", _args("optim=adamw", "optim.update=barrier", "optim.state=worker"),
     "optim.state"),
    ("per-worker state where auto takes the barrier", _args("optim=adamw", "optim.state=worker"), "optim.state"),
    ("the barrier with an optimizer that needs sparse gradients",
     _args("optim._target_=torch.optim.SparseAdam", "optim.update=barrier"), "optim.update"),
    ("the barrier with an optimizer that replaces its state",
     _args("optim._target_=tests.user_models.RebindingMomentum"),
     "optim._target_"),
    ("data argument the factory does not take", _args("data._target_=tests.user_models.no_pair",
                                                      "+data.depth=1"), "data.depth"),
    ("image_folder root without train/ and val/", _args("data=image_folder", "data.root=/nonexistent"), "data.root"),
]


def _with_run_dir(args: list[str], d: Path) -> list[str]:
    return args if "run_dir=" in " ".join(args) else [*args, f"run_dir={d / 'run'}"]


@pytest.mark.parametrize("name,setup,key", IN_PROCESS, ids=[c[0] for c in IN_PROCESS])
def test_bad_input_is_refused_before_anything_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     name: str, setup: Setup, key: str) -> None:
    from hogwild.errors import UserError
    from hogwild.leader.choose import leader_for

    monkeypatch.chdir(tmp_path)
    args, env = setup(tmp_path)
    args = _with_run_dir(args, tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # The table is written for a machine without a GPU, as CI's is; on one with a GPU the
    # "cuda without gpu" case would start training instead (seen on an H100).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with warnings.catch_warnings(record=True) as said, pytest.raises(UserError) as info:
        warnings.simplefilter("always")
        cfg = compose_cfg(args)
        leader_for(cfg, str(tmp_path / "run")).run()
    while _LOCKS:
        _LOCKS.pop().release()
    msg = str(info.value)
    assert msg.startswith(key), msg
    assert "\n" not in msg.strip(), "the message must fit on one line"
    # Nor may a warning print above it (torch warned about broadcasting before mse_loss failed).
    assert not said, [f"{w.category.__name__}: {w.message}" for w in said]
    assert not list(tmp_path.glob("run/checkpoints/*.pt")), "a failed start must not write checkpoints"


# The same contract seen from a shell: one line, exit code 2, no traceback (slow tier: each
# case is a real CLI process). One case per kind of check, plus what only a process can show.
def _port_in_use(d: Path) -> tuple[list[str], dict[str, str]]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    _HELD.append(s)
    port = s.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    return ["sync.timeout_s=5"], env


def _unreachable_rendezvous(d: Path) -> tuple[list[str], dict[str, str]]:
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    return ["sync.timeout_s=3"], env


def _bad_env(d: Path) -> tuple[list[str], dict[str, str]]:
    return [], {"WORLD_SIZE": "two"}


CLI: list[tuple[str, Setup, str]] = [
    ("workers zero", _args("workers=0"), "workers"),
    ("a run_dir that cannot exist (under /proc)", _args("run_dir=/proc/hogwild-run"), "run_dir"),
    ("misspelled key", _args("trian.epochs=3"), "trian"),
    ("bad value in a sweep", _args("-m", "optim.lr=0.1,-1"), "optim.lr"),
    ("npz NaN in X", _npz(X=np.where(X > 0.5, np.nan, X), y=Y), "data.path"),
    ("corrupt checkpoint", _corrupt_checkpoint, "checkpoint"),
    ("bad torchrun variable", _bad_env, "environment variable WORLD_SIZE"),
    ("port already in use", _port_in_use, "sync"),
    ("unreachable rendezvous", _unreachable_rendezvous, "sync"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,setup,key", CLI, ids=[c[0] for c in CLI])
def test_bad_input_fails_in_one_line(tmp_path: Path, name: str, setup: Setup, key: str) -> None:
    args, env = setup(tmp_path)
    proc = run_cli(_with_run_dir(args, tmp_path), cwd=tmp_path, timeout=120, env=clean_env(**env))
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hogwild: error:")]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"hogwild: error: {key}"), lines[0]
    if name == "unreachable rendezvous":  # the endpoint it tried, within sync.timeout_s=3 of the 120 s limit
        assert f"127.0.0.1:{env['MASTER_PORT']}" in lines[0], lines[0]
    assert not list(tmp_path.glob("run/checkpoints/*.pt")), "a failed start must not write checkpoints"
    assert not list(tmp_path.glob("run/*/checkpoints/*.pt")), "no job of a bad sweep may run"


# User code that fails mid-run in the leader (the workers train on; the model's forward in eval()
# mode, for an evaluation or a checkpoint's probe, leaves or raises at its seventh call): one line
# naming the call, exit 2, never 0 and never "unexpected ... please report it" (exit 70), and the
# checkpoints written before it stay.
MID_RUN_EVAL = [
    ("sys.exit in evaluation", "ExitsInLaterEval", "called sys.exit(3) instead of returning"),
    ("an exception in evaluation", "RaisesInLaterEval", "raised RuntimeError: evaluation broke"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,model,line", MID_RUN_EVAL, ids=[c[0] for c in MID_RUN_EVAL])
def test_user_code_that_fails_in_the_leaders_evaluation_mid_run_is_one_line_and_exit_2(
        tmp_path: Path, name: str, model: str, line: str) -> None:
    from tests.conftest import REPO

    proc = run_cli([f"model._target_=tests.user_models.{model}", "train.max_steps=100000", "eval.every_s=0.3",
                    "eval.max_fraction=1.0", "checkpoint.every_s=0.2", "workers=1", f"run_dir={tmp_path / 'run'}"],
                   cwd=REPO, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hogwild: error:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].endswith(line), proc.stderr[-2000:]
    assert lines[0].startswith("hogwild: error: model, loss: the forward pass and loss on "), lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert list((tmp_path / "run" / "checkpoints").glob("*.pt")), "the checkpoints written before it are kept"


# User code that leaves mid-run with SystemExit in a worker: the run never exits 0; it stops at once
# with exit 2 (no respawn meets it again), and the one line names the key and the call it left from.
MID_RUN_EXITS = [
    ("dataset item", ["data._target_=tests.user_models.late_exit_items", "train.epochs=2"],
     "data: reading a training batch called sys.exit(0) instead of returning"),
    ("optimizer step", ["optim._target_=tests.user_models.LateExitSGD", "train.max_steps=50"],
     "optim: the optimizer's step called sys.exit(4) instead of returning"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,args,line", MID_RUN_EXITS, ids=[c[0] for c in MID_RUN_EXITS])
def test_user_code_that_calls_sys_exit_in_a_worker_never_ends_the_run_with_exit_0(
        tmp_path: Path, name: str, args: list[str], line: str) -> None:
    from tests.conftest import REPO

    proc = run_cli([*args, "workers=1", f"run_dir={tmp_path / 'run'}"], cwd=REPO, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hogwild: error:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and line in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "respawning" not in proc.stderr, proc.stderr[-2000:]
