"""`ConfigError`: a user's config file or flag is wrong (its own module, so every config module can raise it)."""


class ConfigError(ValueError):
    """A user's config file or flag is wrong; the message is one sentence naming file and key."""
