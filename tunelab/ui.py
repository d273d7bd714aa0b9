"""`tunelab ui`: MLflow's own UI server on the lab's tracking store, with the link that opens the
model-training view (MLflow 3 otherwise starts in its GenAI view)."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def build_parser(prog: str | None = None):
    from tuning.config.cli import add_tracking_uri, new_parser

    parser = new_parser("python -m tunelab.ui", __doc__.split("\n\n")[0], prog)
    add_tracking_uri(parser, help="the MLflow store to serve")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    parser.add_argument("--port", type=int, default=5000, help="the port to listen on")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    from tuning.config.storage import mlflow_uri
    from tuning.config.tracking_uri import missing_store

    args = build_parser(prog).parse_args(argv)
    uri = mlflow_uri(args.tracking_uri)
    problem = missing_store(uri)
    if problem:  # MLflow's server would create an empty store to show
        print(f"tunelab ui: {problem}", file=sys.stderr)
        sys.exit(2)
    mlflow = Path(sys.executable).with_name("mlflow")
    command = [str(mlflow) if mlflow.exists() else "mlflow", "ui", "--backend-store-uri", uri,
               "--host", args.host, "--port", str(args.port)]
    print(f"tunelab: MLflow UI on http://{args.host}:{args.port}/#/experiments?workflowType=machine_learning "
          f"(store {uri}); Ctrl-C stops it", flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
