"""The error a person fixes by changing a setting.

It sits below the config package because domain modules that the config reads (the drafter's defaults, the target)
raise it too.
"""


class ConfigError(ValueError):
    """A run configuration that cannot be used; the message names the field."""
