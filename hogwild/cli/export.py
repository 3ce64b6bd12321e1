"""``hogwild-export checkpoint=PATH out=FILE``: the model alone, as a plain ``state_dict``.

The file loads anywhere with ``model.load_state_dict(torch.load(FILE, weights_only=True))``,
without hogwild installed. A checkpoint from before checkpoints carried a ``state_dict`` is
named by rebuilding its model, so the stored ``_target_`` rule of ``hogwild-eval`` applies.
"""

from __future__ import annotations

import logging
from typing import Optional

from hogwild.cli.common import checkpoint_command
from hogwild.errors import guarded

logger = logging.getLogger(__name__)

USAGE = "hogwild-export checkpoint=PATH out=FILE [model._target_=...] [trust_targets=true]"


@guarded
def main(argv: Optional[list[str]] = None) -> None:
    from hogwild.checkpoint.portable import export

    named, trusted, overrides = checkpoint_command(argv, USAGE, ("checkpoint", "out"))  # errors: @guarded
    n = export(named["checkpoint"], named["out"], overrides, trusted)
    logger.info("wrote %s: a state_dict of %d tensors (load it with "
                "model.load_state_dict(torch.load(path, weights_only=True)))", named["out"], n)


if __name__ == "__main__":
    main()
