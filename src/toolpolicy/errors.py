"""ConfigError, below every layer: a component (an environment checking its own options)
raises the error a config's loader raises, without importing the config."""


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file, the section and the field."""
