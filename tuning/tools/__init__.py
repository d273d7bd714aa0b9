"""The command-line tools over run folders, measurement stores and MLflow runs, one module each
(`python -m tuning.tools.<name> --help`): apply, export, sync, dataset, pretrain, compare. Each
module's `main(argv)` is its whole command line."""
