"""The ResourceCluster operator (kopf): pure manifest builders, planning and status,
with thin handlers that apply them. Run it with ``apportion operator``."""
