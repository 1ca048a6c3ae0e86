"""gpushepherd: who gets the next free GPU, and by what rule."""

__version__ = "0.1.0"
