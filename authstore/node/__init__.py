"""The node: consensus plumbing around the Raft core (Ready loop, WAL, peer transport, snapshots).

It knows the state machine only through the contract it applies committed entries to.
"""
