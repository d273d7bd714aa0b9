"""What a run is asked, before anything runs: the typed schema of the top-level config (schema.py),
where runs, studies and stores live (storage.py), what a sweep optimises (objective.py), run names
(naming.py), the rules for untrusted files (untrusted.py), the config directory (conf_dir.py) and the
command lines' shared arguments (cli.py). Below the components: nothing here imports one."""
from tuning.config.schema import (
                                  MODEL_KEYS,
                                  MODEL_NAME,
                                  SCHEMA_GROUPS,
                                  ConfigError,
                                  on_schema,
                                  register,
                                  schema_problems,
)

__all__ = ["MODEL_KEYS", "MODEL_NAME", "SCHEMA_GROUPS", "ConfigError", "on_schema", "register", "schema_problems"]
