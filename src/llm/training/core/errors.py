"""`ConfigError`: a user's config file or flag is wrong (its own module, so every config module can raise it)."""


class ConfigError(ValueError):
    """A user's config file or flag is wrong; the message is one sentence naming file and key."""


class KeysError(ConfigError):
    """Top-level keys that cannot be honoured; `rest` is the config without them, checked too so one run names all."""

    def __init__(self, message: str, rest: dict | None = None):
        super().__init__(message)
        self.rest = rest
