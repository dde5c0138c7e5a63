"""inorder: ordered, stateful stream processing for PySpark."""
