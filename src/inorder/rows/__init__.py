"""Output rows: record types, their Arrow mapping, and the row encoder.

:mod:`inorder.schema` is the public face of this package and re-exports its names.
"""
