"""Errors a user sees: each names the file, tensor or key, and what was expected versus found.

The CLI prints them as one line; the GUI shows them in a dialog. Catch `ColibriError` to
catch them all.
"""
from __future__ import annotations


class ColibriError(Exception):
    """Base of every error the product reports to a user."""


# --- a converted model directory -----------------------------------------------------------------
class ModelFormatError(ColibriError, ValueError):
    """A Colibri model directory is not usable."""


class MissingFileError(ModelFormatError):
    pass


class SizeMismatchError(ModelFormatError):
    pass


class ChecksumMismatchError(ModelFormatError):
    pass


class BadHeaderError(ModelFormatError):
    pass


class UnknownQuantTypeError(ModelFormatError):
    pass


class NewerFormatError(ModelFormatError):
    pass


# --- conversion ----------------------------------------------------------------------------------
class ConversionError(ColibriError):
    """The source model cannot be converted as asked."""


class SourceFormatError(ConversionError):
    """A source file is truncated, corrupt, or says something impossible about itself."""


class UnsupportedArchitectureError(ConversionError):
    pass


class ConfigError(ConversionError):
    """The source's configuration is missing a value or contradicts its weights."""


class MissingTensorError(ConversionError):
    pass


class UnexpectedTensorError(ConversionError):
    pass


class OutputExistsError(ConversionError):
    pass


class DiskSpaceError(ConversionError):
    pass


class ConversionCancelled(ConversionError):
    pass
