"""Property-based tests of the config layer (Hypothesis): any value, of any type, for any key of
the schema gives either a valid run config or one ``ConfigError`` whose line names that key,
never another exception and never a line that names nothing (fast tier; a small profile keeps
it to seconds: HOGWILD_HYPOTHESIS_EXAMPLES raises it for a longer search)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hogwild.config import schema
from hogwild.config.compose import preflight, register_resolvers
from hogwild.errors import ConfigError

EXAMPLES = int(os.environ.get("HOGWILD_HYPOTHESIS_EXAMPLES", "60"))
# Keys whose values are paths or shell-facing names the run acts on: covered by their own tests.
SKIP = {"run_dir", "data.root", "data.path", "resume", "elastic.coordinator"}


def _keys(cls: type = schema.Config, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        name, kind = f"{prefix}{f.name}", hints[f.name]
        if dataclasses.is_dataclass(kind):
            out += _keys(kind, f"{name}.")  # type: ignore[arg-type]
        elif f.name not in ("kwargs", "_target_") and name not in SKIP:
            out.append(name)
    return out


KEYS = _keys()
VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "false", "null", "auto", "''", "[]", "[1,2]", "{}", "0", "-1", "1e400", "00:01:30"]),
    st.text(alphabet="abcxyz019_-.:/ ", min_size=1, max_size=12),
)
RUN_DIR = Path(tempfile.mkdtemp(prefix="hogwild-props-")) / "run"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(KEYS), value=VALUES)
def test_any_value_for_any_key_is_a_config_or_one_line_naming_the_key(key: str, value: str) -> None:
    register_resolvers()
    try:
        preflight([f"{key}={value}", f"run_dir={RUN_DIR}"])
    except ConfigError as e:
        msg = str(e)
        assert "\n" not in msg.strip(), msg
        # The key itself, or the group it belongs to when the value chose a group option.
        assert msg.startswith((key, key.split(".")[0], "train.target")), (key, value, msg)


def test_every_key_of_the_schema_is_searched() -> None:
    assert {"optim.lr", "train.max_time", "sync.timeout_s", "eval.max_fraction", "step.logits"} <= set(KEYS)
    assert len(KEYS) > 60


@pytest.mark.parametrize("key", ["train.epochs", "optim.lr", "sync.interval", "train.max_time"])
def test_a_value_hydra_cannot_parse_names_its_key(key: str) -> None:
    register_resolvers()
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        preflight([f"{key}=][", f"run_dir={RUN_DIR}"])
