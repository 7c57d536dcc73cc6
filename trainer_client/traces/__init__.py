"""Trace pipeline: ingest agent traces into `TraceState`s, replay them with teachers, emit DPO pairs.

No torch here: this package runs on the base install plus httpx, pyyaml and tqdm.
"""

from trainer_client.traces.config import ReplayConfig, TeacherConfig
from trainer_client.traces.ingest import INGESTERS, IngestCounts, TraceIngester, make_ingester
from trainer_client.traces.replay import ReplayReport, TeacherReplay

__all__ = [
    "INGESTERS",
    "IngestCounts",
    "ReplayConfig",
    "ReplayReport",
    "TeacherConfig",
    "TeacherReplay",
    "TraceIngester",
    "make_ingester",
]
