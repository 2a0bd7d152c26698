"""The parts of the storage seam, one module a noun; ``engines/base.py``
composes them into Engine."""
