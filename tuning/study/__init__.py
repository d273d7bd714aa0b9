"""Studies: a comparison of methods declared before any measurement (conf/study/<name>.yaml) and run
in blocks, each (task, seed) with every arm on one machine, adjudicated and written to one file (docs/studies.md)."""
