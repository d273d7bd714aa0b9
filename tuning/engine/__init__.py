"""One job, orchestrated: the steps of a run (run.py), the loop, its callbacks, the budget, the run
folder, resume, the final metrics, the job's MLflow run, the run files and artifacts, whole models."""
