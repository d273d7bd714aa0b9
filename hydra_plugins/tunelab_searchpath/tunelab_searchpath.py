"""Hydra discovers this SearchPathPlugin under hydra_plugins/ and asks it to extend every search path
it builds (run.py's and the compose API's alike): conf/ stays first, so a name in both is conf/'s."""
from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from tuning.engine.run_folder import env_conf_dirs


class TunelabSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for conf_dir in env_conf_dirs():
            search_path.append(provider="tunelab-conf-dirs", path=f"file://{conf_dir}")
