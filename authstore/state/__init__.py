"""The state machine: what committed entries do (MVCC keys, leases, auth metadata, members).

Deterministic: the same entries give the same bytes on every member. It never imports the node or
the API layer.
"""
