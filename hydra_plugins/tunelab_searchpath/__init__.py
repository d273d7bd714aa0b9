"""The user's config directories on Hydra's search path: each directory in TUNELAB_CONF_DIRS
(os.pathsep-separated, laid out like conf/) is searched after conf/, so `python run.py search=toy`
finds <dir>/search/toy.yaml with no `hydra.searchpath=[...]` on the command line."""
