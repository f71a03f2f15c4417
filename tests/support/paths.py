"""Where the repository is (`ROOT`): for tests that read its files or start its commands, and
the working folder and PYTHONPATH of the relay's child processes."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
