"""``hogwild-train``: a thin Hydra entry point. Validate the whole config, then run a leader.

Every job of the command line is composed and validated (config/compose.py) *before* Hydra's own
runner starts and before any process is spawned (design rule 9 in docs/design.md), so a typo,
a bad value or an unknown group option fails in one line naming the key, with exit code 2.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from hogwild.cli.common import import_from_cwd
from hogwild.config.compose import CONF_DIR, preflight, register_resolvers, to_config
from hogwild.config.moved import renamed
from hogwild.config.env import DistEnv
from hogwild.errors import Fault, UserError, WriteFailed, crash, guarded, report, say_error
from hogwild.native import left_running
from hogwild.replica.start import fork_server_from_here
from hogwild.replica.tasks import kind_of
from hogwild.report.summary import RunResult

logger = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(dcfg: DictConfig) -> Optional[float]:
    from hogwild.leader.choose import leader_for

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        cfg = to_config(dcfg)
        result = leader_for(cfg, run_dir, overrides=list(HydraConfig.get().overrides.task)).run()
    except (UserError, Fault) as e:
        report(e)
    except OSError as e:  # a file of the run: a full disk, a file where a folder must be
        report(WriteFailed.of(e))
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - else Hydra prints the raw traceback and exits 1
        crash(e, Path(run_dir) if Path(run_dir).is_dir() else None)
    log_result(result)
    if result.exit_code != 0 and result.error:
        say_error(result.error)
    sweep_goes_on = result.exit_code == 0 and HydraConfig.get().mode == RunMode.MULTIRUN
    if (result.peer_lost or left_running()) and not sweep_goes_on:
        # A collective to a lost peer is still pending inside Gloo/NCCL, a group was aborted
        # mid-run, or a native call given up on still runs (hogwild/native.py): tearing the
        # interpreter down under them aborts it (SIGABRT), even after a run that recovered and
        # finished well. A sweep's next job needs this interpreter, so there it is left to chance.
        logger.debug("leaving with os._exit(%d): native work given up on may still run", result.exit_code)
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # redirected to a full disk: the exit code still holds
                stream.flush()
        os._exit(result.exit_code)
    if result.exit_code != 0:
        raise SystemExit(result.exit_code)
    m = result.metrics or {}
    headline = m.get(f"test_{kind_of(m['task']).headline}") if "task" in m else None
    return float("nan") if headline is None else float(headline)  # Hydra's sweepers read it


def log_result(result: RunResult) -> None:
    """The end of a run in three lines: the test scores, the verdict, and where the outputs are."""
    m = result.metrics
    if m is None or "verdict" not in m:
        return
    # A score that does not exist (a diverged model's loss) is null in metrics.json.
    scores = ", ".join(f"{k[5:]} {'n/a' if v is None else f'{v:.4f}'}" for k, v in m.items() if k.startswith("test_"))
    logger.info("test %s; %d steps, %.0f samples/s in %.1fs", scores, m["steps"], m["samples_per_s"] or 0.0,
                m["wall_s"])
    verdict = m.get("verdict", "")
    (logger.info if verdict.startswith("learned") else logger.warning)("verdict: %s", verdict)
    run_dir = Path(m["run_dir"])
    outputs = [name for name in ("metrics.json", "checkpoints/last.pt", "tb/") if (run_dir / name).exists()]
    logger.info("outputs in %s: %s (tensorboard --logdir %s/tb)", run_dir, ", ".join(outputs), run_dir)


@guarded
def main() -> None:
    import_from_cwd()
    register_resolvers()
    # A bad setting or launcher variable is a UserError: @guarded's one line and exit 2.
    DistEnv.from_env()  # torchrun's variables: Hydra reads them too, inside its own config
    # Hydra parses sys.argv itself: a key that moved group is respelled for it too (config/moved.py).
    sys.argv[1:] = renamed(sys.argv[1:])
    cfg = preflight(sys.argv[1:])
    if cfg is not None:  # None: Hydra prints and runs nothing
        # Before any job runs, while this process has done nothing but imports and composing: the
        # workers' fork server is then a fork of it, with torch and the config's target modules
        # imported once, instead of a fresh interpreter that imports them again (replica/start.py).
        fork_server_from_here(cfg)
    _hydra_main()


if __name__ == "__main__":
    main()
