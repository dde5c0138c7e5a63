"""Deprecated name of :mod:`inorder.spark.daemon`.

A Spark configuration that names ``spark.python.daemon.module=inorder._daemon`` keeps working.
"""

from __future__ import annotations

from inorder.spark.daemon import main

if __name__ == "__main__":
    main()
