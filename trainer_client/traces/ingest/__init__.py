"""Trace ingesters, one per format, behind `TraceIngester`."""

from __future__ import annotations

from trainer_client.traces.ingest.base import IngestCounts, TraceIngester
from trainer_client.traces.ingest.claude_code import ClaudeCodeIngester
from trainer_client.traces.ingest.coding_env import CodingEnvIngester
from trainer_client.traces.ingest.openhands import OpenHandsIngester
from trainer_client.traces.ingest.swe_smith import SweSmithIngester

INGESTERS: dict[str, type[TraceIngester]] = {
    ingester.format: ingester
    for ingester in (CodingEnvIngester, ClaudeCodeIngester, OpenHandsIngester, SweSmithIngester)
}
"""Ingester class by format name."""


def make_ingester(format: str) -> TraceIngester:
    """A fresh ingester (with zeroed counts) for `format`; ValueError names the known ones."""
    try:
        return INGESTERS[format]()
    except KeyError:
        raise ValueError(f"unknown trace format {format!r}; known: {', '.join(INGESTERS)}") from None


__all__ = ["INGESTERS", "IngestCounts", "TraceIngester", "make_ingester"]
