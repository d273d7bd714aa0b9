"""Where a multirun's jobs run: the cluster's hosts (hosts.py) and each job's CPUs (cpu_slots.py)."""
