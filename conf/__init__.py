"""tunelab's Hydra configs. The wheel installs this folder as the package `tuning.conf` (setup.py maps it),
so an installed lab finds its YAML beside its code; a checkout keeps it at the top level, where Hydra
users look for it."""
