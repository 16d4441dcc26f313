"""The MVCC key space: every write makes a new revision, history stays readable until compacted."""
