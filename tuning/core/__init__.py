"""The data every part of the lab shares: the knob space, tasks, records and outcomes, measurement
specs, the bounds of a plausible reading, and the Component base every configurable part extends.
Nothing here orchestrates, tracks or imports TVM."""
