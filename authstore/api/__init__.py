"""The API: the store's gRPC services (KV, Watch, Lease, Auth, Cluster, Maintenance) for proxies.

Requests come in here, are proposed through the node and answered from the state machine.
"""
