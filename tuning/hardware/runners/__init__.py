"""Runners: how a TVM backend reaches the devices its kernels are built for and timed on.

base.py holds the contract (Runner); local.py this host's devices (the default). A new transport
(TVM RPC to a board, the GPUs of a cluster node) is one module here and one YAML in
conf/hardware/runner/.
"""
