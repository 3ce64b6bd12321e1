"""A checkpoint never chooses code to run: ``hogwild-eval`` calls a ``_target_`` stored in the
file only when the command line names it or passes ``trust_targets=true`` (fast tier).

The crafted files name callables that would create marker files; the tests assert the markers
never appear, not merely that an error was printed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hogwild.checkpoint import store as checkpoint
from hogwild.cli.evaluate import main as eval_main

pytestmark = pytest.mark.timeout(60)

EVIL = '''
from pathlib import Path
Path("imported.marker").touch()  # importing a module already runs its code


def make(**kwargs):
    Path("called.marker").touch()
    raise RuntimeError("a crafted target ran")
'''


def _file(d: Path, name: str, config: dict) -> Path:
    """A checkpoint holding ``config``, beside the module its targets would import."""
    (d / "evilmod.py").write_text(EVIL)
    path = d / name
    torch.save({
        "format": checkpoint.FORMAT, "lineage": "x", "written_at": 0.0, "model": "evilmod.make",
        "shapes": [[2]], "flat": torch.zeros(2), "opt_state": {}, "positions": torch.zeros(1, 1),
        "counters": {"steps": 1}, "sync_state": {}, "config": {"run_dir": "run", **config},
    }, path)
    return path


def _crafted(d: Path) -> Path:
    return _file(d, "crafted.pt", {"model": {"_target_": "evilmod.make"},
                                   "data": {"_target_": "subprocess.getoutput",
                                            "kwargs": {"cmd": "touch shell.marker"}}})


def _eval(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        eval_main(args)
    return int(e.value.code or 0), capsys.readouterr().err


@pytest.fixture
def crafted(tmp_cwd: Path) -> Path:
    sys.modules.pop("evilmod", None)
    yield _crafted(tmp_cwd)
    sys.modules.pop("evilmod", None)


def _markers(d: Path) -> list[str]:
    return sorted(p.name for p in d.glob("*.marker"))


def test_a_stored_target_is_refused_in_one_line_and_nothing_runs(crafted: Path, capsys: pytest.CaptureFixture[str]
                                                                  ) -> None:
    code, err = _eval([f"checkpoint={crafted}"], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "model._target_" in lines[0] and "'evilmod.make'" in lines[0] and "trust_targets=true" in lines[0]
    assert _markers(crafted.parent) == []


def test_naming_one_target_does_not_let_the_other_run(crafted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The user vouches for the model's code but not for the data's: the data target is refused
    # before anything is imported, the model's included.
    code, err = _eval([f"checkpoint={crafted}", "model._target_=evilmod.make"], capsys)
    assert code == 2
    assert "data._target_" in err and "'subprocess.getoutput'" in err
    assert _markers(crafted.parent) == []


def test_a_target_the_user_names_or_trusts_is_called(crafted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The gate opens only on the user's word; with it the stored data target runs (and here
    # the crafted one touches its marker): proof that the refusals above are the gate at work.
    code, err = _eval([f"checkpoint={crafted}", "trust_targets=true"], capsys)
    assert code == 2 and "data._target_" in err  # getoutput returns a str, not datasets
    assert _markers(crafted.parent) == ["shell.marker"]


def test_a_bad_trust_flag_is_named(crafted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _eval([f"checkpoint={crafted}", "trust_targets=maybe"], capsys)
    assert code == 2 and "trust_targets: must be true or false" in err
    assert _markers(crafted.parent) == []


def test_only_the_targets_evaluation_calls_are_gated() -> None:
    from hogwild.config.targets import refuse_stored_targets
    from hogwild.errors import ConfigError

    # Evaluation builds no optimizer or scheduler: their stored targets are never called.
    refuse_stored_targets({"optim": {"_target_": "torch.optim.AdamW"}, "sched": {"_target_": "x.y"}}, [], False, "f")
    with pytest.raises(ConfigError, match=r"^loss._target_: f asks to call 'evilmod.loss'"):
        refuse_stored_targets({"loss": {"_target_": "evilmod.loss"}}, [], False, "f")
    with pytest.raises(ConfigError, match=r"^model.kwargs.block._target_"):  # nested, any depth
        refuse_stored_targets({"model": {"kwargs": {"block": {"_target_": "os.system"}}}}, [], False, "f")


def _hidden(d: Path) -> Path:
    """A file whose model target is an interpolation pointing at a callable stored elsewhere in it."""
    return _file(d, "hidden.pt", {"model": {"_target_": "${model.kwargs.impl}", "kwargs": {"impl": "evilmod.make"}}})


@pytest.fixture
def hidden(tmp_cwd: Path) -> Path:
    sys.modules.pop("evilmod", None)
    yield _hidden(tmp_cwd)
    sys.modules.pop("evilmod", None)


def test_a_target_hidden_behind_an_interpolation_is_named_by_what_it_calls(hidden: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _eval([f"checkpoint={hidden}"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "'evilmod.make'" in err and "model._target_=evilmod.make" in err and "${" not in err
    assert _markers(hidden.parent) == []


def test_repeating_the_interpolation_on_the_command_line_vouches_for_nothing(hidden: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # What the gate used to tell the user to type: it resolved to the hidden callable and ran it.
    for given in ("model._target_=${model.kwargs.impl}", "model._target_='${model.kwargs.impl}'"):
        code, err = _eval([f"checkpoint={hidden}", given], capsys)
        assert code == 2 and "model._target_: checkpoint" in err and "'evilmod.make'" in err, err
        assert _markers(hidden.parent) == []


def test_an_override_that_points_a_named_target_elsewhere_is_judged_resolved(hidden: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The user names a harmless-looking target, but the stored interpolation is re-pointed by an
    # override of the value it reads: what would be called is what the user must name.
    code, err = _eval([f"checkpoint={hidden}", "model._target_=torch.nn.Identity",
                       "model._target_=${model.kwargs.impl}"], capsys)
    assert code == 2 and "'evilmod.make'" in err
    assert _markers(hidden.parent) == []


def test_every_target_the_file_asks_for_is_named_in_the_one_line(crafted: Path, capsys: pytest.CaptureFixture[str]
                                                                 ) -> None:
    # One rerun, not one per target: the line lists what to type for each of them.
    code, err = _eval([f"checkpoint={crafted}"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "model._target_=evilmod.make" in err and "data._target_=subprocess.getoutput" in err, err
    assert _markers(crafted.parent) == []
