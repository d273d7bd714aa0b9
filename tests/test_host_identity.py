"""This machine as its readings depend on it (tuning/cluster/host_identity.py): the CPU model, its flags
(hashed) and its core count, and the file name a study block names its host by."""
from __future__ import annotations

from tuning.cluster.host_identity import host_identity, host_key


def test_host_identity_reads_the_cpu_and_its_key_names_it():
    identity = host_identity("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: sse avx\n"
                             "processor\t: 1\nmodel name\t: ignored\n", cores=2)
    assert identity["cpu_model"] == "Intel(R) Xeon(R) Processor" and identity["cores"] == 2
    assert identity != host_identity("model name\t: Intel(R) Xeon(R) Processor\nflags\t: sse avx avx512f\n", cores=2)
    assert host_key(identity).startswith("intel-r-xeon-r-processor-2c-")
    assert host_key(identity) != host_key({**identity, "cores": 4})
