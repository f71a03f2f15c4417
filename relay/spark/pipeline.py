"""`outbox-relay pipeline materialize|audit [options]`: the jobs' entry point.

Imports no pyspark itself, so `outbox-relay pipeline --help` works without the `spark` extra.
"""

from __future__ import annotations

from collections.abc import Sequence

from relay.core.errors import ConfigError
from relay.spark.options import run_job


def main(job: str, argv: Sequence[str]) -> int:
    """Run the job `job` with its options `argv`."""
    if job == "materialize":
        from relay.spark import materialize as module
    elif job == "audit":
        from relay.spark import audit as module  # type: ignore[no-redef]
    else:
        raise ConfigError("pipeline", f"unknown job {job!r}; materialize or audit")
    return run_job(module.main, argv)
