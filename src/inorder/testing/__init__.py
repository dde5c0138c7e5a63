"""Support for inorder's own tests and benchmarks: in-memory records as Spark DataFrames and a
replay source that feeds recorded batches to a streaming query. Shipped in the package because
Spark's Python workers must import them; not part of the public API."""
