"""The refusal of a commit whose decisions were made on a snapshot that no longer holds."""


class StaleSnapshot(Exception):
    """The decisions were made on a snapshot that no longer holds; nothing was written."""
