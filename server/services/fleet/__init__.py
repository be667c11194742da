"""Agents: registration, credentials, the commands they are sent, cordons and drains, device identity, coordinator replicas."""
