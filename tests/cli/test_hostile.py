"""A hostile user at run time: diverging updates, full or unwritable disks, a second job on
one run_dir, signals at chosen moments, a worker dying in warm-up, damaged files (slow tier).

Every case runs the real CLI (forked from the test process's zygote, tests/zygote.py) and asserts
what the user sees and what is left behind:
- the exit code, and one ``hogwild: error:`` line naming the problem, never a traceback;
- a good checkpoint written before the case is still there, readable and finite;
- no process of the run and no shared-memory segment outlives it.
The configuration mistakes caught before anything starts are in test_bad_input.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch

from hogwild.checkpoint import store as checkpoint
from tests.conftest import (REPO, clean_env, free_port, leaked_torch_shm, run_cli, session, torch_shm,
                            wait_training, zygote_of_this_process)
from tests.zygote import Forked

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

QUICK = ["workers=1", "eval.every_s=1", "checkpoint.every_s=0.2"]


@dataclass
class Case:
    name: str
    args: list[str]
    code: int
    error: Optional[str]
    """Text the one error line must contain; None: no error line at all."""
    prepare: Callable[[Path], None] = lambda d: None
    act: Callable[[Forked, Path], None] = lambda p, d: None
    env: dict[str, str] = field(default_factory=dict)
    module: str = "hogwild.cli.train"
    good_before: bool = False
    """Start from a copy of a finished good run (its checkpoint must survive the case)."""


def _make_file(rel: str, text: str = "x") -> Callable[[Path], None]:
    def prepare(d: Path) -> None:
        (d / "run" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "run" / rel).write_text(text)
    return prepare


def _metrics_is_a_dir(d: Path) -> None:
    (d / "run" / "metrics.json").mkdir(parents=True)


def _cli(args: list[str], cwd: Path, env: Optional[dict[str, str]] = None, module: str = "hogwild.cli.train",
         name: str = "cli") -> Forked:
    """``python -m module *args``, forked from this test process's zygote in a session of its own:
    every process of the run (its fork server, workers, DataLoader processes) is in that session
    (``tests.conftest.session``). Its stdout and stderr go to files beside ``cwd``."""
    io = cwd.parent / f"{cwd.name}-io"
    io.mkdir(exist_ok=True)
    return zygote_of_this_process().start(module, args, cwd, env or clean_env(), io / f"{name}.err",
                                          stdout=io / f"{name}.out", session=True)


def _wait_for(path: Path, proc: Forked, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, "the run ended before the moment the case needs"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _sigterm_in_startup(proc: Forked, d: Path) -> None:
    _wait_for(d / "run" / ".hogwild.lock", proc)  # the leader is set up; workers are starting
    proc.send_signal(signal.SIGTERM)


def _sigterm_in_warm_up(proc: Forked, d: Path) -> None:
    # HOGWILD_FAULT=warm:0:MS: worker 0 touches this marker, then warms up MS ms longer.
    marker = Path(tempfile.gettempdir()) / f"hogwild-fault-{proc.pid}-0.warm"
    try:
        _wait_for(marker, proc)
        proc.send_signal(signal.SIGTERM)
    finally:
        marker.unlink(missing_ok=True)


def _second_job(proc: Forked, d: Path) -> None:
    wait_training(d / "first", proc)  # a live job holds the run_dir
    second = _cli([*QUICK, f"run_dir={d / 'first'}"], d, name="second")
    _, err = second.communicate(timeout=120)
    (d / "second.json").write_text(json.dumps({"code": second.returncode, "stderr": err}))


def _user_data(d: Path) -> None:
    shutil.copy(REPO / "examples" / "mydata.py", d / "mydata.py")


def _eval_checkpoint(**fields: object) -> Callable[[Path], None]:
    def prepare(d: Path) -> None:
        ck = checkpoint.load(d / "run" / "checkpoints" / "last.pt")
        if "config" in fields:
            fields["config"] = {**ck["config"], **fields["config"]}  # type: ignore[dict-item]
        torch.save({**ck, **fields}, d / "edited.pt")
    return prepare


CASES = [
    Case("diverging update (lr=inf) after a good checkpoint", ["optim.lr=inf", "checkpoint.keep=1",
         "train.max_steps=2000", "resume=true"], 4, "non-finite", good_before=True),
    Case("diverged loss (lr=1e6)", ["optim.lr=1e6", "checkpoint.keep=1", "train.max_steps=2000",
         "resume=true"], 4, "diverged", good_before=True),
    Case("checkpoints/ cannot be created", ["train.max_steps=200"], 5, "checkpoint: could not write",
         prepare=_make_file("checkpoints")),
    Case("metrics.json cannot be written", ["train.max_steps=200"], 5, "metrics.json", prepare=_metrics_is_a_dir),
    Case("a file where tb/ must be", ["train.max_steps=200"], 5, "run_dir: cannot write", prepare=_make_file("tb")),
    Case("a file where .hydra/ must be", ["train.max_steps=200"], 5, "run_dir: cannot write",
         prepare=_make_file(".hydra")),
    Case("a file where progress/ must be", ["train.max_steps=200"], 5, "run_dir: cannot write",
         prepare=_make_file("progress")),
    Case("a run_dir in a symbolic-link loop", ["train.max_steps=200"], 2, "run_dir: cannot create",
         prepare=lambda d: (d / "run").symlink_to(d / "run")),
    Case("SIGTERM during start-up", ["workers=2", "train.max_steps=200"], 143, "during start-up",
         act=_sigterm_in_startup),
    Case("SIGTERM while the workers warm up", ["workers=2", "train.max_steps=200"], 143, "during start-up",
         env={"HOGWILD_FAULT": "warm:0:3000"}, act=_sigterm_in_warm_up),
    Case("a worker dies during warm-up", ["workers=2", "train.max_steps=200"], 0, None,
         env={"HOGWILD_FAULT": "start:1:0"}),
    Case("a damaged progress board on resume", ["train.max_steps=300", "resume=true"], 0, None,
         prepare=_make_file("progress/rank0.board", "{not a board"), good_before=True),
    Case("map-style data read ahead by DataLoader processes", ["data._target_=mydata.digits", "workers=2",
         "data.loader_workers=2", "train.max_steps=100"], 0, None, prepare=_user_data),
    Case("hogwild-eval: checkpoint config with an unknown key", ["checkpoint=edited.pt"], 2, "checkpoint",
         prepare=_eval_checkpoint(config={"nonsense": 1}), module="hogwild.cli.evaluate", good_before=True),
    Case("hogwild-eval: checkpoint flat tensor of the wrong size", ["checkpoint=edited.pt"], 2, "damaged",
         prepare=_eval_checkpoint(flat=torch.zeros(7)), module="hogwild.cli.evaluate", good_before=True),
]


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("good")
    proc = _cli([*QUICK, "train.max_steps=150", f"run_dir={d / 'run'}"], d)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return d / "run"


def _finite_checkpoints(run_dir: Path) -> dict[str, torch.Tensor]:
    out = {}
    for p in (run_dir / "checkpoints").glob("step_*.pt"):
        ck = checkpoint.load(p)
        assert torch.isfinite(ck["flat"]).all(), f"{p.name} holds non-finite values"
        out[p.name] = ck["flat"]
    return out


def _sequence(name: str) -> int:
    return int(name.rsplit("-q", 1)[1].removesuffix(".pt"))


def _check(case: Case, proc: Forked, out: str, err: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.startswith("hogwild: error:")]
    assert proc.returncode == case.code, err[-3000:]
    assert "Traceback" not in out + err, err[-3000:]
    if case.error is None:
        assert not lines, lines
    else:
        assert len(lines) == 1 and case.error in lines[0], err[-3000:]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_case(tmp_path: Path, request: pytest.FixtureRequest, case: Case) -> None:
    if case.good_before:
        # Asked for here, not as an argument: a test process that runs no such case never trains it.
        shutil.copytree(request.getfixturevalue("good_run"), tmp_path / "run")
    case.prepare(tmp_path)
    good = _finite_checkpoints(tmp_path / "run") if case.good_before else {}
    shm_before = torch_shm()
    args = case.args if case.module != "hogwild.cli.train" else [*QUICK, *case.args, f"run_dir={tmp_path / 'run'}"]
    proc = _cli(args, tmp_path, clean_env(**case.env), module=case.module)
    case.act(proc, tmp_path)
    out, err = proc.communicate(timeout=150)
    _check(case, proc, out, err)
    if case.good_before:
        after = _finite_checkpoints(tmp_path / "run")
        if case.code == 0:  # a run that went on may prune its older files (checkpoint.keep)
            newest = checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt")["counters"]["steps"]
            assert newest > max(int(n[5:14]) for n in good), "the run did not checkpoint past its start"
        else:
            # A failed run leaves no file of the bad model, and never less than the good model it
            # started from. Under load its first checkpoint may come before its first update: that
            # file holds the same model, and checkpoint.keep=1 rightly prunes its older twins.
            newest = good[max(good, key=_sequence)]
            for name, flat in after.items():
                assert name in good or torch.equal(flat, newest), f"{name} holds a model the run did not start from"
            lost = set(good) - set(after)
            assert not lost or any(torch.equal(f, newest) for f in after.values()), \
                f"a good checkpoint was lost: {lost}"
            # Nor its report: the resumed run's failure is written beside the good run's metrics.
            if case.module == "hogwild.cli.train":
                kept = [json.loads(p.read_text()) for p in (tmp_path / "run").glob("metrics-*.json")]
                assert [m["status"] for m in kept] == ["ok"], "the good run's metrics.json was replaced"
    if case.name == "a worker dies during warm-up":
        assert json.loads((tmp_path / "run" / "metrics.json").read_text())["worker_restarts"] == 1
    if case.code in (4, 5) and case.module == "hogwild.cli.train":
        m = json.loads((tmp_path / "run" / "metrics.json").read_text()) if case.code == 4 else None
        assert m is None or (m["exit_code"] == 4 and m["status"] == "training_failed"), m
    if case.name in ("SIGTERM during start-up", "SIGTERM while the workers warm up"):
        assert not list((tmp_path / "run").glob("checkpoints/*.pt")), "nothing trained, nothing to write"
    time.sleep(0.5)
    assert not session(proc.pid), "a process of the run outlived it"
    assert not leaked_torch_shm(shm_before), "a shared-memory segment was left behind"


def test_a_second_job_on_a_live_run_dir_is_refused_and_the_first_finishes(tmp_path: Path) -> None:
    # The first job is held slow until the second has been answered: a fast machine reached the
    # target and ended the first job before the second one had imported torch.
    held = tmp_path / "hold"
    held.touch()
    proc = _cli([*QUICK, "train.max_steps=20000", "train.target_accuracy=0.95", f"run_dir={tmp_path / 'first'}"],
                tmp_path, clean_env(HOGWILD_FAULT="slow:0:50", HOGWILD_SLOW_WHILE=str(held)))
    try:
        _second_job(proc, tmp_path)
    finally:
        held.unlink()
    out, err = proc.communicate(timeout=150)
    second = json.loads((tmp_path / "second.json").read_text())
    assert second["code"] == 2 and "Traceback" not in second["stderr"], second["stderr"][-2000:]
    assert f"is in use by pid {proc.pid}" in second["stderr"], second["stderr"][-2000:]
    assert proc.returncode == 0, err[-3000:]
    m = json.loads((tmp_path / "first" / "metrics.json").read_text())
    assert m["status"] == "ok" and m["resumed_from"] == "", "the second job touched the first's run"
    # Nothing of the run's record is written before the lock: Hydra's config copy is the first job's.
    overrides = (tmp_path / "first" / ".hydra" / "overrides.yaml").read_text()
    assert "train.max_steps=20000" in overrides, overrides


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def test_a_full_disk_stops_the_run_in_one_line_and_leaves_no_temp_file(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not _mount_tmpfs(disk, "600k"):
        pytest.skip("needs permission to mount a small tmpfs")
    try:
        # Room for the start (config copy, TensorBoard) and about one checkpoint, not three.
        (disk / "filler").write_bytes(b"\0" * (shutil.disk_usage(disk).free - 150_000))
        proc = run_cli([*QUICK, "model.hidden=256", "train.max_steps=400", f"run_dir={disk / 'run'}"], tmp_path,
                       timeout=150)
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hogwild: error:")]
        assert proc.returncode == 5, proc.stderr[-3000:]
        assert len(lines) == 1 and "could not write" in lines[0] and "MiB free there" in lines[0], lines
        assert "Traceback" not in proc.stderr
        assert not list(disk.rglob("*.tmp")), "a temp file was left on the full disk"
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_frozen_peer_ends_the_survivor_with_exit_3_not_an_abort(tmp_path: Path) -> None:
    """A peer leader stopped (SIGSTOP) past sync.timeout_s: the survivor reports the lost peer
    in one line and exits 3, keeping its checkpoint; it must not die by SIGABRT in Gloo."""

    port, run_dir = free_port(), tmp_path / "run"
    procs = []
    for rank in (0, 1):
        env = clean_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(_cli([*QUICK, "train.epochs=100000", "sync.interval=20", "sync.timeout_s=5",
                           f"run_dir={run_dir}"], tmp_path, env, name=f"rank{rank}"))
    try:
        wait_training(run_dir, procs[0], rank=0)
        wait_training(run_dir, procs[1], rank=1)
        os.kill(procs[1].pid, signal.SIGSTOP)
        out, err = procs[0].communicate(timeout=90)
        lines = [ln for ln in err.splitlines() if ln.startswith("hogwild: error:")]
        assert procs[0].returncode == 3, err[-3000:]
        assert len(lines) == 1 and "peer" in lines[0], err[-3000:]
        assert "terminate called" not in err and "Traceback" not in err, err[-3000:]
        assert torch.isfinite(checkpoint.load(run_dir / "checkpoints" / "last.pt")["flat"]).all()
    finally:
        os.kill(procs[1].pid, signal.SIGCONT)
        for p in procs:
            p.kill()
            p.wait()


def test_sigterm_during_a_rendezvous_that_never_completes_stops_at_once(tmp_path: Path) -> None:
    """Rank 0 of 2, and rank 1 never comes: the rendezvous held the main thread inside C++, so
    the signal handler never ran and SIGTERM was ignored until SIGKILL (issue 24, item 12)."""
    env = clean_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = _cli([*QUICK, "sync.timeout_s=120", f"run_dir={tmp_path / 'run'}"], tmp_path, env)
    deadline = time.monotonic() + 120
    while "joining gloo group" not in "".join(proc.output()):  # in the rendezvous now
        assert proc.poll() is None and time.monotonic() < deadline, "".join(proc.output())[-2000:]
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    out = "".join(proc.communicate(timeout=60))
    assert proc.returncode == 143, out[-3000:]
    assert time.monotonic() - t0 < 15, "SIGTERM waited for the rendezvous"
    assert "Traceback" not in out and "stopped during start-up" in out, out[-3000:]
    assert not list((tmp_path / "run").glob("checkpoints/*.pt"))


# User code that raises in a worker mid-run is the user's error, not a fault: one line naming the
# call, the item and the exception, exit 2 at once (a respawn would read the same item), and the
# checkpoints written before it stay. Items past 100 raise once the first checkpoint exists (the
# leader's own checks read items 0, 200 and 399, and its probe the first 64).
FAILING_ITEMS = '''
import os
import torch


class CorruptRecord(BaseException):  # not even an Exception: it respawned workers until exit 0
    pass


class Items:
    targets = [i % 2 for i in range(400)]

    def __init__(self, gate):
        self.gate = gate

    def __len__(self):
        return 400

    def __getitem__(self, i):
        if i >= 100 and i not in (200, 399) and os.path.exists(self.gate):
            raise CorruptRecord(f"corrupt record {i}")
        return torch.full((64,), float(i % 2)), i % 2


def items(gate):
    return Items(gate), Items(gate + ".never")
'''


def test_a_dataset_item_that_raises_mid_run_stops_the_run_at_once_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "failing.py").write_text(FAILING_ITEMS)
    run_dir = tmp_path / "run"
    shm_before = torch_shm()
    proc = _cli([*QUICK, "workers=2", "train.max_steps=100000", "data._target_=failing.items",
                 f"+data.gate={run_dir / 'checkpoints' / 'last.pt'}", f"run_dir={run_dir}"], tmp_path)
    stdout, stderr = proc.communicate(timeout=150)
    lines = [ln for ln in stderr.splitlines() if ln.startswith("hogwild: error:")]
    assert proc.returncode == 2, stderr[-3000:]
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("hogwild: error: data: reading a training batch raised CorruptRecord: "
                               "corrupt record "), lines
    assert " of the train set; worker " in lines[0] and "the traceback is in " in lines[0], lines[0]
    assert "Traceback" not in stdout + stderr and "respawning" not in stderr, stderr[-3000:]
    assert "Traceback" in Path(lines[0].rsplit("the traceback is in ", 1)[1]).read_text()
    assert torch.isfinite(checkpoint.load(run_dir / "checkpoints" / "last.pt")["flat"]).all()
    time.sleep(0.5)
    assert not session(proc.pid), "a process of the run outlived it"
    assert not leaked_torch_shm(shm_before), "a shared-memory segment was left behind"


def _user_raises(message: str) -> None:  # the user's code: a file outside hogwild
    raise ValueError(message)


def _raised(fn: Callable[[], object]) -> BaseException:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - the exception itself is what is looked at
        return e
    raise AssertionError("it did not raise")


def test_a_worker_blames_the_user_only_for_what_the_users_code_raised() -> None:
    from hogwild.data.items import collate
    from hogwild.errors import ConfigError
    from hogwild.replica.blame import user_failure
    from hogwild.replica.worker import _USER_ANYWHERE, _USER_OUTSIDE, DATA, FORWARD, OPTIM

    def blame(e: BaseException, phase: str) -> Optional[str]:
        return user_failure(e, phase, _USER_ANYWHERE, _USER_OUTSIDE)

    mine = _raised(lambda: _user_raises("broke at step 30"))
    ours = _raised(lambda: collate([]))  # an IndexError raised in hogwild's own file
    assert blame(mine, FORWARD) == "model, loss, step: the forward pass and loss raised ValueError: broke at step 30"
    assert blame(mine, OPTIM) == "optim: the optimizer's step raised ValueError: broke at step 30"
    assert blame(ours, FORWARD) is None and blame(ours, OPTIM) is None, "a bug of hogwild's: exit 70 and respawns"
    assert blame(ours, DATA) is not None, "collating the user's items is the user's data"
    assert blame(mine, "the step") is None, "outside a user call nothing is the user's"
    assert blame(_raised(lambda: sys.exit(4)), OPTIM) == \
        "optim: the optimizer's step called sys.exit(4) instead of returning"
    assert blame(ConfigError("data: a batch of the train stream: input 0 holds 1e+300"), FORWARD) == \
        "data: a batch of the train stream: input 0 holds 1e+300"


class _BadRecord(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 3:
            raise ValueError("corrupt record 3")
        return torch.zeros(2)


def test_an_item_that_raises_in_a_dataloader_process_is_named_by_its_own_type_and_message() -> None:
    from hogwild.replica.blame import user_failure
    from hogwild.replica.worker import _USER_ANYWHERE, _USER_OUTSIDE, DATA

    loader = torch.utils.data.DataLoader(_BadRecord(), batch_size=2, num_workers=1)
    e = _raised(lambda: list(loader))  # torch re-raises it as "Caught ValueError in DataLoader worker process 0..."
    assert user_failure(e, DATA, _USER_ANYWHERE, _USER_OUTSIDE) == \
        "data: reading a training batch raised ValueError: corrupt record 3"


def test_a_notice_reaches_the_leader_whole_and_in_one_write() -> None:
    from multiprocessing import Pipe

    from hogwild.replica.blame import MAX_NOTICE, read_notice, tell_leader

    r, w = Pipe(duplex=False)
    w.send_bytes(b"r")
    tell_leader(w, 1, "data: reading a training batch raised\nValueError: x")
    tell_leader(w, 0, "y" * 10_000)
    got = [r.recv_bytes() for _ in range(3)]
    assert read_notice(got[0]) is None, "a wake-up is no notice"
    assert read_notice(got[1]) == (1, "data: reading a training batch raised ValueError: x"), "one line"
    assert len(got[2]) <= MAX_NOTICE < 4096, "one write the pipe never splits (PIPE_BUF)"


def test_a_schedule_whose_rate_leaves_the_floats_is_refused_naming_the_key_the_step_and_the_rate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hogwild.config.train import SchedConfig
    from hogwild.errors import ConfigError, UserError
    from hogwild.leader.choose import leader_for
    from hogwild.replica.lr_schedule import LRSchedule, check_schedule
    from tests.conftest import compose_cfg

    # The user's own command: refused by the leader with the run's real length, before any worker.
    monkeypatch.chdir(tmp_path)
    cfg = compose_cfg(["sched._target_=torch.optim.lr_scheduler.ExponentialLR", "+sched.kwargs.gamma=1e10",
                       f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(UserError) as info:
        leader_for(cfg, str(tmp_path / "run")).run()
    assert str(info.value).startswith("sched._target_=torch.optim.lr_scheduler.ExponentialLR: the learning rate at "
                                      "step 31 of "), info.value
    assert " is inf (optim.lr=" in str(info.value) and "None" not in str(info.value)
    assert not list(tmp_path.glob("run/checkpoints/*.pt"))
    # Built-in schedules: named by sched.name and their keys, found late in a long run too.
    with pytest.raises(ConfigError, match=r"^sched.name=step \(sched.gamma=1e\+10, sched.step_size=1\): the learning "
                                          r"rate at step 31 of 1000 is inf"):
        check_schedule(SchedConfig(name="step", gamma=1e10, step_size=1), 0.1, 1000)
    with pytest.raises(ConfigError, match=r"sched.gamma=1.001.* is inf"):
        check_schedule(SchedConfig(name="step", gamma=1.001, step_size=1), 0.1, 10_000_000)
    check_schedule(SchedConfig(name="cosine"), 0.1, 10_000_000)
    check_schedule(SchedConfig(), math.inf, 1000)  # optim.lr=inf is the user's to try (exit 4 later)
    # Past what is read ahead, a worker's own reading refuses it (exit 2 there, not a model gone NaN).
    sched = LRSchedule(SchedConfig(_target_="torch.optim.lr_scheduler.ExponentialLR", kwargs={"gamma": 2.0}), 0.1, 10)
    with pytest.raises(ConfigError, match="at step 1100 of 10 is inf"):
        sched.lr_at(1100)


def test_float64_data_past_float32_is_a_data_error_naming_the_key(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from hogwild.data.items import beyond_float32
    from hogwild.data.mapped import check_pair
    from hogwild.data.streams import StreamSplit
    from hogwild.errors import ConfigError, UserError
    from hogwild.leader.choose import leader_for
    from tests.conftest import compose_cfg

    x = np.random.default_rng(0).random((200, 8))
    x[150, 3] = 1e300  # float32 makes it inf, and the model NaN a few steps later (exit 4)
    np.savez(tmp_path / "d.npz", X=x, y=np.arange(200) % 2)
    monkeypatch.chdir(tmp_path)
    cfg = compose_cfg(["data=npz", f"data.path={tmp_path / 'd.npz'}", f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(UserError, match=r"^data.path: .*d.npz: X holds 1e\+300, past float32's largest value"):
        leader_for(cfg, str(tmp_path / "run")).run()
    assert not list(tmp_path.glob("run/progress/*")), "refused before any worker"
    big = torch.zeros(3_000_000, dtype=torch.float64)
    big[-1] = -1e39
    assert beyond_float32(big) == -1e39 and beyond_float32(big.float()) is None  # read in chunks, to the end
    tensors = torch.utils.data.TensorDataset(torch.full((4, 2), 1e300, dtype=torch.float64), torch.arange(4) % 2)
    with pytest.raises(ConfigError, match=r"^data._target_: tensor 0 of the train set holds 1e\+300"):
        check_pair(tensors, tensors, "data._target_")
    items = [(torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64), i % 2) for i in range(8)]
    items[5] = (items[5][0], torch.tensor([0.0, -1e300], dtype=torch.float64), 1)
    with pytest.raises(ConfigError, match=r"^data._target_: item 5 of the train set holds -1e\+300"):
        check_pair(items, items[:2], "data._target_")
    stream = StreamSplit([], "train", "auto", "round_robin")  # a stream is checked batch by batch, in the worker
    with pytest.raises(ConfigError, match=r"^data: a batch of the train stream: input 0 holds 1e\+300"):
        stream.collate([(torch.full((2,), 1e300, dtype=torch.float64), 0)])


def test_a_stderr_on_a_full_disk_keeps_the_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    from hogwild.errors import ConfigError, report

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    full = open("/dev/full", "w")  # hogwild-train ... 2> run.err on a full disk
    try:
        monkeypatch.setattr(sys, "stderr", full)
        with pytest.raises(SystemExit) as info:
            report(ConfigError("workers: must be at least 1"))
    finally:
        monkeypatch.undo()
        with contextlib.suppress(OSError):  # the line still held in its buffer
            full.close()
    assert info.value.code == 2, "not an OSError's traceback and exit 1"


def test_a_progress_board_a_full_disk_cannot_hold_is_a_write_error_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from hogwild.errors import WriteFailed
    from hogwild.replica.board import Board

    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    # Mapped but never given its pages, the board killed the leader with SIGBUS at its first write.
    monkeypatch.setattr(os, "posix_fallocate", full)
    path = tmp_path / "run" / "progress" / "rank0.board"
    path.parent.parent.mkdir()
    with pytest.raises(OSError) as info:
        Board(2, path)
    assert str(WriteFailed.of(info.value)) == f"run_dir: cannot write {path}: No space left on device"
