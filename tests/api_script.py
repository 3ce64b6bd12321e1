"""A user's script that trains through the Python API: ``python -m tests.api_script OVERRIDES``."""

from __future__ import annotations

import sys

import hogwild

if __name__ == "__main__":
    hogwild.train(sys.argv[1:])
