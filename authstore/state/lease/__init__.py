"""Leases: TTL'd records that own keys; revoking a lease deletes its keys in one revision."""
