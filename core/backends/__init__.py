"""Model backends: each wraps one model behind the :class:`core.backends.base.Backend` protocol."""
from core.backends.base import Backend, BackendError, ContextLengthError

__all__ = ["Backend", "BackendError", "ContextLengthError"]
