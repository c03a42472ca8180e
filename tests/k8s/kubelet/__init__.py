"""The process kubelet: keeps fake nodes Ready and runs their pods as local processes.

Modules: nodes (Node objects and heartbeats), podspec (env, command, probes from a pod
spec), dns (per-pod /etc/hosts for Service names), runner (one pod's processes and
status), server (HTTPS endpoint for `kubectl logs`), __main__ (wiring and the pod watch).
"""
