"""Loader and build description of the compiled kernel library (libnattn)."""
