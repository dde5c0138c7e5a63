"""Code that runs inside Spark's Python workers: the preloading worker daemon and heap care."""
