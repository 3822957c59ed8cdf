"""The error every part of the trainer image raises for a setting it cannot run with.

Its own module, with no import, so that what must start fast (the supervisor, before torchrun) can raise it
without loading the config's models.
"""


class ConfigError(Exception):
    """A setting the trainer cannot run with. The message names the setting and the fix."""
