"""SpecLens desktop app (PySide6): a thin face over the engine's step events."""
