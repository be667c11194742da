"""Safe archive extraction shared by the coordinator and the agent (temporary re-export)."""

from worker_agent.extract import UnsafeArchiveError, extract_archive

__all__ = ["UnsafeArchiveError", "extract_archive"]
