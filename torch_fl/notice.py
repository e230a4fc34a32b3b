"""One-line notices torch_fl gives for information, not errors: the cuda alias is on, a setting was ignored.

They go through the `torch_fl` logger, so an application that configures logging routes, filters or
silences them like any other library's. Where nothing configured logging, torch_fl writes them itself: to
stderr in a terminal, and to stdout inside a Jupyter kernel, where stderr renders as a red error box."""

from __future__ import annotations

import logging
import sys

LOGGER = logging.getLogger("torch_fl")


def notice(message: str) -> None:
    """Say `message` ("torch_fl: ...") once, as information."""
    configured = LOGGER.handlers or logging.getLogger().handlers
    if configured:
        LOGGER.info(message)
        return
    stream = sys.stdout if "ipykernel" in sys.modules else sys.stderr
    stream.write(message + "\n")
    stream.flush()
