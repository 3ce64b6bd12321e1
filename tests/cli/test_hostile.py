"""A hostile user at run time: diverging updates, full or unwritable disks, a second job on
one run_dir, signals at chosen moments, a worker dying in warm-up, damaged files (slow tier).

Every case runs the real CLI and asserts what the user sees and what is left behind:
- the exit code, and one ``hogwild: error:`` line naming the problem, never a traceback;
- a good checkpoint written before the case is still there, readable and finite;
- no process of the run and no shared-memory segment outlives it.
The configuration mistakes caught before anything starts are in test_bad_input.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch

from hogwild.checkpoint import store as checkpoint
from tests.conftest import REPO, clean_env, free_port, leaked_torch_shm, torch_shm, wait_training

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
    act: Callable[[subprocess.Popen, Path], None] = lambda p, d: None
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


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, "the run ended before the moment the case needs"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _sigterm_in_startup(proc: subprocess.Popen, d: Path) -> None:
    _wait_for(d / "run" / ".hogwild.lock", proc)  # the leader is set up; workers are starting
    proc.send_signal(signal.SIGTERM)


def _sigterm_in_warm_up(proc: subprocess.Popen, d: Path) -> None:
    # HOGWILD_FAULT=warm:0:MS: worker 0 touches this marker, then warms up MS ms longer.
    marker = Path(tempfile.gettempdir()) / f"hogwild-fault-{proc.pid}-0.warm"
    try:
        _wait_for(marker, proc)
        proc.send_signal(signal.SIGTERM)
    finally:
        marker.unlink(missing_ok=True)


def _second_job(proc: subprocess.Popen, d: Path) -> None:
    wait_training(d / "first", proc)  # a live job holds the run_dir
    second = subprocess.run([sys.executable, "-m", "hogwild.cli.train", *QUICK, f"run_dir={d / 'first'}"],
                            cwd=d, capture_output=True, text=True, timeout=120, env=clean_env())
    (d / "second.json").write_text(json.dumps({"code": second.returncode, "stderr": second.stderr}))


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
    proc = subprocess.run([sys.executable, "-m", "hogwild.cli.train", *QUICK, "train.max_steps=150",
                           f"run_dir={d / 'run'}"], cwd=d, capture_output=True, text=True, timeout=120,
                          env=clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d / "run"


def _ours(tag: str) -> list[int]:
    """Live processes that carry this case's environment tag (the CLI's workers included)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if tag.encode() in (p / "environ").read_bytes():
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


def _finite_checkpoints(run_dir: Path) -> dict[str, torch.Tensor]:
    out = {}
    for p in (run_dir / "checkpoints").glob("step_*.pt"):
        ck = checkpoint.load(p)
        assert torch.isfinite(ck["flat"]).all(), f"{p.name} holds non-finite values"
        out[p.name] = ck["flat"]
    return out


def _sequence(name: str) -> int:
    return int(name.rsplit("-q", 1)[1].removesuffix(".pt"))


def _check(case: Case, proc: subprocess.Popen, out: str, err: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.startswith("hogwild: error:")]
    assert proc.returncode == case.code, err[-3000:]
    assert "Traceback" not in out + err, err[-3000:]
    if case.error is None:
        assert not lines, lines
    else:
        assert len(lines) == 1 and case.error in lines[0], err[-3000:]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_case(tmp_path: Path, good_run: Path, case: Case) -> None:
    if case.good_before:
        shutil.copytree(good_run, tmp_path / "run")
    case.prepare(tmp_path)
    good = _finite_checkpoints(tmp_path / "run") if case.good_before else {}
    tag = f"HOGWILD_TEST_TAG={uuid.uuid4().hex}"
    shm_before = torch_shm()
    args = case.args if case.module != "hogwild.cli.train" else [*QUICK, *case.args, f"run_dir={tmp_path / 'run'}"]
    proc = subprocess.Popen([sys.executable, "-m", case.module, *args], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(**case.env, **dict([tag.split("=")])))
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
            assert not lost or any(torch.equal(f, newest) for f in after.values()), f"a good checkpoint was lost: {lost}"
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
    assert not _ours(tag.split("=")[1]), "a process of the run outlived it"
    assert not leaked_torch_shm(shm_before), "a shared-memory segment was left behind"


def test_a_second_job_on_a_live_run_dir_is_refused_and_the_first_finishes(tmp_path: Path) -> None:
    # The first job is held slow until the second has been answered: a fast machine reached the
    # target and ended the first job before the second one had imported torch.
    held = tmp_path / "hold"
    held.touch()
    proc = subprocess.Popen([sys.executable, "-m", "hogwild.cli.train", *QUICK, "train.max_steps=20000",
                             "train.target_accuracy=0.95", f"run_dir={tmp_path / 'first'}"], cwd=tmp_path,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(HOGWILD_FAULT="slow:0:50", HOGWILD_SLOW_WHILE=str(held)))
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
        proc = subprocess.run([sys.executable, "-m", "hogwild.cli.train", *QUICK, "model.hidden=256",
                               "train.max_steps=400", f"run_dir={disk / 'run'}"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=150, env=clean_env())
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
        procs.append(subprocess.Popen([sys.executable, "-m", "hogwild.cli.train", *QUICK, "train.epochs=100000",
                                       "sync.interval=20", "sync.timeout_s=5", f"run_dir={run_dir}"],
                                      cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=env))
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
    proc = subprocess.Popen([sys.executable, "-m", "hogwild.cli.train", *QUICK, "sync.timeout_s=120",
                             f"run_dir={tmp_path / 'run'}"], cwd=tmp_path, text=True, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + 120
    while "joining gloo group" not in seen:  # in the rendezvous now
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, seen[-2000:]
        seen += line
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, (seen + out)[-3000:]
    assert time.monotonic() - t0 < 15, "SIGTERM waited for the rendezvous"
    assert "Traceback" not in out and "stopped during start-up" in out, out[-3000:]
    assert not list((tmp_path / "run").glob("checkpoints/*.pt"))
